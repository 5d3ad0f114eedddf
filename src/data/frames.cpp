// Decoded frames to the model's image input (contract in frames.hpp).
#include "loongforge/data/frames.hpp"

#include <algorithm>  // std::max, std::min, std::fill
#include <cmath>      // std::nearbyint
#include <vector>     // std::vector

#include <ATen/ATen.h>  // at::adaptive_avg_pool2d, at::_upsample_bicubic2d_aa, at::_upsample_bilinear2d_aa, at::rand
#include <ATen/CPUGeneratorImpl.h>  // at::CPUGeneratorImpl
#include <ATen/Parallel.h>          // at::parallel_for

#include "frame_math.hpp"  // cuda/data: the box resize's arithmetic, plain C++ here
#include "loongforge/common/error.hpp"
#include "loongforge/data/area_resize.hpp"

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>  // c10::cuda::getCurrentCUDAStream

#include "frame_convert.cuh"
#endif

namespace loongforge::data {

namespace {
// Note [Box resize on the CPU]
// ATen's path (the frame to float, constant_pad_nd, adaptive_avg_pool2d, the normalisation) converts
// every full-size pixel to float and pools it: most of the CPU time of a small model's data (perf, n16-tiny,
// 256x256 frames to 64x64: the pool 13% of the trainer's cycles and the conversion 7%). This is the same
// arithmetic (cuda/data/frame_math.hpp, which the device kernel runs): ATen's adaptive-pooling windows over
// the (padded) frame, each window's sum -- exact, so in any order: here integer sums, each frame row's
// window columns first, then the window's rows -- divided by the row count, then by the column count, as
// float, then ((x / 255) - 0.5) / 0.5. Bit for bit ATen's (test_frames compares them). Exact only while a
// window's sum stays below 2^24 (windows under 65,793 pixels): resize_frames takes ATen's path beyond.
bool box_sums_exact(int64_t h, int64_t w, int64_t S) {
  const int64_t rows = (h + S - 1) / S + 1, cols = (w + S - 1) / S + 1;  // a window's largest extent
  return rows * cols < 65793;
}

void box_resize_cpu(const uint8_t* src, int64_t n, int64_t h, int64_t w, int64_t S, bool pad, float* out) {
  const int64_t H = pad ? std::max(h, w) : h, W = pad ? std::max(h, w) : w;  // the (padded) frame's size
  const int64_t top = (H - h) / 2, left = (W - w) / 2;
  // Output column ox: the frame's columns [x0, x1) inside its window, and the window's width (pad included).
  std::vector<int64_t> x0(static_cast<size_t>(S)), x1(static_cast<size_t>(S));
  std::vector<float> cols(static_cast<size_t>(S));
  for (int64_t ox = 0; ox < S; ++ox) {
    const int64_t b = cuda::window_begin(ox, W, S), e = cuda::window_end(ox, W, S);
    x0[static_cast<size_t>(ox)] = std::max(b, left) - left;
    x1[static_cast<size_t>(ox)] = std::min(e, left + w) - left;
    cols[static_cast<size_t>(ox)] = static_cast<float>(e - b);
  }
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> row_sums(static_cast<size_t>(h * S * 3));  // per frame row, per window column: RGB
    std::vector<int32_t> sums(static_cast<size_t>(S * 3));
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* frame = src + i * h * w * 3;
      for (int64_t y = 0; y < h; ++y) {
        const uint8_t* row = frame + y * w * 3;
        for (int64_t ox = 0; ox < S; ++ox) {
          int32_t r = 0, g = 0, b = 0;
          for (int64_t x = x0[static_cast<size_t>(ox)]; x < x1[static_cast<size_t>(ox)]; ++x)
            r += row[x * 3], g += row[x * 3 + 1], b += row[x * 3 + 2];
          int32_t* o = &row_sums[static_cast<size_t>((y * S + ox) * 3)];
          o[0] = r, o[1] = g, o[2] = b;
        }
      }
      float* dst = out + i * 3 * S * S;
      for (int64_t oy = 0; oy < S; ++oy) {
        const int64_t wy0 = cuda::window_begin(oy, H, S), wy1 = cuda::window_end(oy, H, S);
        const int64_t y0 = std::max(wy0, top) - top, y1 = std::min(wy1, top + h) - top;
        std::fill(sums.begin(), sums.end(), 0);
        for (int64_t y = y0; y < y1; ++y) {
          const int32_t* r = &row_sums[static_cast<size_t>(y * S * 3)];
          for (int64_t k = 0; k < S * 3; ++k) sums[static_cast<size_t>(k)] += r[k];
        }
        const auto rows = static_cast<float>(wy1 - wy0);
        for (int64_t ox = 0; ox < S; ++ox) {
          for (int64_t c = 0; c < 3; ++c) {
            const float mean =
                static_cast<float>(sums[static_cast<size_t>(ox * 3 + c)]) / rows / cols[static_cast<size_t>(ox)];
            dst[(c * S + oy) * S + ox] = ((mean / 255.0f) - 0.5f) / 0.5f;
          }
        }
      }
    }
  });
}
}  // namespace

