// ShardedAdamW: AdamW on this rank's range of the flat parameter space
// (optimizer.hpp; Note [Flat shards] in comm/shard.hpp).
//
// Note [Gather overlap]
// After the update every rank needs the other ranks' updated ranges before
// its next forward. The all-gather is cut into pieces: piece p carries
// elements [p * q, (p + 1) * q) of every rank's range (q = piece_numel, the
// last piece padded), one collective each, its output laid rank by rank.
// step() updates its segments in flat order, exactly as without pieces (the
// same elementwise ops on the same tensors, so the numbers cannot depend on
// q), copies each updated segment into the send buffer, and launches every
// piece whose part of this rank's range is complete. So the first pieces
// travel while the later segments are being updated. (The fused form updates
// every segment in one multi-tensor call, then launches every piece.)
// Without overlap step()
// then waits for all of them and copies the received ranges into the
// parameters; with overlap it returns with them in flight and
// sync_parameters() does that wait and copy later: the trainer calls it just
// before the next forward (after the next batch is fetched and counted), and
// before a checkpoint reads the parameters. A second step() completes any
// gather left in flight first. On Gloo the pieces run on the backend's
// threads while the trainer thread works; on NCCL on its stream, ordered
// after the update kernels that precede each launch, and the wait is a
// stream dependency (the host does not block). The forward itself cannot
// start before the last piece has arrived: the TorchScript forward gives no
// hook to wait per layer.
//
// Note [Sharded working copies]
// A parameter given with bf16_weight (precision.bf16_weights) becomes a bf16
// working copy, as in FusedAdamW, and every rank keeps its whole fp32 master.
// The master stands in for the parameter wherever the fp32 value is meant
// (value(i)): the update of this rank's range, the send buffer, the received
// ranges of the other ranks, the replicated tensors' update, checkpoints
// (master_weight). So the masters, moments and gathered values are the
// numbers of fp32 weights given the same gradients, bit for bit. Once every
// range is in (sync_parameters(); inside step() at one rank or without
// overlap), each copy is set to its master rounded to nearest even. The
// copies' gradients are fp32 (Note [fp32 gradients of bf16 copies] in
// fused_adamw.cpp): a sharded one's .grad is its view into the flat buffer
// (Note [Gradient views]) or, without views, a kept fp32 tensor, as is a
// replicated one's; autograd adds each backward's bf16 gradient into it.
// Keeping whole masters costs 4 bytes per copied element on every rank, what
// fp32 weights cost; the gather stays fp32. No CUDA kernel of ours: the
// update is AdamW's own (op for op or ATen's fused), on the masters.
//
// Note [Borrowed gather buffers]
// At several ranks the all-gather needs a send buffer (this rank's range,
// pieces x q) and a receive buffer (every rank's range of every piece,
// pieces x world x q: as large as all sharded parameters). Both borrow
// gradient memory that is idle from the update until the next backward:
// - the send buffer IS the gradient shard (padded to pieces x q): the
//   update of a segment reads its gradient, then its updated values
//   overwrite that same range, which nothing reads again this step;
// - with gradient views the receive buffer lies in the flat gradient
//   buffer's storage (shard().local, allocated large enough for both): the
//   reducer has read `local` by the time the update starts.
// So the gradients are zeroed only once the gathers are complete: by
// step() without overlap, by sync_parameters() with it (which the trainer
// calls before the next forward; a step() whose backward came before it is
// refused); zero_grad() completes the gathers first.
// At one rank nothing is sent or received. What remains of its own is the
// gradient shard: 4 bytes per sharded element / world (without views, the
// receive buffer too: 4 bytes per sharded element).
#include <algorithm>  // std::min, std::max, std::upper_bound
#include <chrono>     // std::chrono
#include <cmath>      // std::pow, std::sqrt
#include <stdexcept>  // std::logic_error

#include <ATen/ATen.h>  // at::zeros, at::linalg_vector_norm

#include "loongforge/comm/world.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/engines/gcts/sharded_adamw.hpp"

