// AdamW on fp32 parameters with or without bf16 working copies, and the
// gradients' squared norm (contract: master_adamw.cuh).
//
// Both kernels split a launch's blocks into runs of consecutive blocks, one
// run per tensor, each block working on one chunk of its tensor (the block
// finds its tensor in the prefix table of the launch's arguments). Both are
// memory-bound. AdamW per element reads 2 (or 4) + 4 + 4 + 4 bytes
// (gradient, parameter, moments) and writes 4 + 4 + 4 (+ 2 for a copy); its
// chunks are small (16384 elements) so that a launch's last blocks, which run
// while the GPU drains, are short.
#include "master_adamw.cuh"

#include <algorithm>

namespace loongforge::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T, int N>
struct Launch {
  T t[N];
  int64_t first_block[N + 1];  // block runs: tensor i owns [first_block[i], first_block[i + 1])
  int count;
};

template <typename T, int N>
__device__ __forceinline__ int tensor_of(const Launch<T, N>& a, int64_t block) {
  int i = 0;
  while (i + 1 < a.count && a.first_block[i + 1] <= block) ++i;
  return i;
}

// Fills launches of up to N non-empty items of `items` (blocks of `chunk`
// elements each) and calls launch(a, blocks, first_block_overall) for each.
template <typename T, int N, typename F>
cudaError_t for_each_launch(const T* items, int count, int64_t chunk, F launch) {
  int done = 0;
  int64_t before = 0;
  while (done < count) {
    Launch<T, N> a{};
    a.count = 0;
    int64_t blocks = 0;
    for (; done < count && a.count < N; ++done) {
      if (items[done].numel <= 0) continue;
      a.t[a.count] = items[done];
      a.first_block[a.count] = blocks;
      blocks += (items[done].numel + chunk - 1) / chunk;
      ++a.count;
    }
    if (a.count == 0) break;
    a.first_block[a.count] = blocks;
    launch(a, blocks, before);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    before += blocks;
  }
  return cudaSuccess;
}

// ---------------------------------------------------------------------------
// AdamW

constexpr int kAdamTensors = 48;
constexpr int64_t kAdamChunk = 16384;  // elements per block
using AdamLaunch = Launch<MasterAdamWTensor, kAdamTensors>;
static_assert(sizeof(AdamLaunch) <= 4096, "a kernel's arguments must fit in 4 KB");

// The update of one element, in the arithmetic of ATen's fused AdamW as
// torch 2.11 compiles it (ADAMW mode, float parameters: adam_math in
// ATen/native/cuda/fused_adam_utils.cuh): every scalar -- the learning rate,
// the betas, the decay, eps and both bias corrections -- in float, and the
// moments as two fused multiply-adds each, m = fma(b1, m, fma(-b1, g, g)).
// (This kernel first followed an older ATen, whose scalars were double: its
// (1 - beta2) differs from float's by 1.3e-5 relative, and so did its second
// moments from torch 2.11's, 1.28e-5 in test_trainer_gpu's optimizer case.)
struct Step {
  float lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt, coef;

  __device__ __forceinline__ void apply(float& param, float& exp_avg, float& exp_avg_sq, float grad) const {
    grad = grad * coef;  // what _foreach_mul_ by the clipping coefficient leaves in an fp32 gradient
    if (weight_decay != 0) param -= lr * weight_decay * param;
    exp_avg = fmaf(beta1, exp_avg, fmaf(-beta1, grad, grad));
    exp_avg_sq = fmaf(beta2, exp_avg_sq, fmaf(-beta2, grad * grad, grad * grad));
    const float step_size = lr / bias_correction1;
    const float denom = (sqrtf(exp_avg_sq) / bias_correction2_sqrt) + eps;
    param -= step_size * exp_avg / denom;
  }
};

__device__ __forceinline__ float4 load_grad4(const MasterAdamWTensor& t, int64_t k) {
  if (!t.grad) return *reinterpret_cast<const float4*>(t.grad32 + k);
  const uint2 raw = *reinterpret_cast<const uint2*>(t.grad + k);
  const __nv_bfloat162 g01 = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
  const __nv_bfloat162 g23 = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
  return make_float4(__low2float(g01), __high2float(g01), __low2float(g23), __high2float(g23));
}

