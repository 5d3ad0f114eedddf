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
//   synchronises, and its tail is timed inside the graph;
// - FusedAdamW's kernels: every parameter, a bf16 working copy's fp32 master
//   (precision.bf16_weights) or an fp32 parameter, takes the update ATen's
//   fused AdamW gives the same gradient in fp32 (clipping, both decay groups,
//   a non-finite norm) within 1e-6, the norm ATen's within 1e-6, the copy is
//   the master rounded; with bf16 working copies a run with them trains as a run without, never
//   synchronises, and checkpoints the fp32 masters; with two micro-batches,
//   alone, under GCTS with a one-rank NCCL World (reducing inside the graph,
//   and without graphs from gradient hooks) and in the sharded AdamW,
//   their gradients are fp32 sums (Note [fp32 gradients of bf16 copies]) and
//   the run still trains as one without copies; the master update is the same
//   from fp32 gradients.
#include <algorithm>  // std::max
#include <cmath>      // std::abs, std::isfinite
#include <limits>     // std::numeric_limits
#include <string>     // std::string
#include <vector>     // std::vector
#include <cstdlib>    // setenv
#include <fstream>    // std::ifstream

#include <ATen/cuda/Sleep.h>         // at::cuda::sleep
#include <c10/cuda/CUDAFunctions.h>  // c10::cuda::warning_state

#include "catch_compat.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/optim/optimizer.hpp"
#include "loongforge/trainer/readback.hpp"
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
       "optimizer.implementation=fused", "trainer.cuda_graphs=" + graphs,
       // the TorchScript step's graphs (the default on CUDA compiles a package)
       "trainer.compiled_step=off", "gcts.enable=" + std::string(sharded ? "true" : "false"),
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

// How closely run `t` follows run `base`: relative differences of step 1's
// loss and gradient norm, and the largest relative loss difference over both
// histories.
struct Agreement {
  double first_loss = 0, first_norm = 0, worst_loss = 0;
};
Agreement agreement(const trainer::Trainer& base, const trainer::Trainer& t) {
  const auto& a = base.history();
  const auto& b = t.history();
  Agreement r;
  r.first_loss = std::abs(b[0].loss - a[0].loss) / std::abs(a[0].loss);
  r.first_norm = std::abs(b[0].grad_norm - a[0].grad_norm) / std::abs(a[0].grad_norm);
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    r.worst_loss = std::max(r.worst_loss, std::abs(a[i].loss - b[i].loss) / std::max(std::abs(a[i].loss), 1e-12));
  return r;
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

// The oracle: what FusedAdamW did through ATen's kernels before it had its own (clipping by `_foreach_norm`,
// `_foreach_mul_`, then `_fused_adamw_` per decay group, skipping a non-finite norm's update), on fp32 tensors.
struct AtenAdamW {
  std::vector<at::Tensor> p, m, v, s;
  std::vector<bool> decay;
  optim::AdamWOptions o;
  at::Tensor step(const std::vector<at::Tensor>& grads, double lr, double max_norm) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> g;
    for (const at::Tensor& x : grads) g.push_back(x.to(at::kFloat, false, true));  // its own: scaled in place
    const at::Tensor total = at::linalg_vector_norm(at::stack(at::_foreach_norm(g, 2)), 2);
    if (max_norm > 0) at::_foreach_mul_(g, at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0));
    const at::Tensor found_inf = at::logical_not(at::isfinite(total)).to(at::kFloat);
    const at::Tensor lr_t = at::full({}, lr, p.front().options());
    for (const bool d : {true, false}) {
      std::vector<at::Tensor> pp, gg, mm, vv, ss;
      for (size_t i = 0; i < p.size(); ++i)
        if (decay[i] == d) pp.push_back(p[i]), gg.push_back(g[i]), mm.push_back(m[i]), vv.push_back(v[i]), ss.push_back(s[i]);
      if (pp.empty()) continue;
      at::_foreach_add_(ss, 1);
      at::_fused_adamw_(pp, gg, mm, vv, {}, ss, lr_t, o.beta1, o.beta2, d ? o.weight_decay : 0.0, o.eps, false, false,
                        c10::nullopt, found_inf);
      at::_foreach_add_(ss, found_inf, -1);
    }
    return total;
  }
};

