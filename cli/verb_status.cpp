// `loongforge status`: step, loss, throughput, ETA, engines, strategy and
// world of a running trainer.
#include <cstdio>    // std::printf
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
TargetOptions g_target;

std::string duration(double s) {
  const auto t = static_cast<long long>(s + 0.5);
  char b[32];
  std::snprintf(b, sizeof b, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  return b;
}
}  // namespace

void status_options(CLI::App& app) { add_target_options(app, g_target); }

int status_run() {
  return run_remote("status", [] {
    const auto s = call(g_target, "status");
    if (g_target.json) {
      std::cout << s.dump(2) << "\n";
      return kExitOk;
    }
    const auto num = [&](const char* k) { return s.value(k, 0.0); };
    std::printf("trainer pid %lld (rank %lld of %lld): %s %s on %s (%s)\n", s.value("pid", 0LL), s.value("rank", 0LL),
                s.value("world", 1LL), s.value("phase", std::string("?")).c_str(), s.value("model", std::string("?")).c_str(),
                s.value("device", std::string("?")).c_str(), s.value("precision", std::string("?")).c_str());
    const long long step = s.value("step", 0LL), max_steps = s.value("max_steps", 0LL);
    std::printf("  step        %lld/%lld (%.1f%%)", step, max_steps, max_steps ? 100.0 * step / max_steps : 0.0);
    if (s.contains("eta_s")) std::printf("   ETA %s", duration(num("eta_s")).c_str());
    std::printf("   elapsed %s\n", duration(num("elapsed_s")).c_str());
    if (s.contains("loss")) {
      std::printf("  loss        %.5f   lr %.3g   grad norm %.4g\n", num("loss"), num("lr"), num("grad_norm"));
      std::printf("  throughput  %.1f samples/s, %.0f tokens/s, MFU %.1f%%; step %.1f ms (data wait %.1f ms)\n",
                  num("samples_per_s"), num("tokens_per_s"), 100 * num("mfu"), num("step_ms"), num("data_wait_ms"));
      // Note [Steady state] in src/trainer/progress.cpp: the figures to quote; the line above is the last step's.
      if (s.contains("steady_state") && s["steady_state"].value("steps", 0LL) > 0) {
        const auto& st = s["steady_state"];
        std::printf("  steady      %.1f samples/s, data wait %.1f%% of step time (median of %lld steps from step %lld)",
                    st.value("samples_per_s", 0.0), 100 * st.value("data_wait_fraction", 0.0), st.value("steps", 0LL),
                    st.value("from_step", 0LL));
        if (s.contains("time_to_first_step_s")) std::printf("; first step %.1f s after launch", num("time_to_first_step_s"));
        std::printf("\n");
      }
    }
    if (s.contains("bf16_weights") && s["bf16_weights"].is_object()) {
      const auto& w = s["bf16_weights"];
      std::printf("  weights     %lld bf16 working copies of fp32 masters (%.1f M elements, %s gradients)\n",
                  w.value("copies", 0LL), static_cast<double>(w.value("elements", 0LL)) / 1e6,
                  w.value("gradients", std::string("?")).c_str());
    }
    if (s.contains("micro_batch") && s["micro_batch"].is_object()) {  // trainer.micro_batch_size (auto: how chosen)
      const auto& m = s["micro_batch"];
      std::printf("  micro-batch %lld x accumulation %lld", m.value("size", 0LL), m.value("accumulation", 0LL));
      if (m.contains("auto") && m["auto"].is_object()) {
        const auto& a = m["auto"];
        if (a.value("source", std::string()) == "checkpoint")
          std::printf(" (auto: kept from %s)", a.value("checkpoint", std::string("?")).c_str());
        else
          std::printf(" (auto: predicted %.1f GB, measured %.1f GB of a %.1f GB budget)", a.value("predicted_gb", 0.0),
                      a.value("measured_gb", 0.0), a.value("budget_gb", 0.0));
      }
      std::printf("\n");
    }
    std::printf("  strategy    %s\n", s.value("strategy", std::string("?")).c_str());
    if (s.contains("engines")) {
      std::printf("  engines    ");
      for (const auto& [name, e] : s["engines"].items())
        std::printf(" %s: %s%s;", name.c_str(), e.value("configured", false) ? "" : "off, ",
                    e.value("state", std::string("?")).c_str());
      std::printf("\n");
    }
    if (s.contains("data")) {
      const auto& d = s["data"];
      std::printf("  data        on_bad_video=%s: %lld bad video(s), %lld sample(s) skipped (this rank)\n",
                  d.value("on_bad_video", std::string("?")).c_str(), d.value("videos_bad", 0LL),
                  d.value("samples_skipped", 0LL));
      std::printf("              %s source: %lld video(s), %lld frame(s) decoded", d.value("source", std::string("?")).c_str(),
                  d.value("videos_decoded", 0LL), d.value("frames_decoded", 0LL));
      if (d.contains("decoded_frames_per_s")) std::printf(" (%.0f frames/s last step)", d.value("decoded_frames_per_s", 0.0));
      if (d.contains("video_mb_read")) std::printf(", %.1f MB of video read", d.value("video_mb_read", 0.0));
      if (d.contains("frame_cache_mb"))
        std::printf("; frame cache %.0f of %lld MiB", d.value("frame_cache_mb", 0.0), d.value("frame_cache_limit_mb", 0LL));
      if (d.contains("queue_depth"))
        std::printf("; queue %lld/%lld ready, %lld decode thread(s)", d.value("queue_depth", 0LL),
                    d.value("prefetch_factor", 0LL), d.value("decode_threads", 0LL));
      std::printf("\n");
    }
    const std::string ckpt = s.value("last_checkpoint", std::string());
    std::printf("  checkpoint  %s", ckpt.empty() ? "(none yet)" : ckpt.c_str());
    if (s.value("checkpoint_writes_failed", 0LL) > 0) std::printf("  [%lld FAILED writes]", s.value("checkpoint_writes_failed", 0LL));
    if (s.contains("checkpoint_write") && s["checkpoint_write"].value("active", false)) {
      const auto& w = s["checkpoint_write"];
      const double bytes = w.value("bytes", 0.0), done = w.value("bytes_written", 0.0), eta = w.value("eta_s", -1.0);
      std::printf("\n  writing     %s: %.2f of %.2f GB (%.0f%%), %.2f GB/s, ETA %s",
                  w.value("name", std::string("?")).c_str(), done / 1e9, bytes / 1e9, bytes > 0 ? 100 * done / bytes : 0.0,
                  w.value("gb_per_s", 0.0), eta < 0 ? "unknown" : duration(eta).c_str());
    }
    std::printf("\n  run dir     %s\n  socket      %s\n", s.value("run_dir", std::string("?")).c_str(),
                s.value("socket", std::string("?")).c_str());
    return kExitOk;
  });
}

}  // namespace loongforge::cli
