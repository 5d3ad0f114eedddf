// AdamW, the warmup schedule and gradient clipping (training-semantics s5).
#include "loongforge/optim/optimizer.hpp"

#include <cmath>  // std::pow, std::sqrt, std::cos

#include <ATen/ATen.h>  // at::linalg_vector_norm, at::stack

#include "loongforge/common/error.hpp"

namespace loongforge::optim {

AdamWBase::AdamWBase(const std::vector<OptimizedParam>& params, AdamWOptions options) : opt_(options) {
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    names_.push_back(p.name);
    params_.push_back(p.tensor);
    exp_avg_.push_back(at::zeros_like(p.tensor, at::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(at::zeros_like(p.tensor, at::MemoryFormat::Preserve));
    decay_.push_back(p.decay);
  }
}

void AdamWBase::zero_grad() {
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!keep_grads_ && !keeps_gradient(i))
      params_[i].mutable_grad() = at::Tensor();
    else if (params_[i].grad().defined())
      grads.push_back(params_[i].grad());
  }
  if (!grads.empty()) at::_foreach_zero_(grads);  // in place: the CUDA graphs (or autograd) add into these tensors
}

void Optimizer::load_weight(const at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  param.copy_(value);
}

void refuse_bf16_weights(const std::vector<OptimizedParam>& params, const char* optimizer) {
  for (const auto& p : params)
    if (p.bf16_weight)
      throw ConfigError(std::string("precision.bf16_weights: '") + p.name + "' asks for a bf16 working copy, which only " +
                        "the fused and the sharded AdamW keep (this is " + optimizer + "); set precision.bf16_weights=off");
}

size_t index_of(const std::vector<at::Tensor>& params, const at::Tensor& param) {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return i;
  return params.size();
}

Optimizer::WorkingCopies count_copies(const std::vector<at::Tensor>& masters) {
  Optimizer::WorkingCopies w;
  for (const auto& m : masters)
    if (m.defined()) w.count += 1, w.numel += m.numel();
  return w;
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& [name, t] : state_tensors()) n += static_cast<int64_t>(t.nbytes());
  return n;
}

NamedTensorList AdamWBase::state_tensors() const {
  NamedTensorList out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(names_[i] + ".exp_avg", exp_avg_[i]);
    out.emplace_back(names_[i] + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

nlohmann::json AdamWBase::state_json() const {
  const std::vector<int64_t> counts = step_counts();
  nlohmann::json steps = nlohmann::json::object();
  for (size_t i = 0; i < params_.size(); ++i) steps[names_[i]] = counts[i];
  return {{"optimizer", "adamw"}, {"steps", steps}};
}

void AdamWBase::load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json) {
  at::NoGradGuard no_grad;
  const nlohmann::json& steps = json.at("steps");
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = steps.value(names_[i], int64_t{0});
    set_step_count(i, n);
    const auto a = tensors.find(names_[i] + ".exp_avg"), b = tensors.find(names_[i] + ".exp_avg_sq");
    if (a == tensors.end() || b == tensors.end()) {
      // Checkpoints written before the state was allocated up front leave out
      // the parameters that had not been updated yet.
      if (n != 0)
        throw CheckpointError("optimizer state of '" + names_[i] + "' is missing but its step count is " +
                              std::to_string(n));
      exp_avg_[i].zero_(), exp_avg_sq_[i].zero_();
      continue;
    }
    exp_avg_[i].copy_(a->second);
    exp_avg_sq_[i].copy_(b->second);
  }
}

AdamW::AdamW(const std::vector<OptimizedParam>& params, AdamWOptions options)
    : AdamWBase(params, options), steps_(params.size(), 0) {
  refuse_bf16_weights(params, "the plain AdamW");
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    steps_[i] += 1;
    const double wd = decay_[i] ? opt_.weight_decay : 0.0;
    p.mul_(1 - lr * wd);
    exp_avg_[i].lerp_(g, 1 - opt_.beta1);
    exp_avg_sq_[i].mul_(opt_.beta2).addcmul_(g, g, 1 - opt_.beta2);
    const double bc1 = 1 - std::pow(opt_.beta1, static_cast<double>(steps_[i]));
    const double bc2 = 1 - std::pow(opt_.beta2, static_cast<double>(steps_[i]));
    const at::Tensor denom = (exp_avg_sq_[i].sqrt() / std::sqrt(bc2)).add_(opt_.eps);
    p.addcdiv_(exp_avg_[i], denom, -(lr / bc1));
  }
  zero_grad();
}

at::Tensor AdamW::clip_grad_norm(double max_norm) { return optim::clip_grad_norm(params_, max_norm); }

double Schedule::lr_at(int64_t s) const {
  if (s < warmup_steps) return peak_lr * static_cast<double>(s) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  const double p = static_cast<double>(s - warmup_steps) / static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  double f = 1.0;
  if (kind == Kind::Cosine) f = std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * p)));
  if (kind == Kind::Linear) f = std::max(0.0, 1.0 - p);
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * f);
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(at::linalg_vector_norm(p.grad(), 2));
  if (norms.empty()) return at::zeros({}, params.empty() ? at::TensorOptions() : params.front().options());
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
  if (max_norm > 0) {
    // Python evaluates `max_norm / tensor` as tensor.reciprocal() * max_norm;
    // the same op sequence keeps both trainers bit-identical.
    const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
    for (const auto& p : params)
      if (p.grad().defined()) p.grad().mul_(coef.to(p.grad().device()));
  }
  return total;
}

}  // namespace loongforge::optim
