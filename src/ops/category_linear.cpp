// loongforge::category_linear and its backward (contract: include/loongforge/ops/ops.hpp).
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "loongforge/ops/ops.hpp"

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "category_linear.cuh"
#endif

namespace loongforge::ops {
namespace {

using at::Tensor;
using Grads = std::tuple<Tensor, Tensor, Tensor>;

void check_args(const Tensor& x, const Tensor& weight, const Tensor& ids, const char* op) {
  TORCH_CHECK(x.dim() == 3, op, ": x must be (B, T, in), got shape ", x.sizes());
  TORCH_CHECK(weight.dim() == 3, op, ": weight must be (E, in, out), got shape ", weight.sizes());
  TORCH_CHECK(ids.dim() == 1 && ids.scalar_type() == at::kLong, op, ": ids must be a (B,) int64 tensor, got ",
              ids.scalar_type(), " of shape ", ids.sizes());
  TORCH_CHECK(ids.size(0) == x.size(0), op, ": ids has ", ids.size(0), " entries for a batch of ", x.size(0));
  TORCH_CHECK(x.size(2) == weight.size(1), op, ": x has ", x.size(2), " features, weight expects ", weight.size(1),
              " (weight shape ", weight.sizes(), ")");
  TORCH_CHECK(x.device() == weight.device() && ids.device() == weight.device(), op,
              ": x, weight and ids must be on one device, got ", x.device(), ", ", weight.device(), ", ", ids.device());
}

void check_bias(const Tensor& weight, const Tensor& bias) {
  TORCH_CHECK(bias.dim() == 2 && bias.size(0) == weight.size(0) && bias.size(1) == weight.size(2),
              "loongforge::category_linear: bias must be (E, out) = (", weight.size(0), ", ", weight.size(2),
              "), got shape ", bias.sizes());
  TORCH_CHECK(bias.scalar_type() == weight.scalar_type() && bias.device() == weight.device(),
              "loongforge::category_linear: bias must have weight's dtype and device (", weight.scalar_type(), ", ",
              weight.device(), "), got ", bias.scalar_type(), ", ", bias.device());
}

void check_same_dtype(const Tensor& x, const Tensor& weight, const char* op) {
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), op, ": x is ", x.scalar_type(), " but weight is ",
              weight.scalar_type(),
              "; mixed dtypes are computed only on CUDA with bf16 x (under bf16 autocast the op casts x itself)");
}

// The reference: gather B weight slots, bmm (what GR00T's CategorySpecificLinear does).
Tensor composite_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& ids) {
  check_same_dtype(x, weight, "loongforge::category_linear");
  const c10::List<std::optional<Tensor>> slots({ids});
  return at::bmm(x, weight.index(slots)) + bias.index(slots).unsqueeze(1);
}

// The reference's autograd: bmm's backward, then the gathers' accumulation into the slots.
Grads composite_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& ids) {
  check_same_dtype(x, weight, "loongforge::category_linear_backward");
  const Tensor g = grad_out.to(weight.scalar_type());
  const c10::List<std::optional<Tensor>> slots({ids});  // aten::index and its backward, index_put_ accumulating
  Tensor grad_x = at::bmm(g, weight.index(slots).transpose(1, 2));
  Tensor grad_w = at::zeros_like(weight).index_put_(slots, at::bmm(x.transpose(1, 2), g), /*accumulate=*/true);
  Tensor grad_b = at::zeros({weight.size(0), weight.size(2)}, weight.options())
                      .index_put_(slots, g.sum(1, /*keepdim=*/true).squeeze(1), /*accumulate=*/true);
  return {grad_x, grad_w, grad_b};
}

Tensor cpu_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& ids) {
  check_args(x, weight, ids, "loongforge::category_linear");
  check_bias(weight, bias);
  return composite_forward(x, weight, bias, ids);
}

Grads cpu_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& ids) {
  check_args(x, weight, ids, "loongforge::category_linear_backward");
  return composite_backward(grad_out, x, weight, ids);
}