TEST_CASE("optimizer on a GPU: every parameter, with a bf16 working copy or without, takes the update ATen's fused "
          "AdamW gives its gradient in fp32 (bf16 or fp32), and a copy is its master rounded") {
  for (const auto mode : {optim::CopyGradients::bf16, optim::CopyGradients::fp32}) {
    const bool fp32 = mode == optim::CopyGradients::fp32;
    CAPTURE(fp32);
    at::manual_seed(3);
    const auto cuda = at::TensorOptions().device(at::kCUDA);
    // Shapes: vector loads (4096 x 1536 spans several chunks), a length no multiple of 4, a tiny bias, and fp32
    // parameters without copies beside them: a bias and a grouped weight spanning several chunks.
    const std::vector<std::vector<int64_t>> shapes = {{4096, 1536}, {1537}, {7, 3}, {256}, {64, 64}, {3, 700, 300}};
    const std::vector<bool> decay = {true, false, true, false, true, true};
    const std::vector<bool> copy = {true, true, true, false, true, false};
    std::vector<optim::OptimizedParam> mine;
    AtenAdamW ref;
    optim::AdamWOptions o;
    o.weight_decay = 0.1;
    ref.o = o, ref.decay = decay;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const at::Tensor w = at::randn(shapes[i], cuda);
      mine.push_back({"p" + std::to_string(i), w.clone().requires_grad_(true), decay[i], copy[i]});
      ref.p.push_back(w.clone()), ref.m.push_back(at::zeros_like(w)), ref.v.push_back(at::zeros_like(w));
      ref.s.push_back(at::zeros({}, cuda));
    }
    optim::FusedAdamW a(mine, o, mode);
    REQUIRE(a.working_copies().count == 4);
    REQUIRE(a.working_copies().fp32_gradients == fp32);
    std::vector<at::Tensor> kept;  // fp32 mode: the copies' gradient tensors, kept for the whole run
    for (size_t i = 0; i < shapes.size(); ++i) {
      REQUIRE(a.params()[i].grad().defined() == (fp32 && copy[i]));
      kept.push_back(a.params()[i].grad());
    }
    double worst_master[2] = {0, 0}, worst_norm = 0, worst_unclipped = 0;  // [copy]
    int64_t unequal = 0, unequal_unclipped = 0;
    for (int step = 1; step <= 20; ++step) {
      CAPTURE(step);
      std::vector<at::Tensor> grads;
      for (size_t i = 0; i < shapes.size(); ++i) {
        at::Tensor g = at::randn(shapes[i], cuda);
        if (step == 7 && i == 2) g.view(-1)[0] = std::numeric_limits<float>::infinity();  // skipped step
        if (copy[i] && !fp32) g = g.to(at::kBFloat16);
        if (copy[i] && fp32)
          a.params()[i].mutable_grad().copy_(g);  // as autograd adds into it
        else
          a.params()[i].mutable_grad() = g;
        grads.push_back(g);
      }
      const double max_norm = step > 4 && step % 2 ? 1.0 : 0.0;  // no clipping in steps 1-4, then every other step
      const at::Tensor na = a.clip_grad_norm(max_norm);
      a.step(1e-3 * step);
      const at::Tensor nb = ref.step(grads, 1e-3 * step, max_norm);
      if (std::isfinite(nb.item<float>()))
        worst_norm = std::max(worst_norm, std::abs(na.item<double>() - nb.item<double>()) / nb.item<double>());
      else
        REQUIRE_FALSE(std::isfinite(na.item<float>()));
      for (size_t i = 0; i < shapes.size(); ++i) {
        const at::Tensor master = a.master_weight(a.params()[i]), expected = ref.p[i];
        REQUIRE(master.scalar_type() == at::kFloat);
        const double d = (master - expected).abs().max().item<double>() / expected.abs().max().item<double>();
        worst_master[copy[i]] = std::max(worst_master[copy[i]], d);
        const int64_t ne = master.ne(expected).sum().item<int64_t>();
        if (step <= 4) worst_unclipped = std::max(worst_unclipped, d), unequal_unclipped += ne;
        unequal += ne;
        if (copy[i]) {
          REQUIRE(a.params()[i].scalar_type() == at::kBFloat16);
          REQUIRE(a.params()[i].equal(master.to(at::kBFloat16)));
        }
        if (fp32 && copy[i]) {  // zeroed in place by step(), not dropped
          REQUIRE(a.params()[i].grad().is_same(kept[i]));
          REQUIRE(a.params()[i].grad().abs().max().item<float>() == 0.0f);
        }
      }
    }
    const auto sa = a.state_tensors();
    double worst_state = 0;
    for (size_t i = 0; i < shapes.size(); ++i)
      for (const auto& [k, expected] : {std::pair{2 * i, ref.m[i]}, std::pair{2 * i + 1, ref.v[i]}})
        worst_state = std::max(worst_state, (sa[k].second - expected).abs().max().item<double>() /
                                                std::max(expected.abs().max().item<double>(), 1e-30));
    for (size_t i = 0; i < shapes.size(); ++i)  // the same updates counted (step 7 skipped on both)
      REQUIRE(a.state_json()["steps"]["p" + std::to_string(i)].get<int64_t>() == ref.s[i].item<int64_t>());
    REQUIRE(ref.s[0].item<int64_t>() == 19);
    WARN("FusedAdamW's kernels (" << (fp32 ? "fp32" : "bf16") << " gradients of the copies) vs ATen's fused AdamW "
         << "on fp32 gradients, 20 steps: largest relative difference of a master " << worst_master[1]
         << ", of a parameter without a copy " << worst_master[0] << " (" << unequal
         << " elements not bit-identical over all steps), of a moment " << worst_state << ", of the gradient norm "
         << worst_norm << "; without clipping (steps 1-4) " << worst_unclipped << " (" << unequal_unclipped
         << " elements not bit-identical)");
    REQUIRE(worst_unclipped <= 1e-6);
    REQUIRE(worst_master[0] <= 1e-6);
    REQUIRE(worst_master[1] <= 1e-6);
    // The norm: sums of squares per block of 32768 elements, then of those (Note [The optimizer's kernels]), where
    // ATen takes per-tensor norms, then the norm of those; bf16 gradients squared in float over the bf16 values,
    // the reference's over the same values held as fp32. Float rounding apart (9.3e-8 measured on an H100), and
    // the clipped moments with it (5.5e-8 measured; bf16 gradients keep the 1e-4 they had before the kernels).
    REQUIRE(worst_norm <= 1e-6);
    REQUIRE(worst_state <= (fp32 ? 1e-6 : 1e-4));
  }
}

