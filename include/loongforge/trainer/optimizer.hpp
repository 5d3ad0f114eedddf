// loongforge/trainer/optimizer.hpp — the update seam of the trainer:
// clipping and the optimizer step, with their checkpoint state. A sharded or
// fused optimizer (GCTS, the fast step) implements Optimizer; AdamW below is
// the plain one, exactly as docs/training-semantics.md s5 states it (the
// reference trainer uses torch.optim.AdamW's single-tensor path; this is the
// same op sequence).
//
// Contract (Optimizer):
//  - params() are the trainable parameters it updates, in params.json order.
//  - clip_grad_norm(max_norm) returns the global L2 norm of the gradients
//    (over every rank's shard where the state is sharded) as a float32 device
//    scalar, before clipping, and scales the gradients so that the norm is at
//    most max_norm when max_norm > 0. It reads nothing back to the host.
//  - step(lr) updates every parameter that has a gradient, then sets the
//    gradients to undefined (set_to_none); zero_grad() only does the latter.
//    After keep_gradients(true) both zero the gradient tensors in place
//    instead (the CUDA-graph StepRunner with kept gradients accumulates into
//    those very tensors; with made gradients it needs the default).
//  - sync_parameters() returns when every parameter holds the value step()
//    gave it (on NCCL: ordered on the current stream). Only ShardedAdamW with
//    overlapped gathers leaves work in flight after step(); the trainer calls
//    it before anything reads the parameters (the next forward, a checkpoint).
//  - state_tensors() names every state tensor ("<param>.exp_avg", ...) on the
//    device, stable in order and shape for the whole run (allocated at
//    construction), so checkpoint buffers can be reserved once;
//    state_json() holds the rest (per-parameter step counts);
//    load_state() restores both from a checkpoint.
//  - master_weight(param) is the tensor holding param's full-precision value
//    (what checkpoints save): a master copy where the optimizer keeps one
//    (the bf16 working copies of FusedAdamW and ShardedAdamW), else param
//    itself. load_weight(param, v) sets that value (and the working copy from
//    it). working_copies() counts them.
//  - state_bytes() is the device (or host) memory of the moments this rank
//    holds: what "optimizer memory per rank" means in the run line and
//    summary.json (a sharded optimizer's communication buffers not included).
//  - buffer_bytes() is the rest of the memory it holds for the whole run on
//    this rank, besides the parameters and their gradients: the fp32 masters
//    of bf16 working copies, and a sharded optimizer's gradient shard (where
//    it is not a view of the gradients) and its all-gather's send and receive
//    buffers where they are not gradient memory they borrow. Run line and
//    summary.json report it next to the moments.
//  - Trainer thread only.
//
// AdamW: two groups from params.json's per-parameter `decay` flag (weights
// decay; biases, norms and 1-D parameters do not).
//
// FusedAdamW: the same update through ATen's multi-tensor kernels
// (`_fused_adamw_`, one launch per group and dtype; `_foreach_norm` and
// `_foreach_mul_` for clipping), with the learning rate and the step counters
// as device tensors. A non-finite gradient norm skips the update on the
// device (found_inf, as recorded by the step's clip_grad_norm(), which must
// come first: the trainer always calls it), so nothing needs to be read back
// first. All parameters on one device in one dtype (ConfigError otherwise).
// Equal to AdamW within float rounding (test/trainer/test_optimizer.cpp), not
// bit for bit. A parameter given with bf16_weight (precision.bf16_weights;
// CUDA builds) becomes a bf16 working copy -- its tensor is set to bf16 in
// place, so the module's forward reads it and backward makes bf16 gradients
// -- and the optimizer keeps its fp32 master: one kernel of this project
// (cuda/trainer/master_adamw.cuh) reads the gradient (bf16; or fp32 with
// CopyGradients::fp32, for several micro-batches or ranks: autograd then sums
// the bf16 gradients into fp32 tensors the copies keep), applies the
// clipping coefficient, updates the master and the moments in ATen's
// arithmetic and writes the rounded master into the copy; clipping takes the
// bf16 gradients' norms in float. The master's update is written in torch
// 2.11's arithmetic (float scalars, fused multiply-adds) and equals what
// `_fused_adamw_` gives the same gradient in fp32 within 1e-6 relative
// (test_trainer_gpu; an older double-scalar form was 1.28e-5 off in the
// moments, docs/benchmarks.md session 40).
//
// ShardedAdamW (GCTS, gcts.shard_optimizer): the same update as AdamW, op for
// op, on this rank's range of the flat parameter space only (Note [Flat
// shards] in comm/shard.hpp): the reducer leaves the averaged gradient of
// that range in shard().grad; step() updates the parameters' pieces in the
// range and all-gathers the updated parameters from every rank, so all ranks
// end the step with equal parameters while each holds 1/world of the moments
// (tiny tensors: replicated, updated everywhere). clip_grad_norm() sums the
// squared norms of every rank's range (one all-reduce of a scalar). Every
// parameter counts as having a gradient each step (as after any multi-rank
// average: a missing one is zeros). state_tensors() are this rank's pieces
// ("shard.exp_avg", "shard.exp_avg_sq": its range; "<name>.exp_avg" of the
// replicated tensors); load_state() takes full per-parameter moments
// ("<name>.exp_avg", as AdamW writes them and as state.cpp assembles them
// from a sharded checkpoint of any world size) and keeps its range.
// With ShardedOptions::overlap_gather the all-gather goes out in pieces
// while step() is still updating, and step() returns with them in flight:
// sync_parameters() completes them (Note [Gather overlap] in
// sharded_adamw.cpp). With ShardedOptions::fused the update of the range and
// of the replicated tensors runs through ATen's multi-tensor kernels as
// FusedAdamW's does (equal to the op-for-op form within float rounding), the
// squared norms are float32 device scalars, and a non-finite norm skips the
// update on the device (skips_nonfinite_on_device()). With
// ShardedOptions::gradient_views (the default) the sharded parameters'
// gradients are views into one flat buffer, shard().local (Note [Gradient
// views] in comm/shard.hpp): they are defined from construction on, and
// step()/zero_grad() zero that buffer instead of dropping them. At several
// ranks the all-gather's buffers borrow the gradients' memory (Note
// [Borrowed gather buffers] in sharded_adamw.cpp): with gathers left in
// flight, step() leaves the gradients to sync_parameters() to zero (so it
// must come before the next backward: a step() before it throws
// std::logic_error), and zero_grad() completes the gathers first.
// A parameter given with bf16_weight becomes a bf16 working copy here too,
// on any device (Note [Sharded working copies] in sharded_adamw.cpp): every
// rank keeps its whole fp32 master, which takes the place of the parameter
// in the update of this rank's range and in the all-gather (fp32), and the
// copy is the master rounded once the gathered values are in; its gradient is
// an fp32 tensor autograd sums into (a view into the flat buffer, or a kept
// tensor of its own).
#pragma once

