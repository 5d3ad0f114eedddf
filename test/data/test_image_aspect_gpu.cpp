// Proves that data.image_aspect pad resizes on the device as on the CPU: a micro-batch's uint8 images
// (B, V, h, w, 3) finished on the GPU (finish_images -> model_images -> resize_frames: cuda/data's
// kernel reading the pad as zeros in place) equal the same images finished on the CPU (ATen's zero pad
// and adaptive_avg_pool2d) bit for bit, for wide, upright and odd frames, with a skipped sample's zeros;
// and without the pad the two differ (the pad is what both apply). GPU only (label gpu).
#include <vector>  // std::vector

#include <ATen/ATen.h>  // at::randint, at::equal

#include "catch_compat.hpp"
#include "loongforge/data/source.hpp"

using namespace loongforge::data;

TEST_CASE("image aspect gpu: images padded to a square and resized on the device equal the CPU's bit for bit") {
  struct Size {
    int64_t h, w, S;
  };
  const std::vector<int64_t> blank = {1};  // sample 1 skipped for a bad video: zeros after the resize
  for (const Size& z : {Size{240, 320, 64}, Size{320, 240, 64}, Size{37, 53, 224}, Size{100, 77, 64}}) {
    INFO(z.h << "x" << z.w << " -> " << z.S);
    const at::Tensor u8 = at::randint(1, 256, {3, 2, z.h, z.w, 3}, at::kByte);  // (B, V, h, w, 3)
    Batch cpu{{"images", u8.clone()}}, gpu{{"images", u8.to(at::kCUDA)}}, gpu_squash{{"images", u8.to(at::kCUDA)}};
    finish_images(cpu, z.S, blank, /*pad_square=*/true);
    finish_images(gpu, z.S, blank, /*pad_square=*/true);
    finish_images(gpu_squash, z.S, blank, /*pad_square=*/false);
    REQUIRE(gpu.at("images").is_cuda());
    REQUIRE(gpu.at("images").sizes() == at::IntArrayRef({3, 2, 3, z.S, z.S}));
    REQUIRE(at::equal(gpu.at("images").cpu(), cpu.at("images")));
    REQUIRE(gpu.at("images")[1].abs().sum().item<float>() == 0.0f);
    REQUIRE_FALSE(at::equal(gpu_squash.at("images").cpu(), cpu.at("images")));
  }
}
