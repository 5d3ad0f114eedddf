// Proves the frames_to_chw kernel (cuda/data) against a CPU reference:
// uint8 HWC frames become normalized CHW fp32 (exact to 1e-6) and bf16
// (within bf16 rounding), for odd sizes that do not fill a block. GPU only.
#include <cuda_bf16.h>      // __nv_bfloat16, __bfloat162float
#include <cuda_runtime.h>   // cudaMalloc, cudaMemcpy

#include <cmath>    // std::fabs
#include <random>   // std::mt19937
#include <vector>   // std::vector

#include "catch_compat.hpp"
#include "frame_convert.cuh"

using loongforge::cuda::frames_to_chw_launch;
using loongforge::cuda::OutDType;

namespace {
void check(cudaError_t e) { REQUIRE(e == cudaSuccess); }

std::vector<float> reference(const std::vector<uint8_t>& src, int64_t n, int64_t h, int64_t w, const float* mean,
                             const float* stdev) {
  std::vector<float> out(static_cast<size_t>(n * 3 * h * w));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c)
          out[((i * 3 + c) * h + y) * w + x] = (src[((i * h + y) * w + x) * 3 + c] / 255.0f - mean[c]) / stdev[c];
  return out;
}
}  // namespace

TEST_CASE("cuda: frames_to_chw matches the CPU reference in fp32 and bf16") {
  const int64_t n = 3, h = 37, w = 53;
  const float mean[3] = {0.5f, 0.4f, 0.3f}, stdev[3] = {0.5f, 0.25f, 0.2f};
  std::mt19937 rng(7);
  std::vector<uint8_t> src(static_cast<size_t>(n * h * w * 3));
  for (auto& v : src) v = static_cast<uint8_t>(rng() & 0xFF);
  const auto ref = reference(src, n, h, w, mean, stdev);

  uint8_t* d_src = nullptr;
  void* d_dst = nullptr;
  check(cudaMalloc(&d_src, src.size()));
  check(cudaMalloc(&d_dst, ref.size() * sizeof(float)));
  check(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));

  check(cudaMemset(d_dst, 0xFF, ref.size() * sizeof(float)));  // poison: NaN everywhere
  check(frames_to_chw_launch(d_src, d_dst, OutDType::Float32, n, h, w, mean, stdev, nullptr));
  std::vector<float> got(ref.size());
  check(cudaMemcpy(got.data(), d_dst, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::fabs(got[i] - ref[i])));
  INFO("fp32 max abs error " << max_err);
  REQUIRE(max_err < 1e-5);

  check(cudaMemset(d_dst, 0xFF, ref.size() * sizeof(float)));
  check(frames_to_chw_launch(d_src, d_dst, OutDType::BFloat16, n, h, w, mean, stdev, nullptr));
  std::vector<__nv_bfloat16> got16(ref.size());
  check(cudaMemcpy(got16.data(), d_dst, got16.size() * 2, cudaMemcpyDeviceToHost));
  double max_rel = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float v = __bfloat162float(got16[i]);
    REQUIRE(std::isfinite(v));
    max_rel = std::max(max_rel, static_cast<double>(std::fabs(v - ref[i]) / std::max(1e-2f, std::fabs(ref[i]))));
  }
  INFO("bf16 max relative error " << max_rel);
  REQUIRE(max_rel < 1.0 / 128);  // bf16 keeps 8 significant bits
  cudaFree(d_src);
  cudaFree(d_dst);
}