at::Tensor resize_frames(const at::Tensor& u8, int64_t S, bool pad_square) {
  if (u8.scalar_type() != at::kByte || u8.dim() < 3 || u8.size(-1) != 3)
    throw DataError("resize_frames: expected uint8 frames (..., h, w, 3), got " + std::string(u8.toString()) +
                    " of " + std::to_string(u8.dim()) + " dimensions");
  std::vector<int64_t> lead(u8.sizes().begin(), u8.sizes().end() - 3);
  const int64_t h = u8.size(-3), w = u8.size(-2);
  int64_t n = 1;
  for (const int64_t d : lead) n *= d;
  std::vector<int64_t> out_shape = lead;
  out_shape.insert(out_shape.end(), {3, S, S});
  if (u8.is_cuda()) {
#if LOONGFORGE_WITH_CUDA_KERNELS
    const at::Tensor src = u8.contiguous();
    at::Tensor out = at::empty(out_shape, u8.options().dtype(at::kFloat));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(u8.device().index());
    const cudaError_t rc =
        pad_square && h != w
            ? cuda::frames_pad_resize_to_chw_launch(src.data_ptr<uint8_t>(), out.data_ptr<float>(), n, h, w, S, stream)
            : cuda::frames_resize_to_chw_launch(src.data_ptr<uint8_t>(), out.data_ptr<float>(), n, h, w, S, stream);
    if (rc != cudaSuccess)
      throw DataError(std::string("resizing frames on the device failed: ") + cudaGetErrorString(rc));
    return out;
#else
    throw DataError("resize_frames: frames on a CUDA device, but this build has no LoongForge CUDA kernels");
#endif
  }
  const int64_t side = std::max(h, w);
  if (pad_square ? box_sums_exact(side, side, S) : box_sums_exact(h, w, S)) {  // Note [Box resize on the CPU]
    const at::Tensor src = u8.contiguous();
    at::Tensor out = at::empty(out_shape, u8.options().dtype(at::kFloat));
    box_resize_cpu(src.data_ptr<uint8_t>(), n, h, w, S, pad_square && h != w, out.data_ptr<float>());
    return out;
  }
  at::Tensor f = u8.reshape({n, h, w, 3}).permute({0, 3, 1, 2}).to(at::kFloat).contiguous();  // (n, 3, h, w)
  if (pad_square && h != w) {  // (n, 3, q, q): black rows or columns around it (data.image_aspect pad)
    const int64_t q = std::max(h, w), left = (q - w) / 2, top = (q - h) / 2;
    f = at::constant_pad_nd(f, {left, q - w - left, top, q - h - top}, 0).contiguous();
  }
  const at::Tensor pooled = at::adaptive_avg_pool2d(f, {S, S});  // (n, 3, S, S)
  return (((pooled / 255.0) - 0.5) / 0.5).reshape(out_shape);
}

