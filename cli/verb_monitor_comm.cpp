// `loongforge monitor-comm --interval S`: a live table of gradient
// communication of the last step per group (and with --buckets per bucket):
// bytes, time, collective, algorithm and bus bandwidth (nccl-tests'
// definitions), and the exposed communication, until Ctrl-C. --json prints
// the trainer's records (docs/control-plane.md).
#include <cstdio>    // std::printf, std::fflush
#include <iostream>  // std::cout
#include <string>    // std::string

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
double g_interval_s = 1.0;
int64_t g_count = 0;
bool g_buckets = false;
}  // namespace

void monitor_comm_options(CLI::App& app) {
  add_target_options(app, g_target);
  app.add_option("--interval", g_interval_s, "Seconds between rows")->capture_default_str();
  app.add_option("--count", g_count, "Stop after this many rows; 0 = until Ctrl-C")->capture_default_str();
  app.add_flag("--buckets", g_buckets, "Also one row per bucket (launch order)");
}

int monitor_comm_run() {
  return run_remote("monitor-comm", [] {
    bool header = false;
    stream(g_target, "monitor-comm", {{"interval_s", g_interval_s}, {"count", g_count}}, [&](const nlohmann::json& r) {
      if (g_target.json) {
        std::cout << r.dump() << std::endl;
        return true;
      }
      const nlohmann::json& c = r["comm"];
      if (!header) {
        std::printf("%8s  %-36s %-14s %12s %10s %11s %11s\n", "step", "group / bucket", "collective", "bytes",
                    "time ms", "algbw GB/s", "busbw GB/s");
        header = true;
      }
      const long long step = c.value("step", r.value("step", 0LL));
      std::printf("%8lld  exposed %.3f ms of %.3f ms communication (%s; %lld of %zu buckets launched in backward)\n",
                  step, c.value("exposed_ms", 0.0), c.value("comm_ms", 0.0),
                  c.value("overlap", false) ? "overlapped" : "after backward",
                  c.value("units_launched_in_backward", 0LL), c.value("buckets", nlohmann::json::array()).size());
      auto row = [&](const nlohmann::json& g, const std::string& name) {
        std::printf("%8lld  %-36s %-14s %12.0f %10.3f %11.3f %11.3f\n", step, name.substr(0, 36).c_str(),
                    g.value("collective", std::string("?")).c_str(), g.value("bytes", 0.0), g.value("time_ms", 0.0),
                    g.value("algbw_gbps", 0.0), g.value("busbw_gbps", 0.0));
      };
      for (const auto& g : c.value("groups", nlohmann::json::array())) row(g, g.value("name", std::string("?")));
      if (g_buckets)
        for (const auto& b : c.value("buckets", nlohmann::json::array()))
          row(b, "  #" + std::to_string(b.value("unit", 0)) + " " + b.value("name", std::string("?")));
      std::fflush(stdout);
      return true;
    });
    return kExitOk;
  });
}

}  // namespace loongforge::cli
