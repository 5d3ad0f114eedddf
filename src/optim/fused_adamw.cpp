// FusedAdamW: AdamW through this project's kernels on a GPU (Note [The
// optimizer's kernels]), with bf16 working copies and their fp32 masters, and
// through ATen's multi-tensor kernels elsewhere (optimizer.hpp).
#include <ATen/ATen.h>  // at::_fused_adamw_, at::_foreach_norm, at::_foreach_mul_

#include <algorithm>  // std::all_of

#include "loongforge/common/error.hpp"
#include "loongforge/optim/optimizer.hpp"

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>  // c10::cuda::getCurrentCUDAStream

#include "master_adamw.cuh"
#endif

namespace loongforge::optim {

FusedAdamW::FusedAdamW(const std::vector<OptimizedParam>& params, AdamWOptions options, CopyGradients copy_grads)
    : AdamWBase(params, options), fp32_copy_grads_(copy_grads == CopyGradients::fp32) {
  at::NoGradGuard no_grad;
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
  clip_coef_ = at::ones({}, scalar);
  masters_.resize(params.size());
  // Note [The optimizer's kernels]
  kernel_ = LOONGFORGE_WITH_CUDA_KERNELS && !params.empty() && params.front().tensor.is_cuda() &&
            params.front().tensor.scalar_type() == at::kFloat &&
            std::all_of(params.begin(), params.end(), [](const OptimizedParam& p) { return p.tensor.is_contiguous(); });
#if LOONGFORGE_WITH_CUDA_KERNELS
  if (kernel_) {  // one partial sum per block of every gradient (a gradient has its parameter's length)
    std::vector<kernels::GradSpan> spans;
    for (const auto& p : params) spans.push_back({nullptr, p.tensor.numel(), false});
    norm_partials_ = at::empty({kernels::grad_square_sum_blocks(spans.data(), static_cast<int>(spans.size()))},
                               scalar);
  }
#endif
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].bf16_weight) continue;
    const at::Tensor& t = params[i].tensor;
    if (!LOONGFORGE_WITH_CUDA_KERNELS || !t.is_cuda() || t.scalar_type() != at::kFloat || !t.is_contiguous())
      throw ConfigError("precision.bf16_weights: '" + params[i].name + "' is " + t.toString() + " on " +
                        t.device().str() + (LOONGFORGE_WITH_CUDA_KERNELS ? "" : " in a build without CUDA kernels") +
                        "; bf16 working copies need contiguous fp32 parameters on a GPU: "
                        "set precision.bf16_weights=off");
    masters_[i] = t.detach().clone();
    params_[i].set_data(t.detach().to(at::kBFloat16));  // the module's parameter: its forward now reads bf16
    // Note [fp32 gradients of bf16 copies]: autograd adds each backward's bf16 gradient into this tensor.
    if (fp32_copy_grads_) params_[i].mutable_grad() = at::zeros_like(masters_[i]);
  }
}

// Note [fp32 gradients of bf16 copies]
// A bf16 working copy's backward makes a bf16 gradient. With several
// micro-batches or ranks, summing those in bf16 would round every partial
// sum, where the fp32-weight path (autocast's casts) sums fp32 gradients. So
// in CopyGradients::fp32 mode each copy's .grad is an fp32 tensor from
// construction on, zeroed in place and never dropped: autograd's
// AccumulateGrad adds a defined .grad and the new gradient in place
// (`grad += new`, type promotion: fp32 += bf16, the exact upcast), which is
// the fp32-weight path's sum bit for bit -- that path upcasts each bf16
// gradient in the cast's backward and adds it to its fp32 .grad. The
// reducers then average fp32 gradients as for fp32 weights, and the master
// kernel reads them as fp32 (MasterAdamWTensor::grad32).
// test_optimizer.cpp checks the accumulation on a CPU; test_trainer_gpu
// the whole run against the fp32-weight path.

// Note [The optimizer's kernels]
// On a GPU with fp32 contiguous parameters (the trainer's case) every update
// goes through this project's AdamW kernel (master_adamw.cuh), parameters
// with and without working copies in the same launches, and the gradients'
// norm through its square-sum kernel: 1.08x the memory-bandwidth floor for
// gr00t-n1.7-3b on an H100 (17.6 against 16.3 ms; docs/benchmarks.md, session
// 50), where ATen's fused AdamW plus `_foreach_norm` and a `_foreach_mul_`
// pass of the clipping left 1.27x of it.
// The clipping coefficient is then applied inside the update, so the
// gradients are left unscaled. Numerics: the update is ATen's fused AdamW's
// within 1e-6 relative, the norm sums in another order (test_trainer_gpu's
// optimizer case states both bounds). Elsewhere (the CPU) ATen's kernels.