namespace {
// (n, h, w, 3) uint8 -> (n, 3, h, w), or (n, 3, q, q) padded with zeros when letterboxed (frames.hpp).
at::Tensor chw_frames(const at::Tensor& u8, bool letterbox) {
  at::Tensor x = u8.permute({0, 3, 1, 2}).contiguous();
  if (letterbox && x.size(2) != x.size(3)) {
    const int64_t h = x.size(2), w = x.size(3), q = std::max(h, w), left = (q - w) / 2, top = (q - h) / 2;
    x = at::constant_pad_nd(x, {left, q - w - left, top, q - h - top}, 0).contiguous();
  }
  return x;
}

// (n, 3, h, w) uint8 to side x side by ATen's antialiased bicubic or bilinear interpolation (none when it is).
at::Tensor resize_aa(const at::Tensor& x, int64_t side, bool bicubic) {
  if (x.size(-2) == side && x.size(-1) == side) return x;
  return bicubic ? at::_upsample_bicubic2d_aa(x, {side, side}, /*align_corners=*/false)
                 : at::_upsample_bilinear2d_aa(x, {side, side}, /*align_corners=*/false);
}
}  // namespace

at::Tensor resize_frames_bicubic_aa(const at::Tensor& u8, int64_t E, double f, int64_t T, int64_t S,
                                    bool letterbox) {
  const auto resize = [](const at::Tensor& x, int64_t side) { return resize_aa(x, side, /*bicubic=*/true); };
  if (T <= 0) T = S;
  at::Tensor x = resize(chw_frames(u8, letterbox), E > 0 ? E : T);  // (n, 3, E, E)
  if (f > 0.0 && f < 1.0) {
    const auto side = [&](int64_t n) {
      return std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(static_cast<double>(n) * f)));
    };
    const int64_t ch = side(x.size(2)), cw = side(x.size(3));
    x = x.narrow(2, (x.size(2) - ch) / 2, ch).narrow(3, (x.size(3) - cw) / 2, cw).contiguous();
  }
  x = resize(resize(x, T), S);  // (n, 3, T, T), then (n, 3, S, S) uint8
  // As upstream's Qwen3-VL processor normalises, its rescale fused into mean and std (0.5 * 255):
  // (v - 127.5) / 127.5 in float32, not ((v / 255) - 0.5) / 0.5 (docs/training-semantics.md s3).
  return (x.to(at::kFloat) - 127.5) / 127.5;
}

namespace {
at::Tensor bilinear_aa_chw_rest(at::Tensor x, double f, int64_t S, double pos_y, double pos_x) {  // (n, 3, T, T)
  const auto resize = [](const at::Tensor& y, int64_t side) { return resize_aa(y, side, /*bicubic=*/false); };
  const int64_t T = x.size(2);
  if (f > 0.0 && f < 1.0) {
    const int64_t c = std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(static_cast<double>(T) * f)));
    const auto offset = [&](double pos) {  // torchvision's CenterCrop (round, half to even), or RandomCrop's
      if (pos < 0.0) return static_cast<int64_t>(std::nearbyint(static_cast<double>(T - c) / 2.0));
      return std::min(static_cast<int64_t>(std::floor(static_cast<double>(T - c + 1) * pos)), T - c);
    };
    x = resize(x.narrow(2, offset(pos_y), c).narrow(3, offset(pos_x), c).contiguous(), T);
  }
  x = resize(x, S);  // (n, 3, S, S) uint8
  return (x.to(at::kFloat) - 127.5) / 127.5;  // Eagle's processor: its rescale fused into mean and std (0.5 * 255)
}
}  // namespace

at::Tensor bilinear_aa_first(const at::Tensor& u8, int64_t T, bool letterbox) {
  // (n, 3, T, T): torchvision's Resize to a [T, T] size does not keep the aspect ratio
  return resize_aa(chw_frames(u8, letterbox), T, /*bicubic=*/false).permute({0, 2, 3, 1}).contiguous();
}

at::Tensor bilinear_aa_rest(const at::Tensor& u8, double f, int64_t S, double pos_y, double pos_x) {
  return bilinear_aa_chw_rest(u8.permute({0, 3, 1, 2}).contiguous(), f, S, pos_y, pos_x);
}

at::Tensor resize_frames_bilinear_aa(const at::Tensor& u8, int64_t T, double f, int64_t S, bool letterbox) {
  const at::Tensor x = resize_aa(chw_frames(u8, letterbox), T <= 0 ? S : T, /*bicubic=*/false);  // (n, 3, T, T)
  return bilinear_aa_chw_rest(x, f, S, -1.0, -1.0);
}

