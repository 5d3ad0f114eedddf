// `loongforge switch-strategy --strategy simple|hybrid`: every rank switches
// its gradient communication plan at the same step (GCTS).
#include <cstdio>    // std::printf
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
std::string g_strategy;
}  // namespace

void switch_strategy_options(CLI::App& app) {
  add_target_options(app, g_target);
  app.add_option("--strategy", g_strategy, "simple (one bucketed all-reduce) or hybrid (per-group overlapped plans)")
      ->required()
      ->check(CLI::IsMember({"simple", "hybrid"}));
}

int switch_strategy_run() {
  return run_remote("switch-strategy", [] {
    const auto r = call(g_target, "switch-strategy", {{"strategy", g_strategy}});
    if (g_target.json)
      std::cout << r.dump(2) << "\n";
    else
      std::printf("strategy %s from step %lld on every rank\n", g_strategy.c_str(), r.value("applied_at_step", 0LL));
    return kExitOk;
  });
}

}  // namespace loongforge::cli
