// LoongForge's custom operators, registered with the PyTorch dispatcher under
// the namespace `loongforge` (issue #11 items 3 and 4).
//
// Contract
// - The shared library libloongforge_ops (src/ops/) registers, when loaded:
//     loongforge::category_linear(Tensor x, Tensor weight, Tensor bias, Tensor ids) -> Tensor
//         GR00T's per-embodiment linear: out[b] = x[b] @ weight[ids[b]] + bias[ids[b]]
//         for x (B, T, in), weight (E, in, out), bias (E, out), ids (B,) int64.
//     loongforge::category_linear_backward(Tensor grad_out, Tensor x, Tensor weight, Tensor ids)
//         -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)
//   with CPU, CUDA, Meta (shapes only, for torch.export / AOTInductor),
//   Autograd (C++: TorchScript modules trained by loongforge-train) and
//   AutocastCUDA (x to bf16 under CUDA bf16 autocast, as bmm's autocast does) kernels.
// - CPU, and CUDA with fp32 x: the gather + bmm composition itself (bitwise the
//   reference `torch.bmm(x, weight[ids]) + bias[ids].unsqueeze(1)` and its autograd).
//   CUDA with bf16 x: segment GEMMs (cuda/model/category_linear.cuh) that read
//   each used slot's weights in place, bf16 products with fp32 accumulation,
//   output in weight's dtype; no B copies of the weights are gathered.
//     loongforge::masked_patch_embed(Tensor images, Tensor weight, Tensor? bias, Tensor valid) -> Tensor
//         DMF's patch embedding of images placed at the top left of a common grid (issue #46):
//         images (N, C, H, W), weight (D, C, p, p), bias (D,) or None, valid (N, 2) int64 each
//         image's rows and columns; out (N, H/p * W/p, D), row-major over the grid: the conv2d patch
//         embedding of the image with its pixels outside the valid region taken as zeros, and zero
//         (no bias) for a patch without a valid pixel. CompositeImplicitAutograd (ATen ops on any
//         device: autograd and torch.export see them; Note [Masked patch embedding]). Not yet
//         called by a model.
// - Python loads the same library (scripts/model/ops.py: torch.ops.load_library),
//   so the reference trainer and the exporter run the op the C++ trainer runs.
// - Errors name the argument and the expected shape/dtype (TORCH_CHECK).
//
//   loongforge::ops::ensure_registered();   // links the library in; idempotent
#pragma once

namespace loongforge::ops {

// Does nothing; calling it from a binary guarantees the library (and so its
// TORCH_LIBRARY registrations) is linked and loaded.
void ensure_registered();

}  // namespace loongforge::ops