namespace loongforge::gcts {

using optim::AdamWOptions;
using optim::NamedTensorList;
using optim::OptimizedParam;
using optim::Optimizer;

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
                           int64_t tiny_numel, ShardedOptions sharded)
    : opt_(options), world_(world), fused_(sharded.fused), overlap_gather_(sharded.overlap_gather && world != nullptr) {
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
  if (fused_) {
    const auto scalar = params.empty() ? at::TensorOptions().dtype(at::kFloat)
                                       : params.front().tensor.options().dtype(at::kFloat);
    for (size_t i = 0; i < params.size(); ++i) device_steps_.push_back(at::zeros({}, scalar));
    lr_ = at::zeros({}, scalar);
    found_inf_ = at::zeros({}, scalar);
  }
  const int64_t world_size = world ? world->size() : 1, rank = world ? world->rank() : 0;
  target_.layout = comm::ShardLayout::make(numels, tiny_numel, world_size, rank);
  const auto opts = params.empty() ? at::TensorOptions().dtype(at::kFloat)
                                   : params.front().tensor.options().dtype(at::kFloat);
  const comm::ShardLayout& l = target_.layout;
  if (world_) plan_pieces(sharded.gather_piece_numel);
  const int64_t send = static_cast<int64_t>(receive_.size()) * piece_q_, receive = l.world * send;
  const c10::Device comm_device = world_ ? world_->device() : opts.device();
  // Note [Borrowed gather buffers]: at several ranks on the parameters' device, the gathers borrow
  // the gradient memory (on Gloo with GPU parameters the collectives need host buffers of their own).
  lend_grads_ = world_ && l.world > 1 && comm_device == opts.device();
  at::Tensor flat, shard;  // the gradients' memory: the flat buffer and the shard, large enough for what they lend
  if (sharded.gradient_views) {
    flat = at::zeros({std::max(l.world * l.chunk, lend_grads_ ? receive : 0)}, opts);
    target_.local = flat.narrow(0, 0, l.world * l.chunk);
    install_gradient_views();
  }
  // One rank: the optimizer's range is the whole flat space (chunk = total).
  if (target_.local.defined() && l.world == 1) {
    target_.grad = target_.local;
  } else {
    shard = at::zeros({std::max(l.chunk, lend_grads_ ? send : 0)}, opts);
    target_.grad = shard.narrow(0, 0, l.chunk);
  }
  exp_avg_ = at::zeros({l.owned()}, opts);
  exp_avg_sq_ = at::zeros({l.owned()}, opts);
  for (size_t i : l.replicated)
    replicated_[i] = {at::zeros_like(params_[i], at::MemoryFormat::Contiguous),
                      at::zeros_like(params_[i], at::MemoryFormat::Contiguous)};
  if (world_) {
    const auto dev = opts.device(comm_device);
    send_ = lend_grads_ ? shard.narrow(0, 0, send) : at::zeros({send}, dev);
    gathered_ = lend_grads_ && flat.defined() ? flat.narrow(0, 0, receive) : at::zeros({receive}, dev);
  }
  target_.gather_overlap = overlap_gather_;
  target_.gather_calls = static_cast<int64_t>(receive_.size());
  // Note [Sharded working copies]
  masters_.resize(params.size());
  std::vector<bool> viewed(params.size(), false);
  if (target_.local.defined())
    for (size_t i : l.sharded) viewed[i] = true;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].bf16_weight) continue;
    masters_[i] = params_[i].detach().clone(at::MemoryFormat::Contiguous);
    params_[i].set_data(params_[i].detach().to(at::kBFloat16));  // the module's parameter: its forward now reads bf16
    if (!viewed[i]) params_[i].mutable_grad() = at::zeros_like(masters_[i]);  // fp32, kept (zero_grad)
    copies_.push_back(params_[i]), copy_masters_.push_back(masters_[i]);
  }
}

ShardedAdamW::~ShardedAdamW() { wait_out_gathers(); }

// Every all-gather in flight waited for, a failed one too (the buffers outlive the collectives); what they
// received is not used.
void ShardedAdamW::wait_out_gathers() {
  for (auto& p : in_flight_) {
    try {
      p.wait();
    } catch (...) {  // a failed peer: nothing more to deliver
    }
  }
  in_flight_.clear();
}

