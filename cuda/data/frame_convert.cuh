// cuda/data/frame_convert.cuh — decoded video frames to model input.
//
// frames_to_chw_launch: uint8 frames in HWC order (as FFmpeg/swscale write
// RGB24) become normalized CHW floats: out = (in / 255 - mean[c]) / std[c].
// Raw pointers and a stream in, cudaError_t out; no framework headers.
// Shapes: src (N, H, W, 3) uint8; dst (N, 3, H, W) fp32 or bf16.
#pragma once

#include <cstdint>           // uint8_t
#include <cuda_runtime.h>    // cudaStream_t, cudaError_t

namespace loongforge::cuda {

enum class OutDType { Float32, BFloat16 };

// mean/std: 3 floats each, passed by value (no device copy needed).
cudaError_t frames_to_chw_launch(const uint8_t* src, void* dst, OutDType dtype, int64_t n, int64_t h, int64_t w,
                                 const float mean[3], const float stdev[3], cudaStream_t stream);

}  // namespace loongforge::cuda
