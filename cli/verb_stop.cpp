// `loongforge stop`: every rank stops at the same step boundary after a final
// checkpoint; the trainer exits 0. Answers once the checkpoint is written.
#include <cstdio>    // std::printf
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
}

void stop_options(CLI::App& app) { add_target_options(app, g_target); }

int stop_run() {
  return run_remote("stop", [] {
    const auto r = call(g_target, "stop");
    if (g_target.json) {
      std::cout << r.dump(2) << "\n";
    } else {
      const std::string ckpt = r.value("checkpoint", std::string());
      std::printf("stopped at step %lld; final checkpoint: %s\n", r.value("stopped_at_step", 0LL),
                  ckpt.empty() ? "(none)" : ckpt.c_str());
    }
    return kExitOk;
  });
}

}  // namespace loongforge::cli
