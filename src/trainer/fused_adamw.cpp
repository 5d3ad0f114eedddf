// FusedAdamW: AdamW through ATen's multi-tensor kernels (optimizer.hpp).
#include <ATen/ATen.h>  // at::_fused_adamw_, at::_foreach_norm, at::_foreach_mul_

#include "loongforge/common/error.hpp"
#include "loongforge/trainer/optimizer.hpp"

namespace loongforge::trainer {

FusedAdamW::FusedAdamW(const std::vector<OptimizedParam>& params, AdamWOptions options) : opt_(options) {
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    const auto& first = params.front();
    if (p.tensor.device() != first.tensor.device() || p.tensor.scalar_type() != first.tensor.scalar_type())
      throw ConfigError("optimizer.implementation=fused needs every trainable parameter on one device in one dtype: '" +
                        first.name + "' is " + first.tensor.toString() + " on " + first.tensor.device().str() + ", '" +
                        p.name + "' is " + p.tensor.toString() + " on " + p.tensor.device().str() +
                        "; use optimizer.implementation=plain");
    names_.push_back(p.name);
    params_.push_back(p.tensor);
    exp_avg_.push_back(at::zeros_like(p.tensor, at::MemoryFormat::Preserve));
    exp_avg_sq_.push_back(at::zeros_like(p.tensor, at::MemoryFormat::Preserve));
    steps_.push_back(at::zeros({}, p.tensor.options().dtype(at::kFloat)));
    decay_.push_back(p.decay);
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
  at::NoGradGuard no_grad;
  lr_.fill_(lr);
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
  zero_grad();
}

void FusedAdamW::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

NamedTensorList FusedAdamW::state_tensors() const {
  NamedTensorList out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(names_[i] + ".exp_avg", exp_avg_[i]);
    out.emplace_back(names_[i] + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

nlohmann::json FusedAdamW::state_json() const {
  // The step counters are read here only, when a checkpoint is written.
  const at::Tensor all = at::stack(steps_).to(at::kCPU);
  nlohmann::json steps = nlohmann::json::object();
  for (size_t i = 0; i < params_.size(); ++i) steps[names_[i]] = static_cast<int64_t>(all[i].item<float>());
  return {{"optimizer", "adamw"}, {"steps", steps}};
}

void FusedAdamW::load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json) {
  at::NoGradGuard no_grad;
  const nlohmann::json& steps = json.at("steps");
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = steps.value(names_[i], int64_t{0});
    steps_[i].fill_(static_cast<double>(n));
    const auto a = tensors.find(names_[i] + ".exp_avg"), b = tensors.find(names_[i] + ".exp_avg_sq");
    if (a == tensors.end() || b == tensors.end()) {
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

}  // namespace loongforge::trainer
