// `loongforge profile-step --duration S --output profile.json`: per-phase
// times of the steps within the next S seconds, plus a Chrome trace
// (<output without .json>.trace.json) that opens in Perfetto or
// chrome://tracing.
#include <cstdio>    // std::printf
#include <fstream>   // std::ofstream
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;
double g_duration_s = 2.0;
int64_t g_max_steps = 1000;
std::string g_output = "profile.json", g_trace;
bool g_kernels = false;

void write_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  if (!f) throw ClientError(kExitFailed, "cannot write " + path);
}
}  // namespace

void profile_step_options(CLI::App& app) {
  add_target_options(app, g_target);
  app.add_option("--duration", g_duration_s, "Seconds of training to profile (at least one step)")->capture_default_str();
  app.add_option("--max-steps", g_max_steps, "Profile at most this many steps")->capture_default_str();
  app.add_option("--output,-o", g_output, "Profile JSON (per-phase times)")->capture_default_str();
  app.add_option("--trace", g_trace, "Chrome trace JSON; default: <output>.trace.json");
  app.add_flag("--kernels", g_kernels,
               "Also count CUDA work per step (device kernels, copies, host launch calls, graph launches) "
               "with libtorch's Kineto profiler");
}

int profile_step_run() {
  return run_remote("profile-step", [] {
    if (g_trace.empty()) {
      const auto dot = g_output.rfind(".json");
      g_trace = (dot != std::string::npos && dot + 5 == g_output.size() ? g_output.substr(0, dot) : g_output) + ".trace.json";
    }
    TargetOptions t = g_target;
    t.timeout_s = std::max(t.timeout_s, g_duration_s + 120);
    nlohmann::json args = {{"duration_s", g_duration_s}, {"max_steps", g_max_steps}};
    if (g_kernels) args["kernels"] = true;
    nlohmann::json p = call(t, "profile-step", args);
    const nlohmann::json trace = p["trace"];
    p.erase("trace");
    p["trace_file"] = g_trace;
    write_file(g_trace, trace);
    write_file(g_output, p);
    if (g_target.json) {
      std::cout << p.dump(2) << "\n";
      return kExitOk;
    }
    std::printf("profiled steps %lld..%lld (%lld steps, %.2f s) on rank %lld, %s\n", p.value("first_step", 0LL),
                p.value("last_step", 0LL), p.value("steps", 0LL), p.value("duration_s", 0.0), p.value("rank", 0LL),
                p.value("device", std::string("?")).c_str());
    std::printf("  %-12s %12s %8s\n", "phase", "ms/step", "share");
    const double step_ms = p.value("mean_step_ms", 0.0);
    for (const auto& [name, ph] : p["phases"].items()) {
      const double ms = ph.value("mean_ms_per_step", 0.0);
      std::printf("  %-12s %12.3f %7.1f%%\n", name.c_str(), ms, step_ms > 0 ? 100 * ms / step_ms : 0.0);
    }
    std::printf("  %-12s %12.3f\n", "step", step_ms);
    if (const auto c = p.find("cuda"); c != p.end() && c->is_object()) {
      if (c->contains("error"))
        std::printf("CUDA activity: %s\n", c->value("error", std::string()).c_str());
      else
        std::printf("CUDA activity per step: %.1f kernels, %.1f copies, %.1f fills on the device; host: %.1f kernel "
                    "launches, %.1f graph launches, %.1f copy/fill calls\n",
                    c->value("kernels_per_step", 0.0), c->value("copies_per_step", 0.0),
                    c->value("fills_per_step", 0.0), c->value("host_launches_per_step", 0.0),
                    c->value("graph_launches_per_step", 0.0), c->value("host_copy_calls_per_step", 0.0));
      if (const auto kinds = c->find("kernel_kinds"); kinds != c->end() && !kinds->empty()) {
        std::printf("kernel device time per step: %.2f ms:", c->value("kernel_device_ms_per_step", 0.0));
        for (const auto& k : *kinds)
          std::printf(" %s %.2f (%.1f%%)", k.value("kind", std::string("?")).c_str(),
                      k.value("device_ms_per_step", 0.0), 100 * k.value("share", 0.0));
        std::printf("\n");
      }
    }
    std::printf("wrote %s and %s (open the trace in https://ui.perfetto.dev or chrome://tracing)\n", g_output.c_str(),
                g_trace.c_str());
    return kExitOk;
  });
}

}  // namespace loongforge::cli