#if LOONGFORGE_WITH_CUDA_KERNELS
void cuda_check(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "loongforge::category_linear: ", what, " failed: ", cudaGetErrorString(err));
}

template <typename T>
const auto* device_ptr(const Tensor& t) {
  if constexpr (std::is_same_v<T, at::BFloat16>)
    return reinterpret_cast<const __nv_bfloat16*>(t.data_ptr<T>());
  else
    return t.data_ptr<T>();
}
template <typename T>
auto* device_mut(Tensor& t) {
  if constexpr (std::is_same_v<T, at::BFloat16>)
    return reinterpret_cast<__nv_bfloat16*>(t.data_ptr<T>());
  else
    return t.data_ptr<T>();
}

// The segment-GEMM path applies to bf16 x with fp32 or bf16 weights.
bool segment_path(const Tensor& x, const Tensor& weight) {
  return x.scalar_type() == at::kBFloat16 &&
         (weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16);
}

// fn(float{}) or fn(at::BFloat16{}) by the weight's dtype (segment_path allows only these).
template <typename Fn>
void with_weight_type(const Tensor& weight, Fn&& fn) {
  if (weight.scalar_type() == at::kFloat)
    fn(float{});
  else
    fn(at::BFloat16{});
}

Tensor make_plan(const Tensor& ids, int64_t E, int64_t T) {
  const int64_t B = ids.size(0);
  Tensor plan = at::empty({kernels::category_plan_ints(B, E)}, ids.options().dtype(at::kInt));
  cuda_check(kernels::category_linear_plan(ids.data_ptr<int64_t>(), static_cast<int>(B), static_cast<int>(E),
                                           static_cast<int>(T), plan.data_ptr<int>(), at::cuda::getCurrentCUDAStream()),
             "the slot plan kernel");
  return plan;
}

Tensor cuda_forward(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Tensor& ids_in) {
  check_args(x_in, weight_in, ids_in, "loongforge::category_linear");
  check_bias(weight_in, bias_in);
  if (!segment_path(x_in, weight_in)) return composite_forward(x_in, weight_in, bias_in, ids_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous(), bias = bias_in.contiguous();
  const Tensor ids = ids_in.contiguous();
  const int64_t B = x.size(0), T = x.size(1), K = x.size(2), E = weight.size(0), N = weight.size(2);
  Tensor y = at::empty({B, T, N}, weight.options());
  if (y.numel() == 0) return y;
  const Tensor plan = make_plan(ids, E, T);
  auto stream = at::cuda::getCurrentCUDAStream();
  with_weight_type(weight, [&](auto tag) {
    using WT = decltype(tag);
    cuda_check(
        kernels::category_linear_forward(device_ptr<at::BFloat16>(x), device_ptr<WT>(weight), device_ptr<WT>(bias),
                                         plan.data_ptr<int>(), B, E, T, K, N, device_mut<WT>(y), stream),
        "the forward kernel");
  });
  return y;
}

Grads cuda_backward(const Tensor& grad_in, const Tensor& x_in, const Tensor& weight_in, const Tensor& ids_in) {
  check_args(x_in, weight_in, ids_in, "loongforge::category_linear_backward");
  if (!segment_path(x_in, weight_in)) return composite_backward(grad_in, x_in, weight_in, ids_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const Tensor x = x_in.contiguous(), weight = weight_in.contiguous(), ids = ids_in.contiguous();
  const Tensor dy = grad_in.to(weight.scalar_type()).contiguous();
  const int64_t B = x.size(0), T = x.size(1), K = x.size(2), E = weight.size(0), N = weight.size(2);
  TORCH_CHECK(dy.sizes() == at::IntArrayRef({B, T, N}), "loongforge::category_linear_backward: grad_out must be (", B,
              ", ", T, ", ", N, "), got ", dy.sizes());
  Tensor dx = at::empty_like(x);
  Tensor dw = at::empty_like(weight);
  Tensor db = at::empty({E, N}, weight.options());
  if (B * T == 0) return {dx, dw.zero_(), db.zero_()};
  const Tensor plan = make_plan(ids, E, T);
  auto stream = at::cuda::getCurrentCUDAStream();
  with_weight_type(weight, [&](auto tag) {
    using WT = decltype(tag);
    cuda_check(kernels::category_linear_grad_input(device_ptr<WT>(dy), device_ptr<WT>(weight), plan.data_ptr<int>(), B,
                                                   E, T, K, N, device_mut<at::BFloat16>(dx), stream),
               "the grad_input kernel");
    cuda_check(
        kernels::category_linear_grad_weight(device_ptr<at::BFloat16>(x), device_ptr<WT>(dy), plan.data_ptr<int>(), B,
                                             E, T, K, N, device_mut<WT>(dw), device_mut<WT>(db), stream),
        "the grad_weight kernel");
  });
  return {dx, dw, db};
}
#endif

// Shapes and dtypes only (fake tensors: torch.export, AOTInductor).
Tensor meta_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& ids) {
  check_args(x, weight, ids, "loongforge::category_linear");
  check_bias(weight, bias);
  return at::empty({x.size(0), x.size(1), weight.size(2)}, weight.options());
}

Grads meta_backward(const Tensor&, const Tensor& x, const Tensor& weight, const Tensor& ids) {
  check_args(x, weight, ids, "loongforge::category_linear_backward");
  return {at::empty_like(x), at::empty_like(weight), at::empty({weight.size(0), weight.size(2)}, weight.options())};
}

const auto& forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("loongforge::category_linear", "")
                             .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>();
  return op;
}

