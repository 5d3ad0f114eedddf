// AdamW on fp32 master weights whose working copies are bf16 (the trainer's
// bf16 weights, precision.bf16_weights): one multi-tensor launch per group of
// tensors reads each gradient (bf16, or fp32 where autograd accumulated it in
// fp32: several micro-batches or ranks), scales it by the clipping coefficient,
// updates the fp32 master and both fp32 moments, and writes the master rounded
// to bf16 into the working copy the forward reads.
//
// Contract
// - Per element, the arithmetic of ATen's fused AdamW (`_fused_adamw_`, ADAMW
//   mode, fp32 parameters, a tensor learning rate) on the gradient
//   float(grad) * (*clip_coef) -- grad being `grad` (bf16) or, where that is
//   null, `grad32` (fp32) -- which is what `_foreach_mul_` by that
//   coefficient leaves in an fp32 gradient -- so the master equals what ATen's
//   kernel gives for the same fp32 gradient within 1e-6 relative
//   (test_trainer_gpu's optimizer case, which reports how many elements are
//   not bit-identical).
//   The working copy is the master rounded to nearest even (as Tensor.to).
// - step[i] points at tensor i's float update count, already incremented for
//   this update (as ATen's kernel reads it); lr, found_inf and clip_coef are
//   float device scalars read by the kernel (no host value, CUDA-graph safe).
//   clip_coef may be null (1); *found_inf == 1 skips every update.
// - Tensors contiguous, any length (a 16-byte aligned one whose length is a
//   multiple of 4 takes vector loads).
// - No libtorch headers (cuda/CMakeLists.txt); errors come back as cudaError_t.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace loongforge::kernels {

struct MasterAdamWTensor {
  float* master;
  __nv_bfloat16* weight;
  const __nv_bfloat16* grad;  // the gradient in bf16, or null and then
  const float* grad32;         // the gradient in fp32
  float* exp_avg;
  float* exp_avg_sq;
  const float* step;
  int64_t numel;
};

struct MasterAdamWScalars {
  const float* lr;
  const float* found_inf;
  const float* clip_coef;  // null: 1
  double beta1, beta2, weight_decay, eps;
};

cudaError_t master_adamw(const MasterAdamWTensor* tensors, int count, MasterAdamWScalars s, cudaStream_t stream);

}  // namespace loongforge::kernels