at::Tensor FusedAdamW::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  // Norms in parameter order (the order of the sum FusedAdamW takes without
  // working copies); bf16 gradients' norms are taken in float. The working
  // copies' gradients (bf16, or fp32: Note [fp32 gradients of bf16 copies])
  // are scaled inside the update, the others here unless the kernel updates
  // them too (Note [The optimizer's kernels]).
  std::vector<at::Tensor> grads, scaled;
  bool copies = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& g = params_[i].grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (masters_[i].defined())
      copies = true;
    else if (!kernel_)
      scaled.push_back(g);
  }
  if (grads.empty()) {
    found_inf_.zero_();
    return at::zeros_like(found_inf_);
  }
  const at::Tensor total = kernel_ ? kernel_norm(grads) : aten_norm(grads);
  if (max_norm > 0) {
    const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * max_norm, c10::nullopt, 1.0);
    if (!scaled.empty()) at::_foreach_mul_(scaled, coef);
    clip_coef_.copy_(coef);  // the gradients the kernel updates are scaled inside the update
  } else if (copies || kernel_) {
    clip_coef_.fill_(1.0);  // no clipping this step
  }
  found_inf_.copy_(at::logical_not(at::isfinite(total)));
  return total;
}

at::Tensor FusedAdamW::aten_norm(const std::vector<at::Tensor>& grads) const {
  std::vector<at::Tensor> full, half;
  std::vector<bool> is_half;
  for (const at::Tensor& g : grads) {
    const bool h = g.scalar_type() == at::kBFloat16;
    (h ? half : full).push_back(g);
    is_half.push_back(h);
  }
  const std::vector<at::Tensor> full_norms = full.empty() ? std::vector<at::Tensor>{} : at::_foreach_norm(full, 2);
  const std::vector<at::Tensor> half_norms =
      half.empty() ? std::vector<at::Tensor>{} : at::_foreach_norm(half, 2, at::kFloat);
  std::vector<at::Tensor> norms;
  size_t a = 0, b = 0;
  for (const bool h : is_half) norms.push_back(h ? half_norms[b++] : full_norms[a++]);
  return at::linalg_vector_norm(at::stack(norms), 2);
}

at::Tensor FusedAdamW::kernel_norm(const std::vector<at::Tensor>& grads) {
#if LOONGFORGE_WITH_CUDA_KERNELS
  std::vector<kernels::GradSpan> spans;
  for (const at::Tensor& g : grads) {
    const bool half = g.scalar_type() == at::kBFloat16;
    if ((!half && g.scalar_type() != at::kFloat) || !g.is_contiguous() || g.device() != lr_.device())
      return aten_norm(grads);  // a layout the kernel does not read (autograd's gradients are contiguous)
    spans.push_back({g.const_data_ptr(), g.numel(), half});
  }
  const int64_t blocks = kernels::grad_square_sum_blocks(spans.data(), static_cast<int>(spans.size()));
  if (!norm_partials_.defined() || norm_partials_.numel() < blocks)  // sized for every parameter's gradient
    throw TrainingError("gradient norm: " + std::to_string(blocks) + " partial sums for " +
                        std::to_string(norm_partials_.numel()) + " slots (a gradient larger than its parameter)");
  const cudaError_t e = kernels::grad_square_sums(spans.data(), static_cast<int>(spans.size()),
                                                  norm_partials_.data_ptr<float>(),
                                                  c10::cuda::getCurrentCUDAStream(lr_.device().index()));
  if (e != cudaSuccess) throw TrainingError(std::string("gradient norm kernel: ") + cudaGetErrorString(e));
  return norm_partials_.narrow(0, 0, blocks).sum().sqrt();
#else
  return aten_norm(grads);
#endif
}

void FusedAdamW::step(double lr) {
  set_lr(lr);
  update();
  zero_grad();
}

void FusedAdamW::set_lr(double lr) { lr_.fill_(lr); }

