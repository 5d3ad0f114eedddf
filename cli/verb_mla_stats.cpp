// `loongforge mla-stats`: memory pool usage, fragmentation and allocation time
// (MLA).
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
}

void mla_stats_options(CLI::App& app) { add_target_options(app, g_target); }

int mla_stats_run() {
  return run_remote("mla-stats", [] {
    std::cout << call(g_target, "mla-stats").dump(2) << "\n";
    return kExitOk;
  });
}

}  // namespace loongforge::cli
