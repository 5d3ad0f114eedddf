// What the StepRunners share (fusion room internal): the bf16 autocast scope,
// the LOONGFORGE_TEST_FAULT hook and one eager forward + backward (the CUDA
// graph helpers are public: loongforge/fusion/cuda_graph.hpp).
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string

#include <ATen/core/Tensor.h>  // at::Tensor

#include "loongforge/common/phases.hpp"
#include "loongforge/fusion/cuda_graph.hpp"
#include "loongforge/model/model.hpp"

namespace loongforge::fusion {

// Turns bf16 autocast on for a scope (CUDA; docs/architecture.md s9).
struct AutocastScope {
  bool on;
  explicit AutocastScope(bool enable);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;
};

// Test hook: LOONGFORGE_TEST_FAULT=<phase>@<step> (phase forward|backward,
// 1-based step) raises libtorch's out-of-memory error there, so the failure
// path (message, final checkpoint, exit status) is testable without a GPU;
// exit:<phase>@<step> ends the process there at once (status 137, as a
// SIGKILL would): a rank lost at a known point (test_fault_tolerance.py).
struct Fault {
  std::string phase;
  int64_t step = -1;
  Fault();
  void maybe_raise(const char* where, int64_t step_1based) const;
};

// Forward of `batch` (its draws seeded with draw_seed: seed_draws), backward
// of w * loss (gradients accumulate into .grad); returns loss * w as a
// float64 device scalar. Phases "forward", "backward".
at::Tensor eager_micro_step(model::Model& net, bool bf16, const Fault& fault, const model::Batch& batch,
                            uint64_t draw_seed, double w, int64_t step, int64_t micro, PhaseRecorder& phases);

}  // namespace loongforge::fusion
