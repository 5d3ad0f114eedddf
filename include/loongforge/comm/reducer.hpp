// loongforge/comm/reducer.hpp — the gradient-communication seam of the
// trainer: the plain implementation (GCTS off) and GCTS's strategies
// (docs/architecture.md s4); the trainer's step is the same for all.
//
// Contract:
//  - One reducer per rank, owned by the trainer thread; every rank calls the
//    same methods in the same order each step (c10d's rule).
//  - sum_counts() sums a host integer over ranks before backward (the step's
//    valid action elements, docs/training-semantics.md s5); one rank: itself.
//  - average_gradients() leaves every parameter's .grad equal to the mean of
//    the ranks' gradients (a rank without a gradient for a parameter
//    contributes zeros). One rank: nothing to do. With a ShardTarget (a
//    sharded optimizer, shard.hpp) it leaves the mean of the sharded
//    parameters' flat gradient range of this rank in target.grad instead, and
//    the replicated (tiny) parameters' mean in their .grad.
//  - GCTS strategies (make_gcts_reducer; Note [GCTS strategies] in
//    reducer.cpp): `simple` and `hybrid` give the same numbers in fp32 up to
//    the summation order of the collective (bitwise equal with 2 ranks);
//    switch_strategy() changes the strategy for the following steps and must
//    be called at the same step boundary on every rank (the control plane's
//    cluster-wide verbs do that).
//  - sum_scalar() sums a device scalar over ranks without reading it on the
//    host (the logged loss); one rank: returns it unchanged.
//  - Phase "comm/all-reduce" goes to the PhaseRecorder; comm_status() is what
//    `monitor-comm` shows (bytes, time, bandwidths per group) or null when
//    there is no communication.
//  - engine() is GCTS's record (common/engine.hpp).
//
// Example:
//   auto reducer = make_plain_reducer(world.get());   // nullptr: one rank
//   auto gcts = make_gcts_reducer(cfg, world.get(), params, /*shard=*/nullptr);
//   const int64_t v = reducer->sum_counts(local_valid);
//   ... backward ...
//   reducer->average_gradients(optimizer.params(), phases, step);
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor
#include <nlohmann/json.hpp>   // nlohmann::json

#include "loongforge/comm/shard.hpp"
#include "loongforge/comm/world.hpp"
#include "loongforge/common/engine.hpp"
#include "loongforge/common/phases.hpp"
#include "loongforge/config/config.hpp"

namespace loongforge::comm {

constexpr bool kGctsBuilt = true;

// A trainable parameter as the reducer plans it (optimizer order).
struct ReducedParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  bool embodiment = false;  // per-embodiment slots: dim 0 indexes the slot
};

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual int64_t world_size() const = 0;
  virtual int64_t sum_counts(int64_t local) = 0;
  virtual void average_gradients(const std::vector<at::Tensor>& params, PhaseRecorder& phases, int64_t step) = 0;
  virtual at::Tensor sum_scalar(const at::Tensor& scalar) = 0;
  // "none (1 rank)", "plain (...)": what `status` shows as the strategy.
  virtual std::string strategy() const = 0;
  virtual nlohmann::json comm_status() const = 0;
  // GCTS: "simple" or "hybrid" from the next average_gradients() on; returns
  // {previous, strategy}. The plain reducer refuses (CommError).
  virtual nlohmann::json switch_strategy(const std::string& strategy);
  // GCTS: the plan (buckets, groups, dtype, shards) as JSON; null otherwise.
  virtual nlohmann::json plan() const { return nullptr; }
};

// The plain path: one flat fp32 all-reduce of every gradient after backward
// (GradientSync); `world` nullptr means one rank (no communication).
std::unique_ptr<GradientReducer> make_plain_reducer(World* world);

// GCTS (cfg.gcts): `world` nullptr means one rank (only a sharded optimizer
// gives it work); `shard` is the sharded optimizer's target or nullptr.
std::unique_ptr<GradientReducer> make_gcts_reducer(const config::Config& cfg, World* world,
                                                   std::vector<ReducedParam> params, ShardTarget* shard);

// The GCTS record; attach() connects its verbs, status and checkpoint state
// to the running reducer (which must outlive the record's use).
Engine engine(const config::Config& cfg);
void attach(Engine& e, GradientReducer& reducer);

}  // namespace loongforge::comm
