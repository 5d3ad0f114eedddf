// AdamW, the warmup schedule and gradient clipping (training-semantics s5).
#include "loongforge/trainer/optimizer.hpp"

#include <cmath>   // std::pow, std::sqrt, std::cos
#include <string>  // std::to_string

#include <ATen/ATen.h>  // at::linalg_vector_norm, at::stack

#include "loongforge/common/error.hpp"

namespace loongforge::trainer {

AdamW::AdamW(std::vector<at::Tensor> params, const std::vector<bool>& decay, AdamWOptions options)
    : params_(std::move(params)), opt_(options) {
  if (decay.size() != params_.size())
    throw TrainingError("AdamW: " + std::to_string(decay.size()) + " decay flags for " +
                        std::to_string(params_.size()) + " parameters");
  state_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) state_[i].decay = decay[i];
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    State& s = state_[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = at::zeros_like(p, at::MemoryFormat::Preserve);
      s.exp_avg_sq = at::zeros_like(p, at::MemoryFormat::Preserve);
    }
    s.step += 1;
    const double wd = s.decay ? opt_.weight_decay : 0.0;
    p.mul_(1 - lr * wd);
    s.exp_avg.lerp_(g, 1 - opt_.beta1);
    s.exp_avg_sq.mul_(opt_.beta2).addcmul_(g, g, 1 - opt_.beta2);
    const double bc1 = 1 - std::pow(opt_.beta1, static_cast<double>(s.step));
    const double bc2 = 1 - std::pow(opt_.beta2, static_cast<double>(s.step));
    const at::Tensor denom = (s.exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(opt_.eps);
    p.addcdiv_(s.exp_avg, denom, -(lr / bc1));
  }
  zero_grad();
}

void AdamW::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

double Schedule::lr_at(int64_t s) const {
  if (s < warmup_steps) return peak_lr * static_cast<double>(s) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  const double p = static_cast<double>(s - warmup_steps) / static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  double f = 1.0;
  if (kind == Kind::Cosine) f = std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * p)));
  if (kind == Kind::Linear) f = std::max(0.0, 1.0 - p);
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * f);
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(at::linalg_vector_norm(p.grad(), 2));
  if (norms.empty()) return 0.0;
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
  if (max_norm > 0) {
    // Python evaluates `max_norm / tensor` as tensor.reciprocal() * max_norm;
    // the same op sequence keeps both trainers bit-identical.
    const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(coef.to(p.grad().device()));
  }
  return total.item<double>();
}

}  // namespace loongforge::trainer
