// AdamW on fp32 masters with bf16 working copies (contract: master_adamw.cuh).
//
// One launch covers up to kTensors tensors: the launch's blocks are split
// into runs of consecutive blocks, one run per tensor, each block updating one
// chunk of kChunk elements of its tensor (the block finds its tensor in the
// prefix table of the launch's arguments). Memory-bound: per element it reads
// 2 (or 4) + 4 + 4 + 4 bytes (gradient, master, moments) and writes 4 + 4 + 4 + 2.
#include "master_adamw.cuh"

#include <algorithm>

namespace loongforge::kernels {
namespace {

constexpr int kTensors = 24;
constexpr int kThreads = 256;
constexpr int64_t kChunk = 65536;  // elements per block

struct Launch {
  MasterAdamWTensor t[kTensors];
  int64_t first_block[kTensors + 1];  // block runs: tensor i owns [first_block[i], first_block[i + 1])
  int count;
};
static_assert(sizeof(Launch) <= 4096, "a kernel's arguments must fit in 4 KB");

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

__global__ void __launch_bounds__(kThreads) master_adamw_kernel(Launch a, MasterAdamWScalars s) {
  if (*s.found_inf == 1.0f) return;
  const int64_t block = blockIdx.x;
  int i = 0;
  while (i + 1 < a.count && a.first_block[i + 1] <= block) ++i;
  const MasterAdamWTensor& t = a.t[i];
  const int64_t begin = (block - a.first_block[i]) * kChunk;
  const int64_t end = min(begin + kChunk, t.numel);

  const float steps = *t.step;
  Step st;
  st.lr = *s.lr;
  st.beta1 = static_cast<float>(s.beta1), st.beta2 = static_cast<float>(s.beta2);
  st.weight_decay = static_cast<float>(s.weight_decay), st.eps = static_cast<float>(s.eps);
  st.bias_correction1 = 1 - powf(st.beta1, steps);
  st.bias_correction2_sqrt = sqrtf(1 - powf(st.beta2, steps));
  st.coef = s.clip_coef ? *s.clip_coef : 1.0f;

  const bool half = t.grad != nullptr;
  const bool vector = (t.numel % 4 == 0) && (reinterpret_cast<uintptr_t>(t.master) % 16 == 0) &&
                      (reinterpret_cast<uintptr_t>(t.exp_avg) % 16 == 0) &&
                      (reinterpret_cast<uintptr_t>(t.exp_avg_sq) % 16 == 0) &&
                      (reinterpret_cast<uintptr_t>(t.weight) % 8 == 0) &&
                      (half ? reinterpret_cast<uintptr_t>(t.grad) % 8 == 0
                            : reinterpret_cast<uintptr_t>(t.grad32) % 16 == 0);
  if (vector) {
    for (int64_t k = begin + 4 * static_cast<int64_t>(threadIdx.x); k < end; k += 4 * kThreads) {
      float4 p = *reinterpret_cast<const float4*>(t.master + k);
      float4 m = *reinterpret_cast<const float4*>(t.exp_avg + k);
      float4 v = *reinterpret_cast<const float4*>(t.exp_avg_sq + k);
      float4 g;
      if (half) {
        const uint2 graw = *reinterpret_cast<const uint2*>(t.grad + k);
        const __nv_bfloat162 g01 = *reinterpret_cast<const __nv_bfloat162*>(&graw.x);
        const __nv_bfloat162 g23 = *reinterpret_cast<const __nv_bfloat162*>(&graw.y);
        g = make_float4(__low2float(g01), __high2float(g01), __low2float(g23), __high2float(g23));
      } else {
        g = *reinterpret_cast<const float4*>(t.grad32 + k);
      }
      st.apply(p.x, m.x, v.x, g.x);
      st.apply(p.y, m.y, v.y, g.y);
      st.apply(p.z, m.z, v.z, g.z);
      st.apply(p.w, m.w, v.w, g.w);
      *reinterpret_cast<float4*>(t.master + k) = p;
      *reinterpret_cast<float4*>(t.exp_avg + k) = m;
      *reinterpret_cast<float4*>(t.exp_avg_sq + k) = v;
      __nv_bfloat162 w01 = __floats2bfloat162_rn(p.x, p.y), w23 = __floats2bfloat162_rn(p.z, p.w);
      uint2 wraw;
      wraw.x = *reinterpret_cast<const unsigned*>(&w01);
      wraw.y = *reinterpret_cast<const unsigned*>(&w23);
      *reinterpret_cast<uint2*>(t.weight + k) = wraw;
    }
    return;
  }
  for (int64_t k = begin + threadIdx.x; k < end; k += kThreads) {
    float p = t.master[k], m = t.exp_avg[k], v = t.exp_avg_sq[k];
    st.apply(p, m, v, half ? __bfloat162float(t.grad[k]) : t.grad32[k]);
    t.master[k] = p, t.exp_avg[k] = m, t.exp_avg_sq[k] = v;
    t.weight[k] = __float2bfloat16_rn(p);
  }
}

}  // namespace

cudaError_t master_adamw(const MasterAdamWTensor* tensors, int count, MasterAdamWScalars s, cudaStream_t stream) {
  int done = 0;
  while (done < count) {
    Launch a{};
    a.count = 0;
    int64_t blocks = 0;
    for (; done < count && a.count < kTensors; ++done) {
      if (tensors[done].numel <= 0) continue;
      a.t[a.count] = tensors[done];
      a.first_block[a.count] = blocks;
      blocks += (tensors[done].numel + kChunk - 1) / kChunk;
      ++a.count;
    }
    if (a.count == 0) break;
    a.first_block[a.count] = blocks;
    master_adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, s);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace loongforge::kernels
