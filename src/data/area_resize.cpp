// OpenCV's INTER_AREA resize of uint8 frames, bit for bit (contract in area_resize.hpp).
//
// Note [INTER_AREA arithmetic]
// cv2.resize(..., INTER_AREA) takes one of three paths, each with its own rounding, and a
// faithful copy must take the same one with the same arithmetic (the float operations in
// the same order: this file is compiled with -ffp-contract=off, so no FMA fuses them):
//  1. Shrinking on both axes by whole factors fx, fy: each output is the mean of its fx x fy
//     block. 2 x 2 blocks are rounded as (sum + 2) >> 2 (OpenCV's vector kernel, used for
//     every column); other blocks as the float product sum * (1.f / (fx * fy)), rounded half
//     to even.
//  2. Shrinking on both axes otherwise: a table of (output, source, weight) per axis. A source
//     cell that an output cell covers in part gets the covered fraction, whole cells 1 / the
//     cell width (in source pixels), all as floats computed in double. Each source row is
//     reduced along x into a float row (weights in table order), and the rows are summed
//     into the output row scaled by their y weights; the first row of an output row starts
//     the sum. Rounded half to even.
//  3. Growing on either axis: linear interpolation between source pixels s and s + 1 with
//     INTER_AREA's coefficient: s = floor(d * scale), f = (d + 1) - (s + 1) / scale
//     (0 when <= 0, else its fraction) in float; the weights (1 - f) and f in 11-bit fixed
//     point, rounded half to even. Along x each output column is s * w0 + (s + 1) * w1 (an
//     int; past the last pair of source pixels, the last pixel * 2048); along y the two rows
//     are combined as OpenCV's vectorised kernel does: ((r0 >> 4) * w0 >> 16) +
//     ((r1 >> 4) * w1 >> 16), then (x + 2) >> 2, saturated to uint8.
// "scale" is always 1 / (out / in), computed as OpenCV does (not in / out: they differ in
// the last bit, which moves floor(d * scale) at exact multiples).
#include "loongforge/data/area_resize.hpp"

#include <algorithm>  // std::min, std::clamp
#include <cmath>      // std::ceil, std::floor, std::nearbyint
#include <string>     // std::string, std::to_string
#include <vector>     // std::vector

#include <ATen/ATen.h>  // at::empty

#include "loongforge/common/error.hpp"

namespace loongforge::data {
namespace {

uint8_t round_to_u8(float v) {  // half to even, as cvRound in the default rounding mode
  return static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.0f, 255.0f));
}

// Path 1: whole-factor shrink.
void block_mean(const uint8_t* src, int64_t w, int64_t c, uint8_t* dst, int64_t oh, int64_t ow, int64_t fx,
                int64_t fy) {
  const bool two_by_two = fx == 2 && fy == 2;
  const float inv_area = 1.0f / static_cast<float>(fx * fy);
  for (int64_t dy = 0; dy < oh; ++dy)
    for (int64_t dx = 0; dx < ow; ++dx)
      for (int64_t k = 0; k < c; ++k) {
        int sum = 0;
        for (int64_t y = dy * fy; y < (dy + 1) * fy; ++y)
          for (int64_t x = dx * fx; x < (dx + 1) * fx; ++x) sum += src[(y * w + x) * c + k];
        dst[(dy * ow + dx) * c + k] =
            two_by_two ? static_cast<uint8_t>((sum + 2) >> 2) : round_to_u8(static_cast<float>(sum) * inv_area);
      }
}

// Path 2: the area table of one axis, in OpenCV's order.
struct AreaWeight {
  int64_t out, src;
  float weight;
};

std::vector<AreaWeight> area_table(int64_t in, int64_t out, double scale) {
  std::vector<AreaWeight> table;
  for (int64_t d = 0; d < out; ++d) {
    const double begin = static_cast<double>(d) * scale, end = begin + scale;
    const double cell = std::min(scale, static_cast<double>(in) - begin);
    int64_t last = std::min(static_cast<int64_t>(std::floor(end)), in - 1);
    const int64_t first = std::min(static_cast<int64_t>(std::ceil(begin)), last);
    if (static_cast<double>(first) - begin > 1e-3)  // the part of the cell before `first`
      table.push_back({d, first - 1, static_cast<float>((static_cast<double>(first) - begin) / cell)});
    for (int64_t s = first; s < last; ++s) table.push_back({d, s, static_cast<float>(1.0 / cell)});
    if (end - static_cast<double>(last) > 1e-3)  // the part from `last` on
      table.push_back(
          {d, last, static_cast<float>(std::min(std::min(end - static_cast<double>(last), 1.0), cell) / cell)});
  }
  return table;
}

void area_weighted(const uint8_t* src, int64_t h, int64_t w, int64_t c, uint8_t* dst, int64_t oh, int64_t ow) {
  const std::vector<AreaWeight> xs = area_table(w, ow, 1.0 / (static_cast<double>(ow) / static_cast<double>(w)));
  const std::vector<AreaWeight> ys = area_table(h, oh, 1.0 / (static_cast<double>(oh) / static_cast<double>(h)));
  const int64_t row = ow * c;
  std::vector<float> reduced(row), sum(row, 0.0f);
  const auto store = [&](int64_t dy) {
    for (int64_t i = 0; i < row; ++i) dst[dy * row + i] = round_to_u8(sum[i]);
  };
  int64_t current = ys.front().out;
  for (const AreaWeight& y : ys) {
    std::fill(reduced.begin(), reduced.end(), 0.0f);
    const uint8_t* line = src + y.src * w * c;
    for (const AreaWeight& x : xs)
      for (int64_t k = 0; k < c; ++k) {
        const float v = static_cast<float>(line[x.src * c + k]) * x.weight;
        reduced[x.out * c + k] = reduced[x.out * c + k] + v;
      }
    if (y.out != current) {  // a new output row: store the finished one, start the sum
      store(current);
      for (int64_t i = 0; i < row; ++i) sum[i] = y.weight * reduced[i];
      current = y.out;
    } else {
      for (int64_t i = 0; i < row; ++i) sum[i] = sum[i] + y.weight * reduced[i];
    }
  }
  store(current);
}

