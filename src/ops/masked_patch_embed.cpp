// loongforge::masked_patch_embed (contract: include/loongforge/ops/ops.hpp).
//
// Note [Masked patch embedding]
// DMF (issue #46) batches images of different sizes by placing each at the
// top left of a common grid of patches; the rest of the grid is padding. The
// patch embedding of such a micro-batch must give each image what it gives
// alone: pixels outside an image's valid region count as zeros (a patch that
// straddles the edge sees only the image's own pixels), and a patch with no
// valid pixel is no token at all, so its output is zero, bias included, and
// its gradient reaches neither the weights nor the pixels. Written as ATen
// ops (the mask, the patches as a view-and-permute, one GEMM) and registered
// as CompositeImplicitAutograd: autograd differentiates those ops, the same
// code serves CPU and CUDA, and torch.export / AOTInductor see the ops rather
// than an opaque call (no proxy executor: a compiled package runs an op
// without a C shim through it, which failed at run time for index_add,
// docs/benchmarks.md 2026-12-06). A fused CUDA kernel (mask and patch copy in
// one pass) is left until a profile shows this op's copy costs time.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

namespace loongforge::ops {
namespace {

using at::Tensor;

Tensor masked_patch_embed(const Tensor& images, const Tensor& weight, const std::optional<Tensor>& bias,
                          const Tensor& valid) {
  const char* op = "loongforge::masked_patch_embed";
  TORCH_CHECK(images.dim() == 4, op, ": images must be (N, C, H, W), got shape ", images.sizes());
  TORCH_CHECK(weight.dim() == 4 && weight.size(2) == weight.size(3), op,
              ": weight must be (D, C, p, p) (square patches), got shape ", weight.sizes());
  const int64_t N = images.size(0), C = images.size(1), H = images.size(2), W = images.size(3);
  const int64_t D = weight.size(0), p = weight.size(2);
  TORCH_CHECK(weight.size(1) == C, op, ": images have ", C, " channels, weight expects ", weight.size(1));
  TORCH_CHECK(p > 0 && H % p == 0 && W % p == 0, op, ": the grid (", H, " x ", W, ") must be whole patches of ", p,
              " x ", p, " pixels");
  TORCH_CHECK(valid.dim() == 2 && valid.size(0) == N && valid.size(1) == 2 && valid.scalar_type() == at::kLong, op,
              ": valid must be an (N, 2) int64 tensor of each image's rows and columns, got ", valid.scalar_type(),
              " of shape ", valid.sizes(), " for ", N, " images");
  TORCH_CHECK(images.device() == weight.device() && valid.device() == weight.device(), op,
              ": images, weight and valid must be on one device, got ", images.device(), ", ", weight.device(), ", ",
              valid.device());
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == D, op, ": bias must be (D,) = (", D, "), got shape ",
                bias->sizes());
    TORCH_CHECK(bias->scalar_type() == weight.scalar_type() && bias->device() == weight.device(), op,
                ": bias must have weight's dtype and device");
  }
  const int64_t gh = H / p, gw = W / p;
  const auto idx = valid.options();
  // (N, H, W): inside the image's rows and columns (valid values past the grid count as the whole grid)
  const Tensor rows = at::arange(H, idx).view({1, H, 1}) < valid.select(1, 0).view({N, 1, 1});
  const Tensor cols = at::arange(W, idx).view({1, 1, W}) < valid.select(1, 1).view({N, 1, 1});
  const Tensor pixels = at::logical_and(rows, cols);
  const Tensor x = images * pixels.unsqueeze(1).to(images.scalar_type());
  const Tensor patches =
      x.reshape({N, C, gh, p, gw, p}).permute({0, 2, 4, 1, 3, 5}).reshape({N, gh * gw, C * p * p});
  // images and weight of one dtype, or any two under autocast (the GEMM casts as a linear layer's does)
  Tensor out = at::matmul(patches, weight.reshape({D, C * p * p}).t());
  if (bias) out = out + *bias;
  // A patch holds a valid pixel exactly when its top-left pixel is valid (the region is a top-left rectangle).
  const Tensor tokens = pixels.slice(1, 0, H, p).slice(2, 0, W, p).reshape({N, gh * gw, 1});
  return out * tokens.to(out.scalar_type());
}

}  // namespace
}  // namespace loongforge::ops

TORCH_LIBRARY_FRAGMENT(loongforge, m) {
  m.def("masked_patch_embed(Tensor images, Tensor weight, Tensor? bias, Tensor valid) -> Tensor");
}

TORCH_LIBRARY_IMPL(loongforge, CompositeImplicitAutograd, m) {
  m.impl("masked_patch_embed", &loongforge::ops::masked_patch_embed);
}