__global__ void __launch_bounds__(kThreads) master_adamw_kernel(AdamLaunch a, MasterAdamWScalars s) {
  if (*s.found_inf == 1.0f) return;
  const int64_t block = blockIdx.x;
  const int i = tensor_of(a, block);
  const MasterAdamWTensor& t = a.t[i];
  const int64_t begin = (block - a.first_block[i]) * kAdamChunk;
  const int64_t end = min(begin + kAdamChunk, t.numel);

  const float steps = *t.step;
  Step st;
  st.lr = *s.lr;
  st.beta1 = static_cast<float>(s.beta1), st.beta2 = static_cast<float>(s.beta2);
  st.weight_decay = t.weight_decay, st.eps = static_cast<float>(s.eps);
  st.bias_correction1 = 1 - powf(st.beta1, steps);
  st.bias_correction2_sqrt = sqrtf(1 - powf(st.beta2, steps));
  st.coef = s.clip_coef ? *s.clip_coef : 1.0f;

  const bool vector = (t.numel % 4 == 0) && (reinterpret_cast<uintptr_t>(t.master) % 16 == 0) &&
                      (reinterpret_cast<uintptr_t>(t.exp_avg) % 16 == 0) &&
                      (reinterpret_cast<uintptr_t>(t.exp_avg_sq) % 16 == 0) &&
                      (reinterpret_cast<uintptr_t>(t.weight) % 8 == 0) &&
                      (t.grad ? reinterpret_cast<uintptr_t>(t.grad) % 8 == 0
                              : reinterpret_cast<uintptr_t>(t.grad32) % 16 == 0);
  if (vector) {
    for (int64_t k = begin + 4 * static_cast<int64_t>(threadIdx.x); k < end; k += 4 * kThreads) {
      float4 p = *reinterpret_cast<const float4*>(t.master + k);
      float4 m = *reinterpret_cast<const float4*>(t.exp_avg + k);
      float4 v = *reinterpret_cast<const float4*>(t.exp_avg_sq + k);
      const float4 g = load_grad4(t, k);
      st.apply(p.x, m.x, v.x, g.x);
      st.apply(p.y, m.y, v.y, g.y);
      st.apply(p.z, m.z, v.z, g.z);
      st.apply(p.w, m.w, v.w, g.w);
      *reinterpret_cast<float4*>(t.master + k) = p;
      *reinterpret_cast<float4*>(t.exp_avg + k) = m;
      *reinterpret_cast<float4*>(t.exp_avg_sq + k) = v;
      if (t.weight) {
        __nv_bfloat162 w01 = __floats2bfloat162_rn(p.x, p.y), w23 = __floats2bfloat162_rn(p.z, p.w);
        uint2 raw;
        raw.x = *reinterpret_cast<const unsigned*>(&w01);
        raw.y = *reinterpret_cast<const unsigned*>(&w23);
        *reinterpret_cast<uint2*>(t.weight + k) = raw;
      }
    }
    return;
  }
  for (int64_t k = begin + threadIdx.x; k < end; k += kThreads) {
    float p = t.master[k], m = t.exp_avg[k], v = t.exp_avg_sq[k];
    st.apply(p, m, v, t.grad ? __bfloat162float(t.grad[k]) : t.grad32[k]);
    t.master[k] = p, t.exp_avg[k] = m, t.exp_avg_sq[k] = v;
    if (t.weight) t.weight[k] = __float2bfloat16_rn(p);
  }
}

// ---------------------------------------------------------------------------
// Squared norms

constexpr int kNormSpans = 64;
constexpr int64_t kNormChunk = 32768;
using NormLaunch = Launch<GradSpan, kNormSpans>;
static_assert(sizeof(NormLaunch) <= 4096, "a kernel's arguments must fit in 4 KB");

__device__ __forceinline__ float square_sum(uint4 raw) {  // 8 bf16
  float s = 0;
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    s = fmaf(f.x, f.x, s);
    s = fmaf(f.y, f.y, s);
  }
  return s;
}

__global__ void __launch_bounds__(kThreads) grad_square_sums_kernel(NormLaunch a, float* partials) {
  const int64_t block = blockIdx.x;
  const int i = tensor_of(a, block);
  const GradSpan& t = a.t[i];
  const int64_t begin = (block - a.first_block[i]) * kNormChunk;
  const int64_t end = min(begin + kNormChunk, t.numel);
  float sum = 0;
  if (t.bf16) {
    const __nv_bfloat16* g = static_cast<const __nv_bfloat16*>(t.data);
    if (t.numel % 8 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0) {
      for (int64_t k = begin + 8 * static_cast<int64_t>(threadIdx.x); k < end; k += 8 * kThreads)
        sum += square_sum(*reinterpret_cast<const uint4*>(g + k));
    } else {
      for (int64_t k = begin + threadIdx.x; k < end; k += kThreads) {
        const float f = __bfloat162float(g[k]);
        sum = fmaf(f, f, sum);
      }
    }
  } else {
    const float* g = static_cast<const float*>(t.data);
    if (t.numel % 4 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0) {
      for (int64_t k = begin + 4 * static_cast<int64_t>(threadIdx.x); k < end; k += 4 * kThreads) {
        const float4 f = *reinterpret_cast<const float4*>(g + k);
        sum += fmaf(f.x, f.x, fmaf(f.y, f.y, fmaf(f.z, f.z, f.w * f.w)));
      }
    } else {
      for (int64_t k = begin + threadIdx.x; k < end; k += kThreads) sum = fmaf(g[k], g[k], sum);
    }
  }
  // The block's sum: within each warp, then across the warps, in a fixed order.
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    partials[block] = total;
  }
}

}  // namespace

cudaError_t master_adamw(const MasterAdamWTensor* tensors, int count, MasterAdamWScalars s, cudaStream_t stream) {
  return for_each_launch<MasterAdamWTensor, kAdamTensors>(
      tensors, count, kAdamChunk, [&](const AdamLaunch& a, int64_t blocks, int64_t /*before*/) {
        master_adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, s);
      });
}

int64_t grad_square_sum_blocks(const GradSpan* spans, int count) {
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i)
    if (spans[i].numel > 0) blocks += (spans[i].numel + kNormChunk - 1) / kNormChunk;
  return blocks;
}

cudaError_t grad_square_sums(const GradSpan* spans, int count, float* partials, cudaStream_t stream) {
  return for_each_launch<GradSpan, kNormSpans>(
      spans, count, kNormChunk, [&](const NormLaunch& a, int64_t blocks, int64_t before) {
        grad_square_sums_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, partials + before);
      });
}

}  // namespace loongforge::kernels