void FusedAdamW::update() {
  at::NoGradGuard no_grad;
  if (!kernel_) {
    for (const bool decay : {true, false}) {
      std::vector<at::Tensor> p, g, m, v, s;
      for (size_t i = 0; i < params_.size(); ++i) {
        if (decay_[i] != decay || !params_[i].grad().defined() || masters_[i].defined()) continue;
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
  kernel_update();  // the working copies, or with kernel_ every parameter
}

void FusedAdamW::kernel_update() {
#if LOONGFORGE_WITH_CUDA_KERNELS
  std::vector<kernels::MasterAdamWTensor> table;
  std::vector<at::Tensor> s, keep;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor g = params_[i].grad();
    const bool copy = masters_[i].defined();
    if (!g.defined() || !(copy || kernel_)) continue;
    const bool half = g.scalar_type() == at::kBFloat16;
    if ((!half && g.scalar_type() != at::kFloat) || g.device() != params_[i].device())
      throw TrainingError("parameter '" + names_[i] + "' got a " + g.toString() + " gradient on " +
                          g.device().str() + ", not a bf16 or fp32 tensor on " + params_[i].device().str() +
                          (copy ? "; set precision.bf16_weights=off" : ""));
    if (!g.is_contiguous()) keep.push_back(g = g.contiguous());  // read only; alive until the launch
    at::Tensor& master = copy ? masters_[i] : params_[i];
    table.push_back({master.data_ptr<float>(),
                     copy ? reinterpret_cast<__nv_bfloat16*>(params_[i].data_ptr()) : nullptr,
                     half ? reinterpret_cast<const __nv_bfloat16*>(g.const_data_ptr()) : nullptr,
                     half ? nullptr : g.const_data_ptr<float>(), exp_avg_[i].data_ptr<float>(),
                     exp_avg_sq_[i].data_ptr<float>(), steps_[i].const_data_ptr<float>(), master.numel(),
                     static_cast<float>(decay_[i] ? opt_.weight_decay : 0.0)});
    s.push_back(steps_[i]);
  }
  if (table.empty()) return;
  at::_foreach_add_(s, 1);
  const kernels::MasterAdamWScalars k{lr_.const_data_ptr<float>(), found_inf_.const_data_ptr<float>(),
                                      clip_coef_.const_data_ptr<float>(), opt_.beta1, opt_.beta2, opt_.eps};
  const cudaError_t e = kernels::master_adamw(table.data(), static_cast<int>(table.size()), k,
                                              c10::cuda::getCurrentCUDAStream(params_.front().device().index()));
  if (e != cudaSuccess) throw TrainingError(std::string("AdamW kernel: ") + cudaGetErrorString(e));
  at::_foreach_add_(s, found_inf_, -1);
#endif
}

const at::Tensor* FusedAdamW::master_of(const at::Tensor& param) const {
  const size_t i = index_of(params_, param);
  return i < params_.size() && masters_[i].defined() ? &masters_[i] : nullptr;
}

at::Tensor FusedAdamW::master_weight(const at::Tensor& param) const {
  const at::Tensor* m = master_of(param);
  return m ? *m : param;
}

void FusedAdamW::load_weight(const at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  const at::Tensor* m = master_of(param);
  if (!m) return Optimizer::load_weight(param, value);
  m->copy_(value);
  param.copy_(*m);  // rounded to nearest even, as the update writes it
}

Optimizer::WorkingCopies FusedAdamW::working_copies() const {
  WorkingCopies w = count_copies(masters_);
  w.fp32_gradients = w.count > 0 && fp32_copy_grads_;
  return w;
}

bool FusedAdamW::owns_gradients() const { return working_copies().fp32_gradients; }

int64_t FusedAdamW::buffer_bytes() const { return 4 * count_copies(masters_).numel; }

std::vector<int64_t> FusedAdamW::step_counts() const {
  std::vector<int64_t> out;
  if (steps_.empty()) return out;
  const at::Tensor all = at::stack(steps_).to(at::kCPU);  // one copy for every counter
  const float* v = all.data_ptr<float>();
  for (int64_t i = 0; i < all.numel(); ++i) out.push_back(static_cast<int64_t>(v[i]));
  return out;
}

void FusedAdamW::set_step_count(size_t i, int64_t n) { steps_[i].fill_(static_cast<double>(n)); }

}  // namespace loongforge::optim
