// loongforge/comm/reducer.hpp — the gradient-communication seam of the
// trainer. GCTS (docs/architecture.md s4: bucketed, overlapped, sharded) replaces the
// plain implementation here; the trainer's step does not change.
//
// Contract:
//  - One reducer per rank, owned by the trainer thread; every rank calls the
//    same methods in the same order each step (c10d's rule).
//  - sum_counts() sums a host integer over ranks before backward (the step's
//    valid action elements, docs/training-semantics.md s5); one rank: itself.
//  - average_gradients() leaves every parameter's .grad equal to the mean of
//    the ranks' gradients (a rank without a gradient for a parameter
//    contributes zeros). One rank: nothing to do.
//  - sum_scalar() sums a device scalar over ranks without reading it on the
//    host (the logged loss); one rank: returns it unchanged.
//  - Phase "comm/all-reduce" goes to the PhaseRecorder; comm_status() is what
//    `monitor-comm` shows (bytes, time, bandwidths per group) or null when
//    there is no communication.
//  - engine() is GCTS's record (common/engine.hpp).
//
// Example:
//   auto reducer = make_plain_reducer(world.get());   // nullptr: one rank
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

#include "loongforge/comm/world.hpp"
#include "loongforge/common/engine.hpp"
#include "loongforge/common/phases.hpp"
#include "loongforge/config/config.hpp"

namespace loongforge::comm {

constexpr bool kGctsBuilt = false;  // the GCTS engine is not in this build yet

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
};

// The plain path: one flat fp32 all-reduce of every gradient after backward
// (GradientSync); `world` nullptr means one rank (no communication).
std::unique_ptr<GradientReducer> make_plain_reducer(World* world);

Engine engine(const config::Config& cfg);

}  // namespace loongforge::comm
