// Test helper of the comm room: one GCTS step of a small model on one rank of
// a World (its device: CPU for Gloo, the rank's GPU for NCCL), 2 micro-batches,
// returning the averaged gradients and what the reducer reports. Used by
// test_overlap.cpp (two Gloo ranks) and test_nccl_gpu.cpp (NCCL on one GPU).
#pragma once

#include <functional>  // std::function
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <ATen/ATen.h>              // at::randn, at::tanh
#include <ATen/CPUGeneratorImpl.h>  // at::CPUGeneratorImpl
#include <c10/core/impl/DeviceGuardImplInterface.h>  // c10::impl::getDeviceGuardImpl

#include "loongforge/comm/reducer.hpp"
#include "loongforge/engines/gcts/gcts.hpp"
#include "loongforge/comm/shard.hpp"
#include "loongforge/config/config.hpp"

namespace loongforge::comm::test {

// A recorder that records nothing (phases are not under test here).
struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
};

// W1 (8x16), b1 (16, tiny), W2 (16x16), E (4 slots x 16 x 16, per
// embodiment), W3 (16x4): the parameter kinds the plans treat differently.
struct Net {
  std::vector<at::Tensor> params;
  std::vector<ReducedParam> meta;
  explicit Net(c10::Device device) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);  // threads: no global seed
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"w1", {8, 16}}, {"b1", {16}}, {"w2", {16, 16}}, {"emb", {4, 16, 16}}, {"w3", {16, 4}}};
    for (const auto& [name, shape] : shapes) {
      params.push_back((at::randn(shape, gen) * 0.3).to(device).requires_grad_(true));
      ReducedParam m;
      m.name = name, m.shape = shape, m.numel = params.back().numel(), m.embodiment = name == "emb";
      meta.push_back(m);
    }
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& ids) const {
    at::Tensor h = at::tanh(x.matmul(params[0]) + params[1]);
    h = at::tanh(h.matmul(params[2]));
    h = at::tanh(at::bmm(h.unsqueeze(1), params[3].index_select(0, ids)).squeeze(1));
    return h.matmul(params[4]).pow(2).mean();
  }
};

// Note [First use of MKL on two threads]
// libtorch's MKL (linked into libtorch_cpu) chooses its vector-math kernels
// at first use. When the two rank threads of test/comm/ranks.hpp make the
// process's first calls at once, one thread's at::tanh (MKL vmsTanh, asked
// for high accuracy) can return, for its first few calls, the values of
// MKL's low-accuracy AVX2 kernel (VML_EP, up to 4.9e-5 off; the same bits
// as vmsTanh with VML_EP under MKL_ENABLE_INSTRUCTIONS=AVX2). Whichever run
// of a rank went first then differed bitwise from the later one in every
// gradient (about 1 process in 65 beside another test's process on a busy
// 2-core machine; never with the Net run once first). The tests that compare
// two runs bitwise run the Net once on the calling thread before starting
// the ranks, so that MKL's set-up is done on one thread.
inline void warm_up_math() {
  Net net(c10::kCPU);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  net.loss(at::randn({6, 8}, gen), at::randint(0, 2, {6}, gen, at::kLong)).backward();
}

// GCTS with buckets small enough that the Net has several.
inline config::Config small_buckets(const std::string& strategy) {
  config::Config cfg;
  cfg.gcts.enable = true;
  cfg.gcts.comm_strategy = strategy;
  cfg.gcts.bucket_mb = 0.002;         // 500 floats: several buckets
  cfg.gcts.first_bucket_mb = 0.0005;  // 125 floats
  cfg.gcts.tiny_tensor_kb = 0.1;      // 25 floats: b1 is tiny
  return cfg;
}

// This rank's sharded-optimizer target for the Net (empty when not sharded).
inline ShardTarget shard_target(const Net& net, const World& world, bool sharded) {
  ShardTarget target;
  if (!sharded) return target;
  std::vector<int64_t> numels;
  for (const auto& m : net.meta) numels.push_back(m.numel);
  target.layout = ShardLayout::make(numels, 25, world.size(), world.rank());
  target.grad = at::zeros({target.layout.chunk}, at::TensorOptions().device(world.device()));
  return target;
}

struct StepResult {
  std::vector<at::Tensor> grads;  // per parameter (replicated ones when sharded)
  at::Tensor shard_grad;          // sharded: this rank's averaged range
  int64_t launched_in_backward = 0;
  double bytes = 0;
  std::string clock;           // monitor-comm's clock: "host" (Gloo) or device events (NCCL)
  int64_t shown_step = 0;      // the step monitor-comm shows
  std::vector<double> times;   // per bucket time_ms
};