#include <chrono>   // std::chrono::steady_clock
#include <cstdint>  // int64_t
#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor
#include <nlohmann/json.hpp>   // nlohmann::json

#include "loongforge/comm/shard.hpp"
#include "loongforge/comm/world.hpp"  // comm::Pending

namespace loongforge::trainer {

using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const std::vector<at::Tensor>& params() const = 0;
  virtual at::Tensor clip_grad_norm(double max_norm) = 0;
  virtual void step(double lr) = 0;
  virtual void zero_grad() = 0;
  virtual void keep_gradients(bool keep) = 0;
  virtual void sync_parameters() {}
  // True when step() skips the update on the device after clip_grad_norm()
  // saw a non-finite norm, so the caller need not read the norm first.
  virtual bool skips_nonfinite_on_device() const { return false; }
  virtual NamedTensorList state_tensors() const = 0;
  virtual int64_t state_bytes() const;  // the sum over state_tensors()
  virtual int64_t buffer_bytes() const { return 0; }
  virtual at::Tensor master_weight(const at::Tensor& param) const { return param; }
  virtual void load_weight(const at::Tensor& param, const at::Tensor& value);
  // The bf16 working copies it keeps (precision.bf16_weights): how many, their
  // elements, and whether their gradients are fp32 tensors autograd sums into.
  struct WorkingCopies {
    int64_t count = 0, numel = 0;
    bool fp32_gradients = false;
  };
  virtual WorkingCopies working_copies() const { return {}; }
  virtual nlohmann::json state_json() const = 0;
  virtual void load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json) = 0;
};

struct AdamWOptions {
  double beta1 = 0.95, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-5;
};

// A trainable parameter as the optimizer sees it.
struct OptimizedParam {
  std::string name;
  at::Tensor tensor;
  bool decay = true;
  bool bf16_weight = false;  // FusedAdamW only: a bf16 working copy with an fp32 master
};

