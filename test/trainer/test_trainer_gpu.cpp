// The trainer's fast path on a GPU (label gpu): n16-tiny on the bundled
// dataset, CUDA, bf16, CUDA graphs on, fused AdamW.
// - In steady state a step (data, H2D, graph replay, clipping, fused AdamW,
//   the deferred loss/norm copy) makes no host synchronisation: CUDA's
//   sync-debug mode is set to error around Trainer::step() only (the records
//   are read back at the step boundary, one step late);
// - every step's record still reaches the history, with the loss the eager
//   path computes (cuda_graphs=off) within 1% (bf16);
// - the same holds with GCTS's sharded optimizer at one rank, whose
//   gradients are views into its shard (Note [Gradient views]), and the
//   step's exposed communication is then timed on the device (CommTimer).
#include <algorithm>  // std::max
#include <cmath>      // std::abs
#include <string>     // std::string

#include <ATen/cuda/Sleep.h>         // at::cuda::sleep
#include <c10/cuda/CUDAFunctions.h>  // c10::cuda::warning_state

#include "catch_compat.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/trainer/trainer.hpp"

using namespace loongforge;

namespace {

config::Config gpu_config(const std::string& name, const std::string& graphs, bool sharded = false) {
  const std::string out = std::string(LOONGFORGE_TEST_MODELS) + "/trainer-gpu-" + name;
  remove_tree(out);
  make_dirs(out);
  config::ValidationContext ctx;
  ctx.built_engines = trainer::built_engines();  // as loongforge-train validates (GCTS keys)
  return config::parse_config_text(
      "{}", "test",
      {"model.path=" + std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt", "data.path=" LOONGFORGE_TEST_DATASET,
       "run.output_dir=" + out, "run.name=r", "run.device=cuda", "precision.mode=bf16", "logging.progress=off",
       "logging.tensorboard=false", "control.enable=false", "trainer.micro_batch_size=4",
       "trainer.gradient_accumulation_steps=2", "trainer.max_steps=30", "checkpoint.interval_steps=1000",
       "optimizer.implementation=fused", "trainer.cuda_graphs=" + graphs, "gcts.enable=" + std::string(sharded ? "true" : "false"),
       "gcts.shard_optimizer=" + std::string(sharded ? "true" : "false")},
      ctx);
}

// Runs `t` to the end with CUDA's sync-debug mode set to error around every
// step after the fifth; returns the first step's failure ("" when none).
std::string run_without_syncs(trainer::Trainer& t) {
  t.open();
  auto& ws = c10::cuda::warning_state();
  int64_t steps = 0;
  std::string what;
  while (t.more() && what.empty()) {
    if (steps >= 5) ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    try {
      t.step();
    } catch (const std::exception& e) {
      what = "step " + std::to_string(steps + 1) + ": " + std::string(e.what()).substr(0, 800);
    }
    ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    if (what.empty()) t.step_boundary();
    ++steps;
  }
  return what;
}

}  // namespace

TEST_CASE("trainer on a GPU: a steady-state step never synchronises with the host, and every record arrives") {
  trainer::Trainer t(gpu_config("sync", "on"), comm::WorldInfo{});
  REQUIRE(run_without_syncs(t) == "");
  REQUIRE(t.close() == 0);
  REQUIRE(t.history().size() == 30);
  for (size_t i = 0; i < t.history().size(); ++i) REQUIRE(t.history()[i].step == static_cast<int64_t>(i + 1));

  trainer::Trainer eager(gpu_config("eager", "off"), comm::WorldInfo{});
  REQUIRE(eager.run() == 0);
  double worst = 0;
  for (size_t i = 0; i < 30; ++i) {
    const double a = eager.history()[i].loss, b = t.history()[i].loss;
    worst = std::max(worst, std::abs(a - b) / std::max(std::abs(a), 1e-12));
  }
  INFO("largest relative loss difference, graphs vs eager: " << worst);
  REQUIRE(worst <= 0.01);
}

TEST_CASE("trainer on a GPU: with the sharded optimizer at one rank a step never synchronises either, and its exposed communication is timed on the device") {
  trainer::Trainer plain(gpu_config("plain", "on"), comm::WorldInfo{});
  REQUIRE(plain.run() == 0);
  trainer::Trainer t(gpu_config("sharded", "on", /*sharded=*/true), comm::WorldInfo{});
  REQUIRE(run_without_syncs(t) == "");
  REQUIRE(t.close() == 0);
  REQUIRE(t.history().size() == 30);
  double worst = 0, exposed = 0;
  for (size_t i = 0; i < 30; ++i) {
    const double a = plain.history()[i].loss, b = t.history()[i].loss;
    worst = std::max(worst, std::abs(a - b) / std::max(std::abs(a), 1e-12));
    if (i >= 5) exposed = std::max(exposed, t.history()[i].exposed_comm_ms);
  }
  WARN("sharded vs plain fused AdamW: largest relative loss difference " << worst
       << "; largest steady-state exposed_comm_ms (device) " << exposed);
  REQUIRE(worst <= 0.01);
  REQUIRE(exposed < 1.0);  // one rank, gradients already in the shard: nothing to wait for
}

TEST_CASE("trainer on a GPU: the comm timer gives the device time between its events, per step, once") {
  trainer::CommTimer timer(c10::Device(c10::kCUDA, 0));
  timer.begin();
  timer.end();
  timer.close_step(1);
  timer.begin();
  at::cuda::sleep(50'000'000);  // tens of milliseconds of spinning on the stream
  timer.end();
  timer.close_step(2);
  const auto none = timer.take(1), slept = timer.take(2);
  REQUIRE(none.has_value());
  REQUIRE(slept.has_value());
  INFO("empty span " << *none << " ms, span around the sleep " << *slept << " ms");
  REQUIRE(*none < 0.5);
  REQUIRE(*slept > 5.0);
  REQUIRE_FALSE(timer.take(2).has_value());  // taken once
  REQUIRE_FALSE(timer.take(3).has_value());  // no spans
}