// Path 3: INTER_AREA's linear coefficients of one axis.
struct LinearAxis {
  std::vector<int64_t> src;          // left/top source pixel per output
  std::vector<int32_t> w0, w1;       // fixed-point weights of src and src + 1
  int64_t last_pair = 0;             // outputs from here on take src * 2048 (x only)
};

LinearAxis linear_axis(int64_t in, int64_t out) {
  const double inv_scale = static_cast<double>(out) / static_cast<double>(in), scale = 1.0 / inv_scale;
  LinearAxis a;
  a.last_pair = out;
  for (int64_t d = 0; d < out; ++d) {
    auto s = static_cast<int64_t>(std::floor(static_cast<double>(d) * scale));
    float f = static_cast<float>(static_cast<double>(d + 1) - static_cast<double>(s + 1) * inv_scale);
    f = f <= 0.0f ? 0.0f : f - std::floor(f);
    if (s + 1 >= in) {
      a.last_pair = std::min(a.last_pair, d);
      if (s >= in - 1) f = 0.0f, s = in - 1;
    }
    a.src.push_back(s);
    a.w0.push_back(static_cast<int32_t>(std::nearbyint((1.0f - f) * 2048.0f)));
    a.w1.push_back(static_cast<int32_t>(std::nearbyint(f * 2048.0f)));
  }
  return a;
}

void area_linear(const uint8_t* src, int64_t h, int64_t w, int64_t c, uint8_t* dst, int64_t oh, int64_t ow) {
  const LinearAxis xa = linear_axis(w, ow), ya = linear_axis(h, oh);
  const int64_t row = ow * c;
  const auto horizontal = [&](int64_t y, std::vector<int32_t>& out) {  // one source row along x
    const uint8_t* line = src + y * w * c;
    for (int64_t dx = 0; dx < ow; ++dx)
      for (int64_t k = 0; k < c; ++k) {
        const int32_t left = line[xa.src[dx] * c + k];
        out[dx * c + k] = dx < xa.last_pair ? left * xa.w0[dx] + line[(xa.src[dx] + 1) * c + k] * xa.w1[dx]
                                            : left * 2048;
      }
  };
  std::vector<int32_t> r0(row), r1(row);
  for (int64_t dy = 0; dy < oh; ++dy) {
    const int64_t y0 = ya.src[dy];
    horizontal(y0, r0);
    horizontal(std::min(y0 + 1, h - 1), r1);
    const int32_t b0 = ya.w0[dy], b1 = ya.w1[dy];
    for (int64_t i = 0; i < row; ++i) {
      const int32_t v = (((r0[i] >> 4) * b0) >> 16) + (((r1[i] >> 4) * b1) >> 16);
      dst[dy * row + i] = static_cast<uint8_t>(std::clamp((v + 2) >> 2, 0, 255));
    }
  }
}

}  // namespace

at::Tensor resize_area(const at::Tensor& hwc, int64_t oh, int64_t ow) {
  if (hwc.scalar_type() != at::kByte || hwc.dim() != 3 || !hwc.device().is_cpu() || hwc.size(2) < 1)
    throw DataError("resize_area: expected a uint8 (h, w, c) CPU tensor, got " + std::string(hwc.toString()) +
                    " of " + std::to_string(hwc.dim()) + " dimensions");
  const int64_t h = hwc.size(0), w = hwc.size(1), c = hwc.size(2);
  if (oh < 1 || ow < 1 || h < 1 || w < 1)
    throw DataError("resize_area: cannot resize " + std::to_string(h) + " x " + std::to_string(w) + " to " +
                    std::to_string(oh) + " x " + std::to_string(ow));
  const at::Tensor in = hwc.contiguous();
  at::Tensor out = at::empty({oh, ow, c}, hwc.options());
  if (oh == h && ow == w) return out.copy_(in);
  const uint8_t* src = in.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  const double sx = 1.0 / (static_cast<double>(ow) / static_cast<double>(w));
  const double sy = 1.0 / (static_cast<double>(oh) / static_cast<double>(h));
  if (sx >= 1.0 && sy >= 1.0) {
    const auto fx = static_cast<int64_t>(std::nearbyint(sx)), fy = static_cast<int64_t>(std::nearbyint(sy));
    const double eps = 2.220446049250313e-16;  // DBL_EPSILON: OpenCV's test for a whole factor
    if (std::abs(sx - static_cast<double>(fx)) < eps && std::abs(sy - static_cast<double>(fy)) < eps)
      block_mean(src, w, c, dst, oh, ow, fx, fy);
    else
      area_weighted(src, h, w, c, dst, oh, ow);
  } else {
    area_linear(src, h, w, c, dst, oh, ow);
  }
  return out;
}

}  // namespace loongforge::data