TEST_CASE("trainer on a GPU: with bf16 working copies a run trains as with autocast's casts, never synchronises, and "
          "checkpoints the fp32 masters") {
  const std::vector<std::string> one_micro_batch = {"trainer.gradient_accumulation_steps=1", "checkpoint.interval_steps=30"};
  auto with = one_micro_batch, without = one_micro_batch;
  with.push_back("precision.bf16_weights=on");
  without.push_back("precision.bf16_weights=off");
  trainer::Trainer base(gpu_config("casts", "on", false, without), comm::WorldInfo{});
  REQUIRE(base.run() == 0);
  trainer::Trainer t(gpu_config("copies", "on", false, with), comm::WorldInfo{});
  REQUIRE(run_without_syncs(t) == "");
  REQUIRE(t.close() == 0);
  REQUIRE(t.history().size() == 30);
  const Agreement d = agreement(base, t);
  WARN("bf16 working copies vs autocast's casts: step 1 loss relative difference " << d.first_loss
       << ", gradient norm " << d.first_norm << "; over 30 steps the largest relative loss difference " << d.worst_loss);
  REQUIRE(d.first_loss <= 1e-6);  // the same bf16 weights in the first forward
  REQUIRE(d.first_norm <= 1e-5);  // the same bf16 gradients (norms summed in another order)
  REQUIRE(d.worst_loss <= 0.01);  // bf16, as graphs vs eager above
  // The checkpoint holds the fp32 masters, not the bf16 copies.
  std::string dir;
  for (const char* name : {"epoch_0_step_30", "epoch_1_step_30", "epoch_2_step_30", "epoch_3_step_30"})
    if (is_directory(t.run_dir() + "/checkpoints/" + name)) dir = t.run_dir() + "/checkpoints/" + name;
  REQUIRE_FALSE(dir.empty());
  int64_t fp32 = 0, bf16 = 0;
  for (const auto& [name, tensor] : checkpoint::read_safetensors(dir + "/model.safetensors")) {
    if (name.rfind("action_head.blocks.0.attn.q.", 0) == 0) REQUIRE(tensor.scalar_type() == at::kFloat);
    (tensor.scalar_type() == at::kFloat ? fp32 : bf16) += 1;
  }
  INFO(fp32 << " fp32 tensors, " << bf16 << " bf16 (frozen) in " << dir);
  REQUIRE(fp32 > 0);
}