// Note [Gather overlap]: for each piece, where the other ranks' elements it
// receives belong (this rank's own part is in the parameters already).
void ShardedAdamW::plan_pieces(int64_t piece_numel) {
  const comm::ShardLayout& l = target_.layout;
  if (l.chunk == 0) return;
  piece_q_ = piece_numel > 0 ? std::min(piece_numel, l.chunk) : l.chunk;
  const int64_t pieces = (l.chunk + piece_q_ - 1) / piece_q_;
  receive_.assign(static_cast<size_t>(pieces), {});
  for (int64_t p = 0; p < pieces; ++p)
    for (int64_t r = 0; r < l.world; ++r) {
      if (r == l.rank) continue;
      const int64_t f0 = std::min(l.begin_of(r) + p * piece_q_, l.end_of(r));
      const int64_t f1 = std::min(l.begin_of(r) + (p + 1) * piece_q_, l.end_of(r));
      const int64_t out0 = (p * l.world + r) * piece_q_;  // where f0 lands in gathered_
      // The sharded parameters overlapping [f0, f1): the first is the last one starting at or before f0.
      auto k = static_cast<size_t>(std::upper_bound(l.offsets.begin(), l.offsets.end(), f0) - l.offsets.begin());
      for (k = k > 0 ? k - 1 : 0; k < l.sharded.size() && l.offsets[k] < f1; ++k) {
        const int64_t p0 = l.offsets[k], p1 = p0 + params_[l.sharded[k]].numel();
        const int64_t s0 = std::max(p0, f0), s1 = std::min(p1, f1);
        if (s0 < s1) receive_[static_cast<size_t>(p)].push_back({l.sharded[k], s0 - p0, out0 + (s0 - f0), s1 - s0});
      }
    }
}

void ShardedAdamW::launch_gather(size_t p) {
  const int64_t world = target_.layout.world;
  const auto q = piece_q_, pi = static_cast<int64_t>(p);
  if (in_flight_.empty()) first_launch_ = std::chrono::steady_clock::now();
  in_flight_.push_back(
      world_->all_gather_async(gathered_.narrow(0, pi * world * q, world * q), send_.narrow(0, pi * q, q)));
}

at::Tensor ShardedAdamW::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  const comm::ShardLayout& l = target_.layout;
  if (fused_) {
    // As FusedAdamW: float32 norms on the device, nothing read back.
    std::vector<at::Tensor> grads;
    for (size_t i : l.replicated)
      if (params_[i].grad().defined()) grads.push_back(params_[i].grad());
    at::Tensor sq = at::zeros({1}, found_inf_.options());
    if (l.owned() > 0) sq.add_(at::linalg_vector_norm(target_.grad.narrow(0, 0, l.owned()), 2).square());
    if (world_) {
      std::vector<at::Tensor> t = {sq.to(world_->device())};
      world_->allreduce_sum(t);
      sq = t[0].to(found_inf_.device());
    }
    if (!grads.empty()) sq.add_(at::stack(at::_foreach_norm(grads, 2)).square().sum());
    const at::Tensor total = sq.sqrt().reshape({});
    if (max_norm > 0) {
      const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
      target_.grad.mul_(coef);
      if (!grads.empty()) at::_foreach_mul_(grads, coef);
    }
    found_inf_.copy_(at::logical_not(at::isfinite(total)));
    return total;
  }
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
  // Note [Borrowed gather buffers]: the backward since the last step wrote into memory the gathers still held.
  if (lent_)
    throw std::logic_error("ShardedAdamW::step: the previous step's all-gathers still hold the gradients' memory; "
                           "call sync_parameters() before the next backward");
  sync_parameters();  // a previous step's gathers, if nobody completed them (none borrow then)
  const comm::ShardLayout& l = target_.layout;
  // Note [Gather overlap]: a piece goes out once this rank's part of it is updated.
  size_t next = 0;
  auto launch_complete = [&](int64_t updated) {
    while (world_ && next < receive_.size() &&
           std::min(static_cast<int64_t>(next + 1) * piece_q_, l.owned()) <= updated)
      launch_gather(next++);
  };
  if (fused_) {  // one multi-tensor update of everything, then every piece
    fused_update(lr);
    if (world_)
      for (const auto& s : l.segments)
        send_.narrow(0, s.shard_offset, s.numel)
            .copy_(flat_view(value(s.param), names_[s.param]).narrow(0, s.param_offset, s.numel));
    launch_complete(l.owned());
    copies_stale_ = !copies_.empty();
    if (!overlap_gather_) sync_parameters();
    clear_gradients();
    return;
  }
  for (auto& n : steps_) n += 1;  // every parameter has a (possibly zero) averaged gradient
  launch_complete(0);
  for (const auto& s : l.segments) {
    const double wd = decay_[s.param] ? opt_.weight_decay : 0.0;
    at::Tensor piece = flat_view(value(s.param), names_[s.param]).narrow(0, s.param_offset, s.numel);
    adamw_piece(piece, target_.grad.narrow(0, s.shard_offset, s.numel), exp_avg_.narrow(0, s.shard_offset, s.numel),
                exp_avg_sq_.narrow(0, s.shard_offset, s.numel), steps_[s.param], lr, wd, opt_);
    if (world_) send_.narrow(0, s.shard_offset, s.numel).copy_(piece);
    launch_complete(s.shard_offset + s.numel);
  }
  launch_complete(l.owned());
  for (auto& [i, mv] : replicated_) {
    const at::Tensor& g = params_[i].grad();
    adamw_piece(value(i), g.defined() ? g : at::zeros_like(value(i)), mv.first, mv.second, steps_[i], lr,
                decay_[i] ? opt_.weight_decay : 0.0, opt_);
  }
  copies_stale_ = !copies_.empty();
  if (!overlap_gather_) sync_parameters();
  clear_gradients();
}

