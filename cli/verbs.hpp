// cli/verbs.hpp — the table of `loongforge` verbs.
//
// Contract: each verb is one row (name, one-line help, how to add its options,
// what runs it), implemented in cli/verb_<name>.cpp. main.cpp builds the CLI
// and the help text from this table alone. Remote verbs talk to a trainer
// through client.hpp; a verb whose engine is not in the trainer's build gets
// the trainer's engine_off answer and exits with kExitNotAvailable.
#pragma once

#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

namespace CLI {
class App;
}

namespace loongforge::cli {

constexpr int kExitNotAvailable = 3;

struct Verb {
  std::string name;
  std::string help;
  std::function<void(CLI::App&)> add_options;
  std::function<int()> run;
};

const std::vector<Verb>& verbs();

#define LOONGFORGE_VERB(fn)    \
  void fn##_options(CLI::App&); \
  int fn##_run();
LOONGFORGE_VERB(status)
LOONGFORGE_VERB(profile_step)
LOONGFORGE_VERB(switch_strategy)
LOONGFORGE_VERB(monitor_comm)
LOONGFORGE_VERB(hot_rejoin)
LOONGFORGE_VERB(mla_stats)
LOONGFORGE_VERB(debug_dmf)
LOONGFORGE_VERB(checkpoint_now)
LOONGFORGE_VERB(stop)
LOONGFORGE_VERB(validate_checkpoint)
LOONGFORGE_VERB(validate_dataset)
#undef LOONGFORGE_VERB

}  // namespace loongforge::cli