// What both AdamW implementations share: the parameters, their moments, the
// decay groups and the checkpoint format (so state moves between them).
class AdamWBase : public Optimizer {
 public:
  const std::vector<at::Tensor>& params() const override { return params_; }
  void zero_grad() override;
  void keep_gradients(bool keep) override { keep_grads_ = keep; }
  NamedTensorList state_tensors() const override;
  nlohmann::json state_json() const override;
  void load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json) override;

 protected:
  AdamWBase(const std::vector<OptimizedParam>& params, AdamWOptions options);
  virtual std::vector<int64_t> step_counts() const = 0;  // updates taken, per parameter
  virtual void set_step_count(size_t i, int64_t n) = 0;
  // Whether zero_grad() zeroes parameter i's gradient in place even without keep_gradients(true).
  virtual bool keeps_gradient(size_t i) const {
    (void)i;
    return false;
  }

  std::vector<std::string> names_;
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_;
  std::vector<bool> decay_;
  AdamWOptions opt_;
  bool keep_grads_ = false;
};

class AdamW final : public AdamWBase {
 public:
  AdamW(const std::vector<OptimizedParam>& params, AdamWOptions options);
  at::Tensor clip_grad_norm(double max_norm) override;
  void step(double lr) override;

 private:
  std::vector<int64_t> step_counts() const override { return steps_; }
  void set_step_count(size_t i, int64_t n) override { steps_[i] = n; }
  std::vector<int64_t> steps_;
};

// The dtype of a bf16 working copy's gradient (Note [fp32 gradients of bf16
// copies] in fused_adamw.cpp): bf16, as its backward makes it (one
// micro-batch on one rank), or fp32, a tensor autograd adds every backward's
// gradient into (several micro-batches or ranks).
enum class CopyGradients { bf16, fp32 };

class FusedAdamW final : public AdamWBase {
 public:
  FusedAdamW(const std::vector<OptimizedParam>& params, AdamWOptions options,
             CopyGradients copy_grads = CopyGradients::bf16);
  at::Tensor clip_grad_norm(double max_norm) override;
  void step(double lr) override;  // = set_lr(lr), update(), zero_grad()
  bool skips_nonfinite_on_device() const override { return true; }
  // step() in two parts, for the optimizer graph (optimizer_graph.hpp): the
  // learning rate goes into its device tensor; update() launches only
  // device work with no host values in it (graph-capturable) and leaves the
  // gradients as they are.
  void set_lr(double lr);
  void update();
  at::Tensor master_weight(const at::Tensor& param) const override;
  void load_weight(const at::Tensor& param, const at::Tensor& value) override;
  WorkingCopies working_copies() const override;
  int64_t buffer_bytes() const override;  // the masters

 private:
  std::vector<int64_t> step_counts() const override;  // reads the device counters (checkpoints only)
  void set_step_count(size_t i, int64_t n) override;
  // CopyGradients::fp32: the copies' gradients are zeroed, never dropped.
  bool keeps_gradient(size_t i) const override { return fp32_copy_grads_ && masters_[i].defined(); }
  void update_masters(bool decay);
  const at::Tensor* master_of(const at::Tensor& param) const;  // null: param has no master
  std::vector<at::Tensor> steps_;  // float32 scalars on the parameters' device (as torch.optim keeps them)
  at::Tensor lr_;         // float32 scalar on the device, refilled each step
  at::Tensor found_inf_;  // float32 scalar: 1 when the last clip_grad_norm saw a non-finite norm
  std::vector<at::Tensor> masters_;  // fp32 master of a bf16 working copy; undefined for the others
  at::Tensor clip_coef_;             // float32 scalar: the last clipping coefficient (1 without clipping)
  bool fp32_copy_grads_ = false;     // CopyGradients::fp32
};

struct ShardedOptions {
  bool overlap_gather = false;     // leave the all-gathers in flight after step() (sync_parameters() completes them)
  int64_t gather_piece_numel = 0;  // elements each rank sends per all-gather; 0: its whole range in one
  bool fused = false;              // ATen's multi-tensor AdamW (as FusedAdamW) instead of AdamW's op sequence
  bool gradient_views = true;      // the sharded parameters' .grad are views into one flat buffer (Note [Gradient views])
};

class ShardedAdamW final : public Optimizer {
 public:
  // `world` nullptr: one rank (the shard is everything). Tensors up to
  // tiny_numel elements stay replicated.
  ShardedAdamW(const std::vector<OptimizedParam>& params, AdamWOptions options, comm::World* world,
               int64_t tiny_numel, ShardedOptions sharded = {});
  ~ShardedAdamW() override;
  ShardedAdamW(const ShardedAdamW&) = delete;
  ShardedAdamW& operator=(const ShardedAdamW&) = delete;
  const std::vector<at::Tensor>& params() const override { return params_; }
  at::Tensor clip_grad_norm(double max_norm) override;
  void step(double lr) override;
  void zero_grad() override;
  void keep_gradients(bool keep) override { keep_grads_ = keep; }
  bool skips_nonfinite_on_device() const override { return fused_; }
  void sync_parameters() override;  // also rounds the working copies from their masters
  NamedTensorList state_tensors() const override;
  int64_t state_bytes() const override;  // the replicated moments on every rank, not only rank 0
  int64_t buffer_bytes() const override;  // masters, gradient shard, all-gather buffers
  at::Tensor master_weight(const at::Tensor& param) const override;
  void load_weight(const at::Tensor& param, const at::Tensor& value) override;
  WorkingCopies working_copies() const override;
  nlohmann::json state_json() const override;
  void load_state(const std::map<std::string, at::Tensor>& tensors, const nlohmann::json& json) override;

