// cuda/data/frame_math.hpp — the arithmetic of one model-input pixel made from a
// uint8 RGB frame, shared by the CUDA kernel (frame_convert.cu) and the CPU
// tests that hold it to the CPU path; plain C++ when not compiled by nvcc.
//
// Contract: resized_pixel() is, bit for bit, what the CPU path computes
// (ATen's path: the frame to float, adaptive_avg_pool2d to S x S, then
// ((x / 255) - 0.5) / 0.5; src/data/frames.cpp computes it on the CPU with
// these windows and divisions over integer sums):
//  - output row i of S averages input rows [floor(i*h/S), ceil((i+1)*h/S)),
//    columns likewise (ATen's adaptive-pooling windows);
//  - the window's values summed in float (exact, so in any order, for windows
//    under 65,793 pixels: 255 x 65,793 < 2^24), divided by the row count, then
//    by the column count, as ATen's CPU kernel divides;
//  - the normalisation in float, in that order, with IEEE division (nvcc's
//    default -prec-div=true; the kernel must not be built with fast math).
// padded_resized_pixel() is the same for a frame first padded with zeros to a
// square (data.image_aspect pad: the CPU path's constant_pad_nd before the
// pool): the square's windows and counts, the pad's zeros left out of the sum
// (adding them changes no bit of an exact sum), so the pad is never stored.
// test/data/test_frames.cpp checks both against ATen for several sizes;
// test/data/test_frame_convert_gpu.cpp checks the kernel against them.
#pragma once

#include <cstdint>  // uint8_t, int64_t

#if defined(__CUDACC__)
#define LF_HOST_DEVICE __host__ __device__
#else
#define LF_HOST_DEVICE
#endif

namespace loongforge::cuda {

LF_HOST_DEVICE inline int64_t window_begin(int64_t i, int64_t n, int64_t S) { return (i * n) / S; }
LF_HOST_DEVICE inline int64_t window_end(int64_t i, int64_t n, int64_t S) { return ((i + 1) * n + S - 1) / S; }

// Channel c of output pixel (oy, ox) of the (h, w, 3) frame `frame` resized to S x S.
LF_HOST_DEVICE inline float resized_pixel(const uint8_t* frame, int64_t h, int64_t w, int64_t S, int64_t oy,
                                          int64_t ox, int c) {
  const int64_t y0 = window_begin(oy, h, S), y1 = window_end(oy, h, S);
  const int64_t x0 = window_begin(ox, w, S), x1 = window_end(ox, w, S);
  float sum = 0.0f;
  for (int64_t y = y0; y < y1; ++y)
    for (int64_t x = x0; x < x1; ++x) sum += static_cast<float>(frame[(y * w + x) * 3 + c]);
  const float mean = sum / static_cast<float>(y1 - y0) / static_cast<float>(x1 - x0);
  return ((mean / 255.0f) - 0.5f) / 0.5f;
}

// The same pixel of the (h, w, 3) frame centered on a black q x q square, q = max(h, w): (q - h) / 2
// rows above it and (q - w) / 2 columns left of it (as image_letterbox places them), the rest below
// and right. Windows over the square; only the frame's pixels inside a window are read.
LF_HOST_DEVICE inline float padded_resized_pixel(const uint8_t* frame, int64_t h, int64_t w, int64_t S, int64_t oy,
                                                 int64_t ox, int c) {
  const int64_t q = h > w ? h : w, top = (q - h) / 2, left = (q - w) / 2;
  const int64_t y0 = window_begin(oy, q, S), y1 = window_end(oy, q, S);
  const int64_t x0 = window_begin(ox, q, S), x1 = window_end(ox, q, S);
  const int64_t fy0 = y0 > top ? y0 : top, fy1 = y1 < top + h ? y1 : top + h;     // the frame's rows in it
  const int64_t fx0 = x0 > left ? x0 : left, fx1 = x1 < left + w ? x1 : left + w;  // and columns
  float sum = 0.0f;
  for (int64_t y = fy0; y < fy1; ++y)
    for (int64_t x = fx0; x < fx1; ++x) sum += static_cast<float>(frame[((y - top) * w + (x - left)) * 3 + c]);
  const float mean = sum / static_cast<float>(y1 - y0) / static_cast<float>(x1 - x0);
  return ((mean / 255.0f) - 0.5f) / 0.5f;
}

}  // namespace loongforge::cuda
