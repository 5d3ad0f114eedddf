// AdamW on fp32 parameters, with or without bf16 working copies (the
// trainer's bf16 weights, precision.bf16_weights), and the squared L2 norm of
// the gradients that clipping takes first.
//
// master_adamw: one multi-tensor launch per group of up to 48 tensors reads
// each gradient (bf16, or fp32: a parameter without a copy, or a copy whose
// gradient autograd accumulated in fp32 over several micro-batches or ranks),
// scales it by the clipping coefficient, updates the fp32 parameter (the
// master, where there is a copy) and both fp32 moments, and writes the
// parameter rounded to bf16 into the working copy the forward reads, if any.
//
// Contract
// - Per element, the arithmetic of ATen's fused AdamW (`_fused_adamw_`, ADAMW
//   mode, fp32 parameters, a tensor learning rate) on the gradient
//   float(grad) * (*clip_coef) -- grad being `grad` (bf16) or, where that is
//   null, `grad32` (fp32) -- which is what `_foreach_mul_` by that
//   coefficient leaves in an fp32 gradient -- so the parameter equals what
//   ATen's kernel gives for the same fp32 gradient within 1e-6 relative
//   (test_trainer_gpu's optimizer case, which reports how many elements are
//   not bit-identical).
//   The working copy (`weight`, may be null) is the master rounded to nearest
//   even (as Tensor.to).
// - step[i] points at tensor i's float update count, already incremented for
//   this update (as ATen's kernel reads it); lr, found_inf and clip_coef are
//   float device scalars read by the kernel (no host value, CUDA-graph safe).
//   clip_coef may be null (1); *found_inf == 1 skips every update. Weight
//   decay is per tensor.
// - Tensors contiguous, any length (a 16-byte aligned one whose length is a
//   multiple of 4 takes vector loads).
//
// grad_square_sums: for a list of gradients (bf16 or fp32, contiguous), one
// float per block of grad_square_sum_blocks(...) into `partials`, each the
// sum of the squares of its block's elements accumulated in float; their sum
// is the squared norm of all of them (the caller sums `partials` in a fixed
// order: deterministic). No host value, CUDA-graph safe.
//
// No libtorch headers (cuda/CMakeLists.txt); errors come back as cudaError_t.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace loongforge::kernels {

struct MasterAdamWTensor {
  float* master;              // the fp32 parameter (a working copy's master)
  __nv_bfloat16* weight;      // its bf16 working copy, or null
  const __nv_bfloat16* grad;  // the gradient in bf16, or null and then
  const float* grad32;        // the gradient in fp32
  float* exp_avg;
  float* exp_avg_sq;
  const float* step;
  int64_t numel;
  float weight_decay;
};

struct MasterAdamWScalars {
  const float* lr;
  const float* found_inf;
  const float* clip_coef;  // null: 1
  double beta1, beta2, eps;
};

cudaError_t master_adamw(const MasterAdamWTensor* tensors, int count, MasterAdamWScalars s, cudaStream_t stream);

struct GradSpan {
  const void* data;
  int64_t numel;
  bool bf16;  // else fp32
};

// How many floats grad_square_sums writes for these spans.
int64_t grad_square_sum_blocks(const GradSpan* spans, int count);
cudaError_t grad_square_sums(const GradSpan* spans, int count, float* partials, cudaStream_t stream);

}  // namespace loongforge::kernels