const auto& backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("loongforge::category_linear_backward", "")
                             .typed<Grads(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>();
  return op;
}

class CategoryLinearFunction : public torch::autograd::Function<CategoryLinearFunction> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, const Tensor& weight,
                        const Tensor& bias, const Tensor& ids) {
    ctx->save_for_backward({x, weight, ids});
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return forward_op().call(x, weight, bias, ids);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [gx, gw, gb] = backward_op().call(grads[0], saved[0], saved[1], saved[2]);
    return {gx, gw, gb, Tensor()};
  }
};

Tensor autograd_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& ids) {
  return CategoryLinearFunction::apply(x, weight, bias, ids);
}

// Under CUDA bf16 autocast x is cast to bf16 (bmm is on autocast's lower-precision
// list); the weights are not copied: the kernels round them on load.
Tensor autocast_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& ids) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
  const Tensor xc = dtype == at::kBFloat16 ? at::autocast::cached_cast(dtype, x, c10::DeviceType::CUDA) : x;
  return forward_op().call(xc, weight, bias, ids);
}

}  // namespace

void ensure_registered() {}

}  // namespace loongforge::ops

TORCH_LIBRARY(loongforge, m) {
  m.def("category_linear(Tensor x, Tensor weight, Tensor bias, Tensor ids) -> Tensor");
  m.def("category_linear_backward(Tensor grad_out, Tensor x, Tensor weight, Tensor ids) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(loongforge, CPU, m) {
  m.impl("category_linear", &loongforge::ops::cpu_forward);
  m.impl("category_linear_backward", &loongforge::ops::cpu_backward);
}

TORCH_LIBRARY_IMPL(loongforge, Meta, m) {
  m.impl("category_linear", &loongforge::ops::meta_forward);
  m.impl("category_linear_backward", &loongforge::ops::meta_backward);
}

TORCH_LIBRARY_IMPL(loongforge, Autograd, m) {
  m.impl("category_linear", &loongforge::ops::autograd_forward);
}

#if LOONGFORGE_WITH_CUDA_KERNELS
TORCH_LIBRARY_IMPL(loongforge, CUDA, m) {
  m.impl("category_linear", &loongforge::ops::cuda_forward);
  m.impl("category_linear_backward", &loongforge::ops::cuda_backward);
}

TORCH_LIBRARY_IMPL(loongforge, AutocastCUDA, m) {
  m.impl("category_linear", &loongforge::ops::autocast_forward);
}
#endif
