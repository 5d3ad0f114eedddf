// loongforge/trainer/optimizer.hpp — AdamW, schedule and clipping exactly as
// docs/training-semantics.md s5 states them (the reference trainer uses
// torch.optim.AdamW's single-tensor path; this is the same op sequence).
//
// Contract:
//  - Two groups: the parameters whose flag in `decay` is set (params.json
//    "decay", decided by scripts/model/n16.py) decay, the others do not.
//  - step(lr) updates every parameter that has a gradient, then sets
//    gradients to undefined (set_to_none).
//  - State (exp_avg, exp_avg_sq, step) lives next to each parameter, same
//    device and dtype; exposed for checkpoints.
//  - Single-threaded: called from the trainer thread only.
#pragma once

#include <cstdint>  // int64_t
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

namespace loongforge::trainer {

struct AdamWOptions {
  double beta1 = 0.95, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-5;
};

class AdamW {
 public:
  // decay[i]: whether params[i] takes weight decay (same length as params).
  AdamW(std::vector<at::Tensor> params, const std::vector<bool>& decay, AdamWOptions options);
  void step(double lr);
  void zero_grad();

  struct State {
    at::Tensor exp_avg, exp_avg_sq;
    int64_t step = 0;
    bool decay = true;
  };
  const std::vector<at::Tensor>& params() const { return params_; }
  std::vector<State>& state() { return state_; }

 private:
  std::vector<at::Tensor> params_;
  std::vector<State> state_;
  AdamWOptions opt_;
};

// The learning rate of 0-based step s (HF get_*_schedule_with_warmup).
struct Schedule {
  double peak_lr = 1e-4;
  int64_t total_steps = 1;
  int64_t warmup_steps = 0;  // already resolved from warmup_ratio
  double min_lr_ratio = 0;
  enum class Kind { Cosine, Linear, Constant } kind = Kind::Cosine;
  double lr_at(int64_t s) const;
};

// Global L2 norm of the gradients (before clipping); scales them so the norm
// is at most max_norm when max_norm > 0. Returns the norm as a double.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace loongforge::trainer
