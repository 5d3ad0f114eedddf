// `loongforge checkpoint-now`: every rank writes a checkpoint at the same step
// boundary; answers when this rank's write has finished.
#include <cstdio>    // std::printf
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
}

void checkpoint_now_options(CLI::App& app) { add_target_options(app, g_target); }

int checkpoint_now_run() {
  return run_remote("checkpoint-now", [] {
    const auto r = call(g_target, "checkpoint-now");
    if (g_target.json) {
      std::cout << r.dump(2) << "\n";
    } else {
      std::printf("checkpoint at step %lld written on %lld rank(s): %s (%.1f MB in %.2f s)\n", r.value("step", 0LL),
                  r.value("world", 1LL), r.value("path", std::string("?")).c_str(), r.value("bytes", 0.0) / 1e6,
                  r.value("seconds", 0.0));
    }
    return kExitOk;
  });
}

}  // namespace loongforge::cli
