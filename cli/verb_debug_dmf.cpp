// `loongforge debug-dmf --output FILE`: write a micro-batch fusion trace (DMF).
#include <fstream>   // std::ofstream
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
std::string g_output = "dmf-trace.json";
int64_t g_steps = 10;
}  // namespace

void debug_dmf_options(CLI::App& app) {
  add_target_options(app, g_target);
  app.add_option("--output,-o", g_output, "Fusion trace JSON")->capture_default_str();
  app.add_option("--steps", g_steps, "Steps to trace")->capture_default_str();
}

int debug_dmf_run() {
  return run_remote("debug-dmf", [] {
    const auto r = call(g_target, "debug-dmf", {{"steps", g_steps}});
    std::ofstream(g_output) << r.dump(1) << "\n";
    std::cout << "wrote " << g_output << "\n";
    return kExitOk;
  });
}

}  // namespace loongforge::cli
