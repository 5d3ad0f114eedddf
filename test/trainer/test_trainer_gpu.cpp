// The trainer's fast path on a GPU (label gpu): n16-tiny on the bundled
// dataset, CUDA, bf16, CUDA graphs on, fused AdamW.
// - In steady state a step (data, H2D, graph replay, clipping, fused AdamW,
//   the deferred loss/norm copy) makes no host synchronisation: CUDA's
//   sync-debug mode is set to error around Trainer::step() only (the records
//   are read back at the step boundary, one step late);
// - every step's record still reaches the history, with the loss the eager
//   path computes (cuda_graphs=off) within 1% (bf16).
#include <algorithm>  // std::max
#include <cmath>      // std::abs
#include <string>     // std::string

#include <c10/cuda/CUDAFunctions.h>  // c10::cuda::warning_state

#include "catch_compat.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/trainer/trainer.hpp"

using namespace loongforge;

namespace {

config::Config gpu_config(const std::string& name, const std::string& graphs) {
  const std::string out = std::string(LOONGFORGE_TEST_MODELS) + "/trainer-gpu-" + name;
  remove_tree(out);
  make_dirs(out);
  return config::parse_config_text(
      "{}", "test",
      {"model.path=" + std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt", "data.path=" LOONGFORGE_TEST_DATASET,
       "run.output_dir=" + out, "run.name=r", "run.device=cuda", "precision.mode=bf16", "logging.progress=off",
       "logging.tensorboard=false", "control.enable=false", "trainer.micro_batch_size=4",
       "trainer.gradient_accumulation_steps=2", "trainer.max_steps=30", "checkpoint.interval_steps=1000",
       "optimizer.implementation=fused", "trainer.cuda_graphs=" + graphs});
}

}  // namespace

TEST_CASE("trainer on a GPU: a steady-state step never synchronises with the host, and every record arrives") {
  trainer::Trainer t(gpu_config("sync", "on"), comm::WorldInfo{});
  t.open();
  auto& ws = c10::cuda::warning_state();
  int64_t steps = 0;
  while (t.more()) {
    if (steps >= 5) ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    std::string what;
    try {
      t.step();
    } catch (const std::exception& e) {
      what = e.what();
    }
    ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    INFO("step " << steps + 1 << ": " << what.substr(0, 800));
    REQUIRE(what.empty());
    t.step_boundary();
    ++steps;
  }
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