  comm::ShardTarget& shard() { return target_; }
  int64_t gathers_in_flight() const { return static_cast<int64_t>(in_flight_.size()); }
  const comm::ShardLayout& layout() const { return target_.layout; }
  const std::vector<std::string>& names() const { return names_; }

 private:
  // Where the other ranks' elements of one all-gather piece go (Note
  // [Gather overlap]): buffer_offset is into gathered_.
  struct Copy {
    size_t param = 0;
    int64_t param_offset = 0, buffer_offset = 0, numel = 0;
  };
  void plan_pieces(int64_t piece_numel);
  void launch_gather(size_t p);
  // The tensor holding parameter i's value for the update and the gather: its master, or itself.
  const at::Tensor& value(size_t i) const { return masters_[i].defined() ? masters_[i] : params_[i]; }
  void round_copies();
  void fused_update(double lr);
  void install_gradient_views();
  void clear_gradients();  // zero_grad() without completing the gathers
  void zero_lent();        // zeroes the gradient memory the gathers borrow
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::vector<bool> decay_;
  std::vector<int64_t> steps_;  // op-for-op form: updates taken, per parameter
  AdamWOptions opt_;
  comm::World* world_;
  bool fused_ = false;
  std::vector<at::Tensor> device_steps_;  // fused: float32 scalars per parameter, as FusedAdamW keeps them
  at::Tensor lr_, found_inf_;             // fused: float32 device scalars
  comm::ShardTarget target_;
  at::Tensor exp_avg_, exp_avg_sq_;                    // (owned) fp32: this rank's range
  std::map<size_t, std::pair<at::Tensor, at::Tensor>> replicated_;  // tiny tensors: exp_avg, exp_avg_sq
  at::Tensor send_, gathered_;  // all-gather buffers: (pieces x q), (pieces x world x q); Note [Borrowed gather buffers]
  int64_t piece_q_ = 0;                                // elements per rank per piece
  std::vector<std::vector<Copy>> receive_;             // per piece
  std::vector<comm::Pending> in_flight_;               // launched, not yet completed (sync_parameters)
  std::chrono::steady_clock::time_point first_launch_;
  bool overlap_gather_ = false;
  bool lend_grads_ = false;  // the gathers' buffers are gradient memory (Note [Borrowed gather buffers])
  bool lent_ = false;        // gathers in flight hold it: sync_parameters() zeroes it
  bool keep_grads_ = false;
  std::vector<at::Tensor> masters_;  // fp32 master of a bf16 working copy (whole, on every rank); undefined for the others
  std::vector<at::Tensor> copies_, copy_masters_;  // the working copies and their masters, in parameter order
  bool copies_stale_ = false;        // masters updated, copies not rounded from them yet (sync_parameters)
};

// Throws ConfigError naming precision.bf16_weights when a parameter asks for
// a bf16 working copy that `optimizer` does not keep.
void refuse_bf16_weights(const std::vector<OptimizedParam>& params, const char* optimizer);

// The position of `param` (the same tensor) in `params`; params.size() when absent.
size_t index_of(const std::vector<at::Tensor>& params, const at::Tensor& param);
// How many of `masters` are defined (working copies' masters), and their elements.
Optimizer::WorkingCopies count_copies(const std::vector<at::Tensor>& masters);

// The learning rate of 0-based step s (HF get_*_schedule_with_warmup).
struct Schedule {
  double peak_lr = 1e-4;
  int64_t total_steps = 1;
  int64_t warmup_steps = 0;  // already resolved from warmup_ratio
  double min_lr_ratio = 0;
  enum class Kind { Cosine, Linear, Constant } kind = Kind::Cosine;
  double lr_at(int64_t s) const;
};

// Global L2 norm of the gradients of `params` (before clipping) as a float32
// scalar on their device; scales them so the norm is at most max_norm when
// max_norm > 0 (docs/training-semantics.md s5).
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace loongforge::trainer
