// `loongforge hot-rejoin`: admit a restarted rank back into the job at a step
// boundary (fault tolerance: a new group, the state copied from a peer; docs/fault-tolerance.md).
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
int64_t g_rank = -1;
}  // namespace

void hot_rejoin_options(CLI::App& app) {
  add_target_options(app, g_target);
  app.add_option("--rank", g_rank, "The rank to admit; -1 = every rank waiting to rejoin")->capture_default_str();
}

int hot_rejoin_run() {
  return run_remote("hot-rejoin", [] {
    std::cout << call(g_target, "hot-rejoin", {{"rank", g_rank}}).dump(2) << "\n";
    return kExitOk;
  });
}

}  // namespace loongforge::cli
