// loongforge/optim/optimizer.hpp — the update seam of the trainer:
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
//    most max_norm when max_norm > 0 (FusedAdamW may instead apply that scale
//    inside the update of step()). It reads nothing back to the host.
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
// Equal to AdamW within float rounding (test/optim/test_optimizer.cpp), not
// bit for bit. A parameter given with bf16_weight (precision.bf16_weights;
// CUDA builds) becomes a bf16 working copy -- its tensor is set to bf16 in
// place, so the module's forward reads it and backward makes bf16 gradients
// -- and the optimizer keeps its fp32 master: one kernel of this project
// (cuda/optim/master_adamw.cuh) reads the gradient (bf16; or fp32 with
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
#pragma once

#include <chrono>   // std::chrono::steady_clock
#include <cstdint>  // int64_t
#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <memory>   // std::unique_ptr

#include <ATen/core/Tensor.h>  // at::Tensor
#include <c10/core/Device.h>     // c10::Device
#include <nlohmann/json.hpp>   // nlohmann::json

#include "loongforge/config/config.hpp"
#include "loongforge/model/model.hpp"


namespace loongforge::optim {

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
  // Whether every rank holds (and checkpoints) its own shard of the state.
  virtual bool sharded() const { return false; }
  // Whether the parameters' gradients are tensors this optimizer keeps for the
  // whole run (views into a flat buffer, or the fp32 sums of bf16 working
  // copies' gradients): a step runner then adds into them and never replaces
  // them (fusion::StepRunner::make_gradients).
  virtual bool owns_gradients() const { return false; }
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

// FusedAdamW on a GPU (fp32 contiguous parameters) updates through the
// project's AdamW kernel and takes the norm with its square-sum kernel; its
// clip_grad_norm then leaves the gradients unscaled and the update applies
// the coefficient (as it does for bf16 working copies everywhere). On the
// CPU: ATen's fused AdamW, `_foreach_norm` and `_foreach_mul_`. (Note [The
// optimizer's kernels] in fused_adamw.cpp.)
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
  bool owns_gradients() const override;  // the fp32 gradients of working copies (CopyGradients::fp32)
  int64_t buffer_bytes() const override;  // the masters

 private:
  std::vector<int64_t> step_counts() const override;  // reads the device counters (checkpoints only)
  void set_step_count(size_t i, int64_t n) override;
  // CopyGradients::fp32: the copies' gradients are zeroed, never dropped.
  bool keeps_gradient(size_t i) const override { return fp32_copy_grads_ && masters_[i].defined(); }
  void kernel_update();  // the working copies through the project's kernel; with kernel_ every parameter
  at::Tensor aten_norm(const std::vector<at::Tensor>& grads) const;
  at::Tensor kernel_norm(const std::vector<at::Tensor>& grads);
  const at::Tensor* master_of(const at::Tensor& param) const;  // null: param has no master
  std::vector<at::Tensor> steps_;  // float32 scalars on the parameters' device (as torch.optim keeps them)
  at::Tensor lr_;         // float32 scalar on the device, refilled each step
  at::Tensor found_inf_;  // float32 scalar: 1 when the last clip_grad_norm saw a non-finite norm
  std::vector<at::Tensor> masters_;  // fp32 master of a bf16 working copy; undefined for the others
  at::Tensor clip_coef_;             // float32 scalar: the last clipping coefficient (1 without clipping)
  bool fp32_copy_grads_ = false;     // CopyGradients::fp32
  bool kernel_ = false;              // every update and the norm through the project's kernels (fused_adamw.cpp)
  at::Tensor norm_partials_;         // kernel_: the norm kernel's per-block sums
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

// ---------------------------------------------------------------------------
// Building the seam from the config. The trainer gets its optimizer from the
// GCTS room's factory (engines/gcts/gcts.hpp), which uses these for the plain
// seam and for what its sharded optimizer shares with it.

// optimizer.implementation: fused (auto: on a GPU) or plain.
bool use_fused(const config::Config& cfg, c10::Device device);

// What decides precision.bf16_weights (Note [fp32 gradients of bf16 copies]
// in src/optim/fused_adamw.cpp).
struct WeightsContext {
  c10::Device device = c10::kCPU;
  bool bf16 = false;        // the run computes in bf16 autocast
  bool fused = false;       // use_fused()
  bool sharded = false;     // a sharded optimizer (gcts.shard_optimizer) keeps the copies
  bool compiled = false;    // trainer.compiled_step
  bool multi_rank = false;  // gradients are reduced over ranks
  int64_t accumulation = 1;  // micro-batches per step
  // compiled: the package's bf16 working copies (fusion::StepRunner::bf16_weights); none: it takes fp32
  // weights. A package with copies runs only with them: where the run cannot keep them, a ConfigError.
  std::vector<std::string> package_bf16;
};

// Whether this run keeps bf16 working copies of the weights only linear layers
// read. `on` where it cannot is a ConfigError naming why; `auto` where it
// cannot says why in the log (runs that compute in bf16 on a GPU only).
bool use_bf16_weights(const config::Config& cfg, const WeightsContext& c);

// The trainable parameters of `net` in params.json order; with bf16_weights,
// those only linear layers read (the MDG's linear_only; a tensor held under
// two names only when both are) are flagged for a working copy, or with
// `only` (a compiled package's list) exactly those named, each of which must
// be trainable and read only by linear layers (else a ConfigError naming it).
std::vector<OptimizedParam> trainable_params(model::Model& net, const model::Mdg& mdg, bool bf16_weights,
                                             const std::vector<std::string>& only = {});

// The weights a compiled package should take as bf16 working copies for this run (the package cache's
// compile passes them: scripts/compile_step.py --bf16-weights): those trainable_params flags under the
// rules above, on one rank without accumulation or a sharded optimizer; empty where the run keeps none.
std::vector<std::string> compiled_working_copies(const config::Config& cfg, model::Model& net, c10::Device device,
                                                 bool bf16, bool multi_rank);

AdamWOptions adamw_options(const config::Config& cfg);
Schedule schedule(const config::Config& cfg);  // schedule.* and trainer.max_steps

// The plain seam: FusedAdamW when `fused` (the working copies' gradients fp32
// when fp32_copy_gradients), else AdamW.
std::unique_ptr<Optimizer> make_optimizer(const std::vector<OptimizedParam>& params, const AdamWOptions& options,
                                          bool fused, bool fp32_copy_gradients);

// The run line's words on bf16 working copies ("" when none), and
// summary.json's and `loongforge status`'s "bf16_weights" (null when none).
std::string working_copies_note(const Optimizer& optimizer);
nlohmann::json working_copies_json(const Optimizer* optimizer);

}  // namespace loongforge::optim
