// ShardedAdamW: AdamW on this rank's range of the flat parameter space
// (optimizer.hpp; Note [Flat shards] in comm/shard.hpp).
#include <chrono>  // std::chrono
#include <cmath>   // std::pow, std::sqrt

#include <ATen/ATen.h>  // at::zeros, at::linalg_vector_norm

#include "loongforge/comm/world.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/trainer/optimizer.hpp"

namespace loongforge::trainer {

namespace {
// The same op sequence as AdamW::step (docs/training-semantics.md s5) on one
// piece: elementwise, so a piece of a tensor gets the numbers the whole would.
void adamw_piece(at::Tensor p, const at::Tensor& g, at::Tensor m, at::Tensor v, int64_t step, double lr, double wd,
                 const AdamWOptions& o) {
  p.mul_(1 - lr * wd);
  m.lerp_(g, 1 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  const at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(o.eps);
  p.addcdiv_(m, denom, -(lr / bc1));
}

at::Tensor flat_view(const at::Tensor& t, const std::string& name) {
  if (!t.is_contiguous())
    throw ConfigError("gcts.shard_optimizer needs contiguous parameters; '" + name +
                      "' is not (set gcts.shard_optimizer=false)");
  return t.view({-1});
}
}  // namespace

ShardedAdamW::ShardedAdamW(const std::vector<OptimizedParam>& params, AdamWOptions options, comm::World* world,
                           int64_t tiny_numel)
    : opt_(options), world_(world) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> numels;
  for (const auto& p : params) {
    names_.push_back(p.name);
    params_.push_back(p.tensor);
    decay_.push_back(p.decay);
    numels.push_back(p.tensor.numel());
    if (p.tensor.scalar_type() != at::kFloat)
      throw ConfigError("gcts.shard_optimizer keeps fp32 state for fp32 parameters; '" + p.name + "' is " +
                        std::string(c10::toString(p.tensor.scalar_type())) + " (set gcts.shard_optimizer=false)");
  }
  steps_.assign(params.size(), 0);
  const int64_t world_size = world ? world->size() : 1, rank = world ? world->rank() : 0;
  target_.layout = comm::ShardLayout::make(numels, tiny_numel, world_size, rank);
  const auto opts = params.empty() ? at::TensorOptions().dtype(at::kFloat) : params.front().tensor.options();
  const comm::ShardLayout& l = target_.layout;
  target_.grad = at::zeros({l.chunk}, opts);
  exp_avg_ = at::zeros({l.owned()}, opts);
  exp_avg_sq_ = at::zeros({l.owned()}, opts);
  for (size_t i : l.replicated)
    replicated_[i] = {at::zeros_like(params_[i], at::MemoryFormat::Contiguous),
                      at::zeros_like(params_[i], at::MemoryFormat::Contiguous)};
  if (world_) {
    const auto dev = opts.device(world_->device());
    send_ = at::zeros({l.chunk}, dev);
    gathered_ = at::zeros({l.chunk * l.world}, dev);
  }
}

at::Tensor ShardedAdamW::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  const comm::ShardLayout& l = target_.layout;
  const auto f64 = target_.grad.options().dtype(at::kDouble);
  // Squared norm of this rank's range, summed over ranks, plus the replicated tensors' (equal on every rank).
  at::Tensor sharded = at::zeros({1}, f64);
  if (l.owned() > 0) sharded.add_(target_.grad.narrow(0, 0, l.owned()).to(at::kDouble).square().sum());
  if (world_) {
    std::vector<at::Tensor> t = {sharded.to(world_->device())};
    world_->allreduce_sum(t);
    sharded = t[0].to(f64.device());
  }
  at::Tensor sq = sharded.reshape({});
  for (size_t i : l.replicated)
    if (params_[i].grad().defined()) sq = sq + params_[i].grad().to(at::kDouble).square().sum();
  const at::Tensor total = sq.sqrt().to(at::kFloat);
  if (max_norm > 0) {
    // The same expression as clip_grad_norm (optimizer.cpp).
    const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
    target_.grad.mul_(coef);
    for (size_t i : l.replicated)
      if (params_[i].grad().defined()) params_[i].grad().mul_(coef);
  }
  return total;
}

void ShardedAdamW::step(double lr) {
  at::NoGradGuard no_grad;
  const comm::ShardLayout& l = target_.layout;
  for (auto& n : steps_) n += 1;  // every parameter has a (possibly zero) averaged gradient
  for (const auto& s : l.segments) {
    const double wd = decay_[s.param] ? opt_.weight_decay : 0.0;
    adamw_piece(flat_view(params_[s.param], names_[s.param]).narrow(0, s.param_offset, s.numel),
                target_.grad.narrow(0, s.shard_offset, s.numel), exp_avg_.narrow(0, s.shard_offset, s.numel),
                exp_avg_sq_.narrow(0, s.shard_offset, s.numel), steps_[s.param], lr, wd, opt_);
  }
  for (auto& [i, mv] : replicated_) {
    at::Tensor& p = params_[i];
    const at::Tensor g = p.grad().defined() ? p.grad() : at::zeros_like(p);
    adamw_piece(p, g, mv.first, mv.second, steps_[i], lr, decay_[i] ? opt_.weight_decay : 0.0, opt_);
  }
  all_gather_parameters();
  zero_grad();
}

