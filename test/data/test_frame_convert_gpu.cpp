// Proves the device resize (cuda/data frames_resize_to_chw_launch) against
// frame_math.hpp's resized_pixel() computed on the host, which test_frames
// holds to the CPU path (ATen's adaptive_avg_pool2d and the normalisation):
// equal bit for bit, for a downscale, a non-integer ratio, an upscale and odd
// sizes that do not fill a block; and the same for frames padded to a square
// on the way (frames_pad_resize_to_chw_launch against padded_resized_pixel(),
// data.image_aspect pad: wide, upright, odd and upscaled frames). GPU only.
#include <cuda_runtime.h>  // cudaMalloc, cudaMemcpy

#include <cstring>  // std::memcmp
#include <random>   // std::mt19937
#include <vector>   // std::vector

#include "catch_compat.hpp"
#include "frame_convert.cuh"
#include "frame_math.hpp"

using loongforge::cuda::frames_pad_resize_to_chw_launch;
using loongforge::cuda::frames_resize_to_chw_launch;
using loongforge::cuda::padded_resized_pixel;
using loongforge::cuda::resized_pixel;

namespace {
void check(cudaError_t e) { REQUIRE(e == cudaSuccess); }

std::vector<float> on_host(const std::vector<uint8_t>& src, int64_t n, int64_t h, int64_t w, int64_t S,
                           bool pad = false) {
  std::vector<float> out(static_cast<size_t>(n * 3 * S * S));
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x)
          out[static_cast<size_t>(((i * 3 + c) * S + y) * S + x)] =
              pad ? padded_resized_pixel(src.data() + i * h * w * 3, h, w, S, y, x, c)
                  : resized_pixel(src.data() + i * h * w * 3, h, w, S, y, x, c);
  return out;
}
}  // namespace

TEST_CASE("cuda: frames resized on the device equal the host arithmetic bit for bit") {
  struct Size {
    int64_t n, h, w, S;
  };
  for (const Size& z : {Size{3, 256, 256, 224}, Size{2, 240, 320, 64}, Size{2, 37, 53, 224}, Size{5, 100, 77, 64}}) {
    std::mt19937 rng(static_cast<unsigned>(z.h * 1000 + z.w));
    std::vector<uint8_t> src(static_cast<size_t>(z.n * z.h * z.w * 3));
    for (auto& v : src) v = static_cast<uint8_t>(rng() & 0xFF);
    const std::vector<float> want = on_host(src, z.n, z.h, z.w, z.S);
    uint8_t* d_src = nullptr;
    float* d_dst = nullptr;
    check(cudaMalloc(&d_src, src.size()));
    check(cudaMalloc(&d_dst, want.size() * sizeof(float)));
    check(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
    check(cudaMemset(d_dst, 0xFF, want.size() * sizeof(float)));  // poison: NaN everywhere
    check(frames_resize_to_chw_launch(d_src, d_dst, z.n, z.h, z.w, z.S, nullptr));
    std::vector<float> got(want.size());
    check(cudaMemcpy(got.data(), d_dst, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    INFO(z.n << " frames " << z.h << "x" << z.w << " -> " << z.S);
    REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    cudaFree(d_src);
    cudaFree(d_dst);
  }
}

TEST_CASE("cuda: frames padded to a square on the device equal the host arithmetic bit for bit") {
  struct Size {
    int64_t n, h, w, S;
  };
  for (const Size& z : {Size{2, 240, 320, 64}, Size{2, 320, 240, 64}, Size{3, 31, 44, 16}, Size{2, 37, 53, 224},
                        Size{5, 100, 77, 64}}) {
    std::mt19937 rng(static_cast<unsigned>(z.h * 1000 + z.w + 7));
    std::vector<uint8_t> src(static_cast<size_t>(z.n * z.h * z.w * 3));
    for (auto& v : src) v = static_cast<uint8_t>(1 + rng() % 255);  // no black pixel of its own
    const std::vector<float> want = on_host(src, z.n, z.h, z.w, z.S, /*pad=*/true);
    uint8_t* d_src = nullptr;
    float* d_dst = nullptr;
    check(cudaMalloc(&d_src, src.size()));
    check(cudaMalloc(&d_dst, want.size() * sizeof(float)));
    check(cudaMemcpy(d_src, src.data(), src.size(), cudaMemcpyHostToDevice));
    check(cudaMemset(d_dst, 0xFF, want.size() * sizeof(float)));  // poison: NaN everywhere
    check(frames_pad_resize_to_chw_launch(d_src, d_dst, z.n, z.h, z.w, z.S, nullptr));
    std::vector<float> got(want.size());
    check(cudaMemcpy(got.data(), d_dst, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    INFO(z.n << " frames " << z.h << "x" << z.w << " padded -> " << z.S);
    REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    REQUIRE(want != on_host(src, z.n, z.h, z.w, z.S));  // the pad changes the image (black bars)
    cudaFree(d_src);
    cudaFree(d_dst);
  }
}
