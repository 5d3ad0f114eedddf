// cli/verbs.hpp — the table of `loongforge` verbs.
//
// Contract: each verb is one row (name, one-line help, how to add its options,
// what runs it). main.cpp builds the CLI and the help text from this table
// alone. A verb whose engine or control plane has not landed yet says so
// plainly and exits with kExitNotAvailable.
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
  std::string lands_with;  // non-empty: not available yet; names what brings it
  std::function<void(CLI::App&)> add_options;
  std::function<int()> run;
};

const std::vector<Verb>& verbs();

// One file per verb that has landed (cli/verb_<name>.cpp).
void validate_checkpoint_options(CLI::App& app);
int validate_checkpoint_run();

}  // namespace loongforge::cli