namespace {
at::Tensor shorter_side_to(const at::Tensor& hwc, int64_t T) {  // (h, w, 3) uint8, its shorter side made T
  const auto [oh, ow] = cv2_area_size(hwc.size(0), hwc.size(1), T);
  return oh == hwc.size(0) && ow == hwc.size(1) ? hwc : resize_area(hwc, oh, ow);
}
}  // namespace

std::pair<int64_t, int64_t> cv2_area_size(int64_t h, int64_t w, int64_t T) {
  const int64_t shorter = std::min(h, w);
  if (shorter == T) return {h, w};
  const double scale = static_cast<double>(T) / static_cast<double>(shorter);
  const auto side = [scale](int64_t n) {
    return std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(static_cast<double>(n) * scale)));
  };
  return {side(h), side(w)};
}

at::Tensor cv2_area_first(const at::Tensor& u8, int64_t T, bool letterbox) {
  const int64_t n = u8.size(0);
  at::Tensor out = at::empty({n, T, T, 3}, u8.options());
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor x = u8[i];  // (h, w, 3)
    if (letterbox && x.size(0) != x.size(1)) {
      const int64_t h = x.size(0), w = x.size(1), q = std::max(h, w), left = (q - w) / 2, top = (q - h) / 2;
      x = at::constant_pad_nd(x, {0, 0, left, q - w - left, top, q - h - top}, 0);  // (q, q, 3)
    }
    x = shorter_side_to(x, T);
    if (x.size(0) != x.size(1))
      throw DataError("image_resample cv2_area: a " + std::to_string(u8.size(1)) + " x " +
                      std::to_string(u8.size(2)) + " frame becomes " + std::to_string(x.size(0)) + " x " +
                      std::to_string(x.size(1)) + " (upstream's albumentations transform keeps the aspect ratio), "
                      "but the model takes square images; import the checkpoint with letter_box_transform, or "
                      "use a square camera");
    out[i].copy_(x);
  }
  return out;
}

at::Tensor cv2_area_rest(const at::Tensor& u8, double f, int64_t S, double pos_y, double pos_x) {
  const int64_t n = u8.size(0), T = u8.size(1);
  at::Tensor out = at::empty({n, T, T, 3}, u8.options());
  const int64_t crop = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(T) * f));
  const auto offset = [&](double pos) {  // the center, or upstream's train-time window at pos in [0, 1]
    return pos < 0.0 ? (T - crop) / 2
                     : static_cast<int64_t>(std::nearbyint(static_cast<double>(T - crop) * std::clamp(pos, 0.0, 1.0)));
  };
  const int64_t top = offset(pos_y), left = offset(pos_x);
  for (int64_t i = 0; i < n; ++i)
    out[i].copy_(f > 0.0 && f < 1.0 ? shorter_side_to(u8[i].narrow(0, top, crop).narrow(1, left, crop), T) : u8[i]);
  at::Tensor chw = out.permute({0, 3, 1, 2}).contiguous();  // (n, 3, T, T)
  if (T != S) chw = at::_upsample_bicubic2d_aa(chw, {S, S}, /*align_corners=*/false);
  return (chw.to(at::kFloat) - 127.5) / 127.5;  // as bicubic_aa's normalisation
}

at::Tensor resize_frames_cv2_area(const at::Tensor& u8, int64_t T, double f, int64_t S, bool letterbox) {
  return cv2_area_rest(cv2_area_first(u8, T > 0 ? T : S, letterbox), f, S);
}

std::vector<std::pair<double, double>> crop_positions(uint64_t seed, uint64_t p, int64_t count) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(((seed * 1000003ull + p) & 0x7FFFFFFFFFFFFFFFull) ^ kCropSalt);
  const at::Tensor u = at::rand({2 * count}, gen, at::kFloat);  // (2 count,)
  const float* v = u.data_ptr<float>();
  std::vector<std::pair<double, double>> out;
  for (int64_t i = 0; i < count; ++i)
    out.emplace_back(static_cast<double>(v[2 * i]), static_cast<double>(v[2 * i + 1]));
  return out;
}

at::Tensor model_images(const at::Tensor& u8, int64_t S, const std::vector<int64_t>& blank, bool pad_square) {
  at::Tensor out = resize_frames(u8, S, pad_square);
  for (const int64_t slot : blank) out[slot].zero_();
  return out;
}

}  // namespace loongforge::data
