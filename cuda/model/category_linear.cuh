// GR00T's per-embodiment ("category-specific") linear as segment GEMMs on the
// GPU: y[b] = x[b] @ W[ids[b]] + bias[ids[b]] for a batch with any mix of slot
// ids, without gathering B copies of the weights (issue #11 item 4).
//
// Contract
// - Shapes: x (B, T, K) bf16, W (E, K, N) and bias (E, N) of type WT (float or
//   bf16), ids (B,) int64 in [0, E). Everything contiguous, on one device.
// - category_linear_plan groups the batch by slot on the device (no host sync,
//   CUDA-graph safe): a stable counting sort of the samples by id into
//   `plan` (plan_ints(B, E) ints). Every other call reads that plan; the plan
//   of one ids tensor serves the forward and both backward kernels.
//   An id outside [0, E) stops the kernel with a device-side trap (as
//   PyTorch's indexing does): the stream reports an error.
// - Numerics: inputs are rounded to bf16 (W on load), products accumulate in
//   fp32 on tensor cores. Forward output y (B, T, N) of type WT: fp32 sum + bias.
//   grad_input dx = dy @ W[id]^T (dy of type WT rounded to bf16), bf16 output.
//   grad_weight dW[e] = sum over the rows of slot e of x^T dy, and
//   dbias[e] = sum of dy over those rows, both of type WT, accumulated in fp32
//   in one pass over the rows (deterministic: no atomics); slots no sample uses
//   get zeros (every element of dW and dbias is written).
// - Work per call: each used slot's weights are read once per output tile
//   column, never copied; rows of one slot share a tile.
// - No libtorch headers (cuda/CMakeLists.txt); errors come back as cudaError_t.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace loongforge::kernels {

// Ints the plan of a batch of B samples over E slots needs (device memory).
int64_t category_plan_ints(int64_t B, int64_t E);

cudaError_t category_linear_plan(const int64_t* ids, int B, int E, int T, int* plan, cudaStream_t stream);

template <typename WT>
cudaError_t category_linear_forward(const __nv_bfloat16* x, const WT* weight, const WT* bias, const int* plan, int B,
                                    int E, int T, int K, int N, WT* y, cudaStream_t stream);

template <typename WT>
cudaError_t category_linear_grad_input(const WT* dy, const WT* weight, const int* plan, int B, int E, int T, int K,
                                       int N, __nv_bfloat16* dx, cudaStream_t stream);

template <typename WT>
cudaError_t category_linear_grad_weight(const __nv_bfloat16* x, const WT* dy, const int* plan, int B, int E, int T,
                                        int K, int N, WT* dweight, WT* dbias, cudaStream_t stream);

}  // namespace loongforge::kernels