void ShardedAdamW::all_gather_parameters() {
  if (!world_) return;  // one rank: every parameter was updated in place
  const auto t0 = std::chrono::steady_clock::now();
  const comm::ShardLayout& l = target_.layout;
  for (const auto& s : l.segments)
    send_.narrow(0, s.shard_offset, s.numel)
        .copy_(flat_view(params_[s.param], names_[s.param]).narrow(0, s.param_offset, s.numel));
  world_->all_gather_async(gathered_, send_).wait();
  for (size_t k = 0; k < l.sharded.size(); ++k) {
    const size_t i = l.sharded[k];
    flat_view(params_[i], names_[i]).copy_(gathered_.narrow(0, l.offsets[k], params_[i].numel()));
  }
  target_.gather_bytes = static_cast<double>(gathered_.numel() * 4);
  target_.gather_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void ShardedAdamW::zero_grad() {
  target_.grad.zero_();
  if (!keep_grads_) {
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
    return;
  }
  std::vector<at::Tensor> grads;
  for (auto& p : params_)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (!grads.empty()) at::_foreach_zero_(grads);
}

NamedTensorList ShardedAdamW::state_tensors() const {
  NamedTensorList out = {{"shard.exp_avg", exp_avg_}, {"shard.exp_avg_sq", exp_avg_sq_}};
  if (target_.layout.rank == 0)  // replicated: written once
    for (const auto& [i, mv] : replicated_) {
      out.emplace_back(names_[i] + ".exp_avg", mv.first);
      out.emplace_back(names_[i] + ".exp_avg_sq", mv.second);
    }
  return out;
}

nlohmann::json ShardedAdamW::state_json() const {
  nlohmann::json steps = nlohmann::json::object(), sharded = nlohmann::json::array();
  for (size_t i = 0; i < params_.size(); ++i) steps[names_[i]] = steps_[i];
  const comm::ShardLayout& l = target_.layout;
  for (size_t i : l.sharded) sharded.push_back({names_[i], params_[i].numel()});
  return {{"optimizer", "adamw"},
          {"steps", steps},
          {"sharded", {{"world", l.world}, {"total", l.total}, {"chunk", l.chunk}, {"params", sharded},
                       {"files", "optimizer/rank_RRRRR.safetensors: shard.exp_avg and shard.exp_avg_sq of "
                                 "[r * chunk, min((r + 1) * chunk, total)) of the sharded parameters laid end to end; "
                                 "rank 0 also holds <name>.exp_avg(_sq) of the other (replicated) parameters"}}}};
}

void ShardedAdamW::load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json) {
  at::NoGradGuard no_grad;
  const nlohmann::json& steps = json.at("steps");
  auto find = [&](size_t i, const char* what) -> const at::Tensor* {
    const auto it = tensors.find(names_[i] + what);
    if (it != tensors.end()) return &it->second;
    if (steps_[i] != 0)
      throw CheckpointError("optimizer state '" + names_[i] + what + "' is missing but its step count is " +
                            std::to_string(steps_[i]));
    return nullptr;
  };
  for (size_t i = 0; i < params_.size(); ++i) steps_[i] = steps.value(names_[i], int64_t{0});
  exp_avg_.zero_(), exp_avg_sq_.zero_();
  for (const auto& s : target_.layout.segments) {
    const at::Tensor* a = find(s.param, ".exp_avg");
    const at::Tensor* b = find(s.param, ".exp_avg_sq");
    if (a) exp_avg_.narrow(0, s.shard_offset, s.numel).copy_(a->reshape({-1}).narrow(0, s.param_offset, s.numel));
    if (b) exp_avg_sq_.narrow(0, s.shard_offset, s.numel).copy_(b->reshape({-1}).narrow(0, s.param_offset, s.numel));
  }
  for (auto& [i, mv] : replicated_) {
    const at::Tensor* a = find(i, ".exp_avg");
    const at::Tensor* b = find(i, ".exp_avg_sq");
    a ? (void)mv.first.copy_(a->reshape(mv.first.sizes())) : (void)mv.first.zero_();
    b ? (void)mv.second.copy_(b->reshape(mv.second.sizes())) : (void)mv.second.zero_();
  }
}

}  // namespace loongforge::trainer