// The fused form of the update (FusedAdamW::update's calls) on this rank's
// segments and the replicated tensors. Every parameter's counter advances,
// segment here or not (the op-for-op form counts them all too), unless the
// norm was non-finite.
void ShardedAdamW::fused_update(double lr) {
  const comm::ShardLayout& l = target_.layout;
  lr_.fill_(lr);
  at::_foreach_add_(device_steps_, 1);
  for (const bool decay : {true, false}) {
    std::vector<at::Tensor> p, g, m, v, s;
    for (const auto& seg : l.segments) {
      if (decay_[seg.param] != decay) continue;
      p.push_back(flat_view(value(seg.param), names_[seg.param]).narrow(0, seg.param_offset, seg.numel));
      g.push_back(target_.grad.narrow(0, seg.shard_offset, seg.numel));
      m.push_back(exp_avg_.narrow(0, seg.shard_offset, seg.numel));
      v.push_back(exp_avg_sq_.narrow(0, seg.shard_offset, seg.numel));
      s.push_back(device_steps_[seg.param]);
    }
    for (auto& [i, mv] : replicated_) {
      if (decay_[i] != decay) continue;
      p.push_back(value(i));
      g.push_back(params_[i].grad().defined() ? params_[i].grad() : at::zeros_like(value(i)));
      m.push_back(mv.first), v.push_back(mv.second), s.push_back(device_steps_[i]);
    }
    if (p.empty()) continue;
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr_, opt_.beta1, opt_.beta2,
                      decay ? opt_.weight_decay : 0.0, opt_.eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/c10::nullopt, found_inf_);
  }
  at::_foreach_add_(device_steps_, found_inf_, -1);  // a skipped update does not count (as FusedAdamW)
}

void ShardedAdamW::sync_parameters() {
  if (in_flight_.empty()) return round_copies();  // one rank, or nothing launched since
  at::NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  auto last = first_launch_;
  target_.gather_spans.clear();
  for (size_t p = 0; p < in_flight_.size(); ++p) {
    in_flight_[p].wait();
    target_.gather_spans.push_back(in_flight_[p].span());
    last = std::max(last, in_flight_[p].finished_at());
    for (const Copy& c : receive_[p])
      flat_view(value(c.param), names_[c.param])
          .narrow(0, c.param_offset, c.numel)
          .copy_(gathered_.narrow(0, c.buffer_offset, c.numel));
  }
  in_flight_.clear();
  round_copies();
  if (lent_) zero_lent();  // Note [Borrowed gather buffers]: the gradients' memory is theirs again
  const auto now = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  target_.gather_bytes = static_cast<double>(gathered_.numel() * 4);
  target_.gather_ms = ms(first_launch_, last);
  // Without overlap the trainer waited for all of it inside step().
  target_.gather_exposed_ms = overlap_gather_ ? ms(t0, now) : ms(first_launch_, now);
}

// Note [Sharded working copies]: every range is in; each copy becomes its master rounded.
void ShardedAdamW::round_copies() {
  if (!copies_stale_) return;
  at::NoGradGuard no_grad;
  at::_foreach_copy_(copies_, copy_masters_);  // fp32 -> bf16: round to nearest even, as Tensor.to
  copies_stale_ = false;
}

at::Tensor ShardedAdamW::master_weight(const at::Tensor& param) const {
  const size_t i = optim::index_of(params_, param);
  return i < params_.size() ? value(i) : param;
}

