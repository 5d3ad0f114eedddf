// uint8 HWC frames -> the model's (n, 3, S, S) float32 input: the CPU path's
// resize and normalisation (frame_math.hpp) on the device.
#include "frame_convert.cuh"

#include "frame_math.hpp"

namespace loongforge::cuda {

namespace {

// kPad: each frame centered on a black max(h, w) square first (padded_resized_pixel).
template <bool kPad>
__global__ void frames_resize_to_chw_kernel(const uint8_t* __restrict__ src,  // (n, h, w, 3)
                                            float* __restrict__ dst,          // (n, 3, S, S)
                                            int64_t n, int64_t h, int64_t w, int64_t S) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t plane = S * S;
  if (idx >= n * plane) return;
  const int64_t img = idx / plane, pix = idx - img * plane;
  const int64_t oy = pix / S, ox = pix - oy * S;
  const uint8_t* frame = src + img * h * w * 3;
  float* out = dst + img * 3 * plane + pix;
#pragma unroll
  for (int c = 0; c < 3; ++c)
    out[c * plane] = kPad ? padded_resized_pixel(frame, h, w, S, oy, ox, c) : resized_pixel(frame, h, w, S, oy, ox, c);
}

template <bool kPad>
cudaError_t launch(const uint8_t* src, float* dst, int64_t n, int64_t h, int64_t w, int64_t S, cudaStream_t stream) {
  if (n <= 0 || h <= 0 || w <= 0 || S <= 0) return cudaSuccess;
  const int64_t total = n * S * S;
  const int threads = 256;
  const auto blocks = static_cast<unsigned>((total + threads - 1) / threads);
  frames_resize_to_chw_kernel<kPad><<<blocks, threads, 0, stream>>>(src, dst, n, h, w, S);
  return cudaGetLastError();
}

}  // namespace

cudaError_t frames_resize_to_chw_launch(const uint8_t* src, float* dst, int64_t n, int64_t h, int64_t w, int64_t S,
                                        cudaStream_t stream) {
  return launch<false>(src, dst, n, h, w, S, stream);
}

cudaError_t frames_pad_resize_to_chw_launch(const uint8_t* src, float* dst, int64_t n, int64_t h, int64_t w,
                                            int64_t S, cudaStream_t stream) {
  return launch<true>(src, dst, n, h, w, S, stream);
}

}  // namespace loongforge::cuda