// `agree`: the step's counts go through agree_counts() first, as the trainer
// does, so the per-embodiment rows come from the batches' slots (Note
// [Embodiment rows]); without it from the gradients.
inline StepResult train_step(World& world, const std::string& strategy, bool sharded, bool overlap,
                             bool agree = false) {
  const c10::Device device = world.device();
  Net net(device);
  const config::Config cfg = small_buckets(strategy);
  ShardTarget target = shard_target(net, world, sharded);
  auto reducer = loongforge::gcts::make_reducer(cfg, &world, net.meta, sharded ? &target : nullptr, overlap);
  NoPhases phases;
  std::vector<at::Tensor> xs, ids;
  StepCounts counts;
  for (int64_t micro = 0; micro < 2; ++micro) {
    // each rank, each micro-batch: its own data
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + world.rank() * 10 + micro);
    xs.push_back(at::randn({6, 8}, gen).to(device));
    const at::Tensor id = at::randint(0, 2, {6}, gen, at::kLong);  // slots 2, 3 get no gradient
    for (int64_t k = 0; k < id.numel(); ++k) counts.slots.push_back(id[k].item<int64_t>());
    ids.push_back(id.to(device));
  }
  if (agree) reducer->agree_counts(StepCounts::combine({counts}));
  reducer->begin_step(net.params, /*micro_batches=*/2);
  for (int64_t micro = 0; micro < 2; ++micro) net.loss(xs[micro], ids[micro]).backward();
  reducer->average_gradients(net.params, phases, 0);
  // NCCL's timings are device events: monitor-comm shows a step once they are done.
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
  StepResult r;
  for (const auto& p : net.params) r.grads.push_back(p.grad().cpu().clone());
  if (sharded) r.shard_grad = target.grad.cpu().clone();
  const auto status = reducer->comm_status();
  r.launched_in_backward = status.at("units_launched_in_backward").get<int64_t>();
  for (const auto& b : status.at("buckets")) {
    r.bytes += b.at("bytes").get<double>();
    r.times.push_back(b.at("time_ms").get<double>());
  }
  r.clock = status.at("clock").get<std::string>();
  r.shown_step = status.at("step").get<int64_t>();
  return r;
}

// Drives `steps` steps of 2 micro-batches as the graph runner drives a
// reduction in the graph (Note [Reduction in the graph] in
// src/engines/gcts/reducer.cpp): micro-batch 0 eagerly, micro-batch 1 through
// graph(region), where region() is what would be captured (begin_capture,
// the backward, end_capture): `graph` captures it once and replays it on
// GPUs, or just calls it (the protocol without a graph, any backend); then
// graph_replayed() and average_gradients(). With `graph` empty: the plain
// path (no overlap, reduction after backward). The slots are agreed as the
// trainer does; step s scales the inputs by 1 + s / 2, into the same
// tensors (a graph's inputs stay put), and gradients are zeroed in place.
// Returns the averaged gradients after each step (the sharded range last);
// `status`: monitor-comm's record after the last step.
using GraphDriver = std::function<void(const std::function<void()>& region)>;
inline std::vector<std::vector<at::Tensor>> graph_steps(World& world, const std::string& strategy, bool sharded,
                                                        int64_t steps, const GraphDriver& graph,
                                                        nlohmann::json* status = nullptr) {
  const c10::Device device = world.device();
  Net net(device);
  const config::Config cfg = small_buckets(strategy);
  ShardTarget target = shard_target(net, world, sharded);
  auto reducer = loongforge::gcts::make_reducer(cfg, &world, net.meta, sharded ? &target : nullptr, /*overlap=*/false);
  NoPhases phases;
  std::vector<at::Tensor> base, xs, ids;
  StepCounts counts;
  for (int64_t micro = 0; micro < 2; ++micro) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + world.rank() * 10 + micro);
    base.push_back(at::randn({6, 8}, gen).to(device));
    xs.push_back(base.back().clone());
    const at::Tensor id = at::randint(0, 2, {6}, gen, at::kLong);  // slots 2, 3 get no gradient
    for (int64_t k = 0; k < id.numel(); ++k) counts.slots.push_back(id[k].item<int64_t>());
    ids.push_back(id.to(device));
  }
  for (const auto& p : net.params) p.mutable_grad() = at::zeros_like(p);  // the graph accumulates into these
  std::vector<std::vector<at::Tensor>> out;
  for (int64_t step = 0; step < steps; ++step) {
    for (const auto& p : net.params) p.mutable_grad().zero_();
    for (int64_t micro = 0; micro < 2; ++micro) xs[micro].copy_(base[micro] * (1.0 + 0.5 * step));
    reducer->agree_counts(StepCounts::combine({counts}));
    reducer->begin_step(net.params, /*micro_batches=*/2);
    net.loss(xs[0], ids[0]).backward();
    if (graph) {
      reducer->prepare_capture();  // outside the region, as the graph runner does
      graph([&] {
        reducer->begin_capture();
        net.loss(xs[1], ids[1]).backward();
        reducer->end_capture();
      });
      reducer->graph_replayed();
    } else {
      net.loss(xs[1], ids[1]).backward();
    }
    reducer->average_gradients(net.params, phases, step);
    std::vector<at::Tensor> g;
    for (const auto& p : net.params) g.push_back(p.grad().cpu().clone());
    if (sharded) g.push_back(target.grad.cpu().clone());
    out.push_back(std::move(g));
  }
  if (status) *status = reducer->comm_status();  // the last step, as monitor-comm shows it
  return out;
}

}  // namespace loongforge::comm::test
