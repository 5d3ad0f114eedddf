// loongforge/comm/reducer.hpp — the gradient-communication seam of the
// trainer, and its plain implementation (one flat all-reduce after backward).
// GCTS (include/loongforge/engines/gcts/gcts.hpp) implements the same
// interface with its strategies; the trainer's step is the same for all.
//
// Contract:
//  - One reducer per rank, owned by the trainer thread; every rank calls the
//    same methods in the same order each step (c10d's rule).
//  - agree_counts() sums the step's valid action elements over ranks before
//    backward (docs/training-semantics.md s5) and unites the embodiment slots
//    the ranks' batches index, host to host (World::all_gather_on_hosts: no
//    rank waits for its device); one rank: its own. A reducer may use those
//    slots to reduce only the rows of the per-embodiment parameters some
//    batch indexed (GCTS's hybrid plan).
//  - reduces() says whether average_gradients() has work to do each step
//    (a World to reduce over, even of one rank, or a sharded optimizer's
//    gradient shard to fill); the trainer calls it only then.
//  - average_gradients() leaves every parameter's .grad equal to the mean of
//    the ranks' gradients (a rank without a gradient for a parameter
//    contributes zeros). One rank: nothing to do. With a ShardTarget (a
//    sharded optimizer, shard.hpp) it leaves the mean of the sharded
//    parameters' flat gradient range of this rank in target.grad instead, and
//    the replicated (tiny) parameters' mean in their .grad.
//  - begin_step() arms what must happen during backward (GCTS's overlap);
//    switch_strategy() changes the strategy for the following steps and must
//    be called at the same step boundary on every rank (the control plane's
//    cluster-wide verbs do that); the plain reducer refuses it.
//  - sum_scalar() sums a device scalar over ranks without reading it on the
//    host (the logged loss); one rank: returns it unchanged.
//  - Phase "comm/all-reduce" goes to the PhaseRecorder; comm_status() is what
//    `monitor-comm` shows for the last step (per group and per bucket: bytes,
//    time, collective, algbw/busbw by nccl-tests' definitions; exposed_ms,
//    the communication the step waited for after backward) or null when
//    there is no communication (docs/operations.md, monitor-comm).
//
// Example:
//   auto reducer = make_plain_reducer(world.get());   // world nullptr: one rank
//   const StepCounts all = reducer->agree_counts({local_valid, {embodiment_id}});
//   reducer->begin_step(optimizer.params(), k);
//   ... k forward/backward passes ...
//   if (reducer->reduces()) reducer->average_gradients(optimizer.params(), phases, step);
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor
#include <nlohmann/json.hpp>   // nlohmann::json

#include "loongforge/comm/shard.hpp"
#include "loongforge/comm/world.hpp"
#include "loongforge/common/phases.hpp"

namespace loongforge::comm {

// A trainable parameter as the reducer plans it (optimizer order).
struct ReducedParam {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  bool embodiment = false;  // per-embodiment slots: dim 0 indexes the slot
  // Position in backward readiness order (0 = final first) from the model's
  // dependency graph (model::Mdg); -1 = unknown (then the plan assumes
  // reverse definition order for every parameter).
  int64_t ready_rank = -1;
};

// What a step's batches say on the host, before the step runs.
struct StepCounts {
  int64_t valid = 0;           // valid action elements (the loss is averaged over them)
  std::vector<int64_t> slots;  // embodiment slots indexed (batch "embodiment_id"), sorted, distinct
  // `valid` summed, `slots` united over every rank's counts (rank order).
  static StepCounts combine(const std::vector<StepCounts>& ranks);
  std::string encode() const;
  static StepCounts decode(const std::string& s);  // CommError on a malformed string
};

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual int64_t world_size() const = 0;
  // Whether average_gradients() has work each step (see the contract).
  virtual bool reduces() const { return world_size() > 1; }
  virtual StepCounts agree_counts(const StepCounts& local) = 0;
  // Before the step's forward/backward passes (`micro_batches` of them) over
  // `params` (optimizer order): GCTS with overlap arms its gradient hooks
  // here (Note [Overlap] in src/engines/gcts/reducer.cpp); the others do nothing.
  virtual void begin_step(const std::vector<at::Tensor>& params, int64_t micro_batches) {
    (void)params, (void)micro_batches;
  }
  virtual void average_gradients(const std::vector<at::Tensor>& params, PhaseRecorder& phases, int64_t step) = 0;
  // The reduction inside the CUDA graph of the step's last forward+backward
  // (Note [Reduction in the graph] in src/engines/gcts/reducer.cpp; GCTS on NCCL only):
  //  - graph_key(): non-empty when this step's reduction can be captured; it
  //    names what the captured work bakes in (strategy, bucket size,
  //    reduction dtype, embodiment slots): a graph captured under another key
  //    must not be replayed for this step.
  //  - prepare_capture(): before the capture, outside it.
  //  - begin_capture() / end_capture(): inside the capture, before the
  //    forward and after the backward (end: the rest is launched, the stream
  //    waits for all of it, the means are where the optimizer reads them).
  //  - graph_replayed(): this step's last micro-batch ran such a graph;
  //    average_gradients() then has nothing left to do. A failed capture
  //    stops the run (the graph runner throws ConfigError naming
  //    gcts.overlap=false): a rank that fell back would launch collectives
  //    its peers replay from a graph.
  // Every rank must capture and replay at the same steps (same keys: the
  // slots are agreed, the plan is the same everywhere).
  virtual std::string graph_key() const { return ""; }
  virtual void prepare_capture() {}
  virtual void begin_capture() {}
  virtual void end_capture() {}
  virtual void graph_replayed() {}
  // The step's exposed communication as the trainer timed it on the device
  // (CUDA events; on NCCL the host only sees launches): monitor-comm shows it.
  virtual void exposed_on_device(int64_t step, double ms) { (void)step, (void)ms; }
  virtual at::Tensor sum_scalar(const at::Tensor& scalar) = 0;
  // "none (1 rank)", "plain (...)": what `status` shows as the strategy.
  virtual std::string strategy() const = 0;
  virtual nlohmann::json comm_status() const = 0;
  // GCTS: "simple" or "hybrid" from the next average_gradients() on; returns
  // {previous, strategy}. The plain reducer refuses (CommError).
  virtual nlohmann::json switch_strategy(const std::string& strategy);
  // GCTS: the plan (buckets, groups, dtype, shards) as JSON; null otherwise.
  virtual nlohmann::json plan() const { return nullptr; }
  // GCTS, on resume: takes back from a checkpoint's plan() what the run
  // changed at runtime (a switch-strategy, a gcts.rebuild_interval re-plan)
  // where the config still says what the saved run was started with; where
  // the config was changed since, the config wins. Same on every rank (they
  // read the same file). Returns what it took (for the log).
  virtual std::string restore_plan(const nlohmann::json& saved) {
    (void)saved;
    return "";
  }
};

// The plain path: one flat fp32 all-reduce of every gradient after backward
// (GradientSync); `world` nullptr means one rank (no communication).
std::unique_ptr<GradientReducer> make_plain_reducer(World* world);

}  // namespace loongforge::comm
