// `loongforge monitor-comm --interval S`: a live table of gradient
// communication per group (bytes, time, algorithm and bus bandwidth) until
// Ctrl-C.
#include <cstdio>    // std::printf, std::fflush
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
double g_interval_s = 1.0;
int64_t g_count = 0;
}  // namespace

void monitor_comm_options(CLI::App& app) {
  add_target_options(app, g_target);
  app.add_option("--interval", g_interval_s, "Seconds between rows")->capture_default_str();
  app.add_option("--count", g_count, "Stop after this many rows; 0 = until Ctrl-C")->capture_default_str();
}

int monitor_comm_run() {
  return run_remote("monitor-comm", [] {
    bool header = false;
    stream(g_target, "monitor-comm", {{"interval_s", g_interval_s}, {"count", g_count}}, [&](const nlohmann::json& r) {
      if (g_target.json) {
        std::cout << r.dump() << std::endl;
        return true;
      }
      if (!header) {
        std::printf("%8s  %-16s %12s %10s %12s %12s\n", "step", "group", "bytes", "time ms", "algbw GB/s", "busbw GB/s");
        header = true;
      }
      for (const auto& g : r["comm"].value("groups", nlohmann::json::array()))
        std::printf("%8lld  %-16s %12.0f %10.3f %12.3f %12.3f\n", r.value("step", 0LL),
                    g.value("name", std::string("?")).c_str(), g.value("bytes", 0.0), g.value("time_ms", 0.0),
                    g.value("algbw_gbps", 0.0), g.value("busbw_gbps", 0.0));
      std::fflush(stdout);
      return true;
    });
    return kExitOk;
  });
}

}  // namespace loongforge::cli
