// FusedAdamW: AdamW through ATen's multi-tensor kernels (optimizer.hpp).
#include <ATen/ATen.h>  // at::_fused_adamw_, at::_foreach_norm, at::_foreach_mul_

#include "loongforge/common/error.hpp"
#include "loongforge/trainer/optimizer.hpp"

namespace loongforge::trainer {

FusedAdamW::FusedAdamW(const std::vector<OptimizedParam>& params, AdamWOptions options)
    : AdamWBase(params, options) {
  for (const auto& p : params) {
    const auto& first = params.front();
    if (p.tensor.device() != first.tensor.device() || p.tensor.scalar_type() != first.tensor.scalar_type())
      throw ConfigError("optimizer.implementation=fused needs every trainable parameter on one device in one dtype: '" +
                        first.name + "' is " + first.tensor.toString() + " on " + first.tensor.device().str() + ", '" +
                        p.name + "' is " + p.tensor.toString() + " on " + p.tensor.device().str() +
                        "; use optimizer.implementation=plain");
    steps_.push_back(at::zeros({}, p.tensor.options().dtype(at::kFloat)));
  }
  const auto scalar = params.empty() ? at::TensorOptions().dtype(at::kFloat)
                                     : params.front().tensor.options().dtype(at::kFloat);
  lr_ = at::zeros({}, scalar);
  found_inf_ = at::zeros({}, scalar);
}

at::Tensor FusedAdamW::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params_)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) {
    found_inf_.zero_();
    return at::zeros_like(found_inf_);
  }
  const at::Tensor total = at::linalg_vector_norm(at::stack(at::_foreach_norm(grads, 2)), 2);
  if (max_norm > 0) at::_foreach_mul_(grads, at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0));
  found_inf_.copy_(at::logical_not(at::isfinite(total)));
  return total;
}

void FusedAdamW::step(double lr) {
  set_lr(lr);
  update();
  zero_grad();
}

void FusedAdamW::set_lr(double lr) { lr_.fill_(lr); }

void FusedAdamW::update() {
  at::NoGradGuard no_grad;
  for (const bool decay : {true, false}) {
    std::vector<at::Tensor> p, g, m, v, s;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (decay_[i] != decay || !params_[i].grad().defined()) continue;
      p.push_back(params_[i]), g.push_back(params_[i].grad()), m.push_back(exp_avg_[i]);
      v.push_back(exp_avg_sq_[i]), s.push_back(steps_[i]);
    }
    if (p.empty()) continue;
    at::_foreach_add_(s, 1);
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr_, opt_.beta1, opt_.beta2,
                      decay ? opt_.weight_decay : 0.0, opt_.eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/c10::nullopt, found_inf_);
    at::_foreach_add_(s, found_inf_, -1);  // a skipped update does not count (torch.optim does the same)
  }
}

std::vector<int64_t> FusedAdamW::step_counts() const {
  std::vector<int64_t> out;
  if (steps_.empty()) return out;
  const at::Tensor all = at::stack(steps_).to(at::kCPU);  // one copy for every counter
  const float* v = all.data_ptr<float>();
  for (int64_t i = 0; i < all.numel(); ++i) out.push_back(static_cast<int64_t>(v[i]));
  return out;
}

void FusedAdamW::set_step_count(size_t i, int64_t n) { steps_[i].fill_(static_cast<double>(n)); }

}  // namespace loongforge::trainer
