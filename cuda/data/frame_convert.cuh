// cuda/data/frame_convert.cuh — decoded video frames to the model's image input
// on the device (issue #12 level 2; src/data/frames.cpp calls it).
//
// frames_resize_to_chw_launch: n uint8 frames (n, h, w, 3), HWC as FFmpeg
// writes RGB24, become (n, 3, S, S) float32: each value is
// frame_math.hpp's resized_pixel(), the CPU path's box resize and
// normalisation bit for bit. One thread per output pixel (3 channels).
// frames_pad_resize_to_chw_launch: the same with each frame first centered on
// a black max(h, w) square (data.image_aspect pad): padded_resized_pixel().
// Raw pointers and a stream in, cudaError_t out; no framework headers.
#pragma once

#include <cstdint>         // uint8_t, int64_t
#include <cuda_runtime.h>  // cudaStream_t, cudaError_t

namespace loongforge::cuda {

cudaError_t frames_resize_to_chw_launch(const uint8_t* src, float* dst, int64_t n, int64_t h, int64_t w, int64_t S,
                                        cudaStream_t stream);
cudaError_t frames_pad_resize_to_chw_launch(const uint8_t* src, float* dst, int64_t n, int64_t h, int64_t w,
                                            int64_t S, cudaStream_t stream);

}  // namespace loongforge::cuda
