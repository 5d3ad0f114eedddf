// uint8 HWC -> normalized CHW (fp32 or bf16). One thread per output pixel
// triple: reads 3 contiguous bytes, writes 3 planes.
#include "frame_convert.cuh"

#include <cuda_bf16.h>  // __nv_bfloat16, __float2bfloat16

namespace loongforge::cuda {

namespace {

struct Norm {
  float scale[3];  // 1 / (255 * std)
  float shift[3];  // -mean / std
};

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

template <typename T>
__global__ void frames_to_chw_forward_kernel(const uint8_t* __restrict__ src,  // (N, H, W, 3)
                                             T* __restrict__ dst,              // (N, 3, H, W)
                                             int64_t n, int64_t hw, Norm norm) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * hw) return;
  const int64_t img = idx / hw;
  const int64_t pix = idx - img * hw;
  const uint8_t* p = src + idx * 3;
  T* out = dst + img * 3 * hw + pix;
#pragma unroll
  for (int c = 0; c < 3; ++c) out[c * hw] = from_float<T>(p[c] * norm.scale[c] + norm.shift[c]);
}

}  // namespace

cudaError_t frames_to_chw_launch(const uint8_t* src, void* dst, OutDType dtype, int64_t n, int64_t h, int64_t w,
                                 const float mean[3], const float stdev[3], cudaStream_t stream) {
  if (n <= 0 || h <= 0 || w <= 0) return cudaSuccess;
  Norm norm;
  for (int c = 0; c < 3; ++c) {
    norm.scale[c] = 1.0f / (255.0f * stdev[c]);
    norm.shift[c] = -mean[c] / stdev[c];
  }
  const int64_t total = n * h * w;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((total + threads - 1) / threads);
  if (dtype == OutDType::Float32) {
    frames_to_chw_forward_kernel<float><<<blocks, threads, 0, stream>>>(src, static_cast<float*>(dst), n, h * w, norm);
  } else {
    frames_to_chw_forward_kernel<__nv_bfloat16>
        <<<blocks, threads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n, h * w, norm);
  }
  return cudaGetLastError();
}

}  // namespace loongforge::cuda