TEST_CASE("trainer on a GPU: bf16 working copies with two micro-batches, alone (auto keeps them), under GCTS (one "
          "NCCL rank, in the graph and from gradient hooks) and in the sharded AdamW, sum their gradients in fp32 "
          "and train as autocast's casts, and a graphed step never synchronises") {
  const auto copies_of = [](const trainer::Trainer& t) {
    std::ifstream in(t.run_dir() + "/summary.json");
    return nlohmann::json::parse(in).at("bf16_weights");
  };
  // world: GCTS reduces inside the graph; world-eager: without graphs, launched from gradient hooks.
  for (const std::string form : {"alone", "world", "world-eager", "sharded"}) {
    CAPTURE(form);
    const bool world = form.rfind("world", 0) == 0, sharded = form == "sharded", graphs = form != "world-eager";
    if (world) ::setenv("LOONGFORGE_TEST_ONE_RANK_WORLD", "1", 1);
    const std::string tag = "-" + form;
    std::vector<std::string> with = {"trainer.gradient_accumulation_steps=2"};
    if (world) with.insert(with.end(), {"gcts.enable=true", "gcts.overlap=true"});
    auto without = with;
    // alone: auto keeps the copies with accumulation at one rank; the others need on
    with.push_back(form == "alone" ? "precision.bf16_weights=auto" : "precision.bf16_weights=on");
    without.push_back("precision.bf16_weights=off");
    comm::WorldInfo info;
    info.master_port = comm::test::free_port();
    const std::string runner = graphs ? "on" : "off";
    trainer::Trainer base(gpu_config("casts-k2" + tag, runner, sharded, without), info);
    REQUIRE(base.run() == 0);
    info.master_port = comm::test::free_port();
    trainer::Trainer t(gpu_config("copies-k2" + tag, runner, sharded, with), info);
    if (graphs) {
      REQUIRE(run_without_syncs(t) == "");
      REQUIRE(t.close() == 0);
    } else {
      REQUIRE(t.run() == 0);
    }
    REQUIRE(t.history().size() == 30);
    REQUIRE(copies_of(base).is_null());
    const nlohmann::json copies = copies_of(t);
    INFO(copies.dump());
    REQUIRE(copies.at("gradients") == "fp32");
    REQUIRE(copies.at("copies").get<int64_t>() > 0);
    if (world) {
      const nlohmann::json comm = t.comm_status();
      INFO(comm.dump());
      REQUIRE(comm.value("in_graph", false) == graphs);
      if (!graphs) REQUIRE(comm.at("units_launched_in_backward").get<int64_t>() > 0);  // from the gradient hooks
    }
    const Agreement d = agreement(base, t);
    WARN("bf16 working copies with fp32 gradients (" << form << ")"
         << " vs autocast's casts, 2 micro-batches: step 1 loss relative difference " << d.first_loss
         << ", gradient norm " << d.first_norm << "; over 30 steps the largest relative loss difference "
         << d.worst_loss);
    REQUIRE(d.first_loss <= 1e-6);  // the same bf16 weights in the first forward
    REQUIRE(d.first_norm <= 1e-5);  // the same fp32 sums of the same bf16 gradients (backward's atomics aside)
    REQUIRE(d.worst_loss <= 0.01);  // bf16, as graphs vs eager above
    if (world) ::unsetenv("LOONGFORGE_TEST_ONE_RANK_WORLD");
  }
}
