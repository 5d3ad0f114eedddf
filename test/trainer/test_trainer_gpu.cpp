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
//   step's exposed communication is then timed on the device (CommTimer);
// - with a one-rank NCCL World (the LOONGFORGE_TEST_ONE_RANK_WORLD hook),
//   GCTS's reduction captured into the last micro-batch's graph (Note
//   [Reduction in the graph]) trains as the reduction after backward, never
//   synchronises, and its tail is timed inside the graph.
#include <algorithm>  // std::max
#include <cmath>      // std::abs
#include <string>     // std::string
#include <vector>     // std::vector
#include <cstdlib>    // setenv

#include <ATen/cuda/Sleep.h>         // at::cuda::sleep
#include <c10/cuda/CUDAFunctions.h>  // c10::cuda::warning_state

#include "catch_compat.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/trainer/trainer.hpp"
#include "../comm/ranks.hpp"  // free_port

using namespace loongforge;

namespace {

config::Config gpu_config(const std::string& name, const std::string& graphs, bool sharded = false,
                          const std::vector<std::string>& more = {}) {
  const std::string out = std::string(LOONGFORGE_TEST_MODELS) + "/trainer-gpu-" + name;
  remove_tree(out);
  make_dirs(out);
  config::ValidationContext ctx;
  ctx.built_engines = trainer::built_engines();  // as loongforge-train validates (GCTS keys)
  std::vector<std::string> sets = {"model.path=" + std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt", "data.path=" LOONGFORGE_TEST_DATASET,
       "run.output_dir=" + out, "run.name=r", "run.device=cuda", "precision.mode=bf16", "logging.progress=off",
       "logging.tensorboard=false", "control.enable=false", "trainer.micro_batch_size=4",
       "trainer.gradient_accumulation_steps=2", "trainer.max_steps=30", "checkpoint.interval_steps=1000",
       "optimizer.implementation=fused", "trainer.cuda_graphs=" + graphs, "gcts.enable=" + std::string(sharded ? "true" : "false"),
       "gcts.shard_optimizer=" + std::string(sharded ? "true" : "false")};
  sets.insert(sets.end(), more.begin(), more.end());
  return config::parse_config_text("{}", "test", sets, ctx);
}

// Runs `t` to the end with CUDA's sync-debug mode set to error around every
// step after the seventh (a capture synchronises: the step graphs are captured
// at step 4, the optimizer graph three steps after the gradients' addresses
// settle, at step 7 with made gradients); returns the first step's failure
// ("" when none).
std::string run_without_syncs(trainer::Trainer& t) {
  t.open();
  auto& ws = c10::cuda::warning_state();
  int64_t steps = 0;
  std::string what;
  while (t.more() && what.empty()) {
    if (steps >= 7) ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
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

TEST_CASE("trainer on a GPU: GCTS's reduction captured into the step's CUDA graph (one NCCL rank) trains as the "
          "reduction after backward, and a step never synchronises") {
  ::setenv("LOONGFORGE_TEST_ONE_RANK_WORLD", "1", 1);
  for (const bool sharded : {false, true}) {
    CAPTURE(sharded);
    const std::string tag = sharded ? "-sharded" : "";
    comm::WorldInfo info;
    info.master_port = comm::test::free_port();
    trainer::Trainer after(gpu_config("after" + tag, "on", sharded, {"gcts.enable=true", "gcts.overlap=false"}), info);
    REQUIRE(after.run() == 0);
    REQUIRE(after.runner_status().at("reduction_graphs").get<int64_t>() == 0);
    info.master_port = comm::test::free_port();
    trainer::Trainer t(gpu_config("in-graph" + tag, "on", sharded, {"gcts.enable=true", "gcts.overlap=true"}), info);
    REQUIRE(run_without_syncs(t) == "");
    const auto runner = t.runner_status(), comm = t.comm_status();
    REQUIRE(t.close() == 0);
    REQUIRE(t.history().size() == 30);
    // 2 micro-batches: one plain graph, one with the reduction, each after 3 eager calls (captured at step 4)
    REQUIRE(runner.at("reduction_graphs").get<int64_t>() == 1);
    REQUIRE(runner.at("reduction_replays").get<int64_t>() == 27);
    REQUIRE(comm.at("in_graph").get<bool>());
    double worst = 0, exposed = 0;
    int64_t timed = 0;
    for (size_t i = 0; i < 30; ++i) {
      const double a = after.history()[i].loss, b = t.history()[i].loss;
      worst = std::max(worst, std::abs(a - b) / std::max(std::abs(a), 1e-12));
      if (i >= 4) exposed = std::max(exposed, t.history()[i].exposed_comm_ms), timed += 1;
    }
    WARN("reduction in the graph vs after backward: largest relative loss difference " << worst
         << "; largest exposed_comm_ms of the replayed steps (device, inside the graph) " << exposed);
    REQUIRE(worst <= 0.01);  // bf16, as graphs vs eager above (backward's atomics are not deterministic)
    REQUIRE(exposed > 0);          // the graph's tail was timed
    REQUIRE(exposed < 50);         // one rank: copies and a few launches' worth
  }
  ::unsetenv("LOONGFORGE_TEST_ONE_RANK_WORLD");
}