void ShardedAdamW::load_weight(const at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  const size_t i = optim::index_of(params_, param);
  if (i == params_.size() || !masters_[i].defined()) return Optimizer::load_weight(param, value);
  masters_[i].copy_(value);
  params_[i].copy_(masters_[i]);
}

Optimizer::WorkingCopies ShardedAdamW::working_copies() const {
  WorkingCopies w = optim::count_copies(masters_);
  w.fp32_gradients = w.count > 0;
  return w;
}

// Note [Gradient views] in comm/shard.hpp: each sharded parameter's .grad
// becomes its range of the flat buffer (again, where a runner replaced it).
void ShardedAdamW::install_gradient_views() {
  const comm::ShardLayout& l = target_.layout;
  for (size_t k = 0; k < l.sharded.size(); ++k) {
    at::Tensor& p = params_[l.sharded[k]];
    if (target_.is_view_grad(k, p.grad())) continue;
    p.mutable_grad() = target_.local.narrow(0, l.offsets[k], p.numel()).view(p.sizes());
  }
}

int64_t ShardedAdamW::abandon_gathers() {
  const auto n = static_cast<int64_t>(in_flight_.size());
  wait_out_gathers();
  if (lent_) zero_lent();
  return n;
}

void ShardedAdamW::zero_grad() {
  sync_parameters();  // Note [Borrowed gather buffers]: gathers in flight write into the gradients' memory
  clear_gradients();
}

void ShardedAdamW::zero_lent() {
  target_.grad.zero_();
  if (target_.local.defined() && !target_.local.is_same(target_.grad)) target_.local.zero_();
  lent_ = false;
}

// zero_grad() without completing the gathers: the memory they borrow is
// zeroed by sync_parameters() once they are done.
void ShardedAdamW::clear_gradients() {
  lent_ = lend_grads_ && !in_flight_.empty();
  if (!lent_) zero_lent();
  if (target_.local.defined()) install_gradient_views();
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (target_.local.defined() && !replicated_.count(i)) continue;  // a view, zeroed above
    at::Tensor& p = params_[i];
    if (!keep_grads_ && !masters_[i].defined())  // a working copy's fp32 gradient is kept
      p.mutable_grad() = at::Tensor();
    else if (p.grad().defined())
      grads.push_back(p.grad());
  }
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

NamedTensorList ShardedAdamW::replicated_state() const {
  NamedTensorList out;
  for (const auto& [i, mv] : replicated_) {
    out.emplace_back(names_[i] + ".exp_avg", mv.first);
    out.emplace_back(names_[i] + ".exp_avg_sq", mv.second);
  }
  return out;
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t n = static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes());
  for (const auto& [i, mv] : replicated_) n += static_cast<int64_t>(mv.first.nbytes() + mv.second.nbytes());
  return n;
}

// Every memory block once (Note [Borrowed gather buffers]: the buffers may
// share one), less the flat gradient buffer's own elements: they are the
// gradients (at one rank with gradient views the shard is that buffer).
int64_t ShardedAdamW::buffer_bytes() const {
  int64_t n = 4 * optim::count_copies(masters_).numel;
  std::vector<const void*> seen;
  for (const at::Tensor* t : {&send_, &gathered_, &target_.grad, &target_.local}) {
    if (!t->defined() || std::find(seen.begin(), seen.end(), t->storage().data()) != seen.end()) continue;
    seen.push_back(t->storage().data());
    n += static_cast<int64_t>(t->storage().nbytes());
  }
  return target_.local.defined() ? n - static_cast<int64_t>(target_.local.nbytes()) : n;
}

nlohmann::json ShardedAdamW::state_json() const {
  nlohmann::json steps = nlohmann::json::object(), sharded = nlohmann::json::array();
  std::vector<int64_t> counts = steps_;
  if (fused_ && !device_steps_.empty()) {
    const at::Tensor all = at::stack(device_steps_).to(at::kCPU);  // one copy for every counter (checkpoints only)
    const float* v = all.data_ptr<float>();
    for (size_t i = 0; i < counts.size(); ++i) counts[i] = static_cast<int64_t>(v[i]);
  }
  for (size_t i = 0; i < params_.size(); ++i) steps[names_[i]] = counts[i];
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
  for (size_t i = 0; i < params_.size(); ++i) {
    steps_[i] = steps.value(names_[i], int64_t{0});
    if (fused_) device_steps_[i].fill_(static_cast<double>(steps_[i]));
  }
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

}  // namespace loongforge::gcts
