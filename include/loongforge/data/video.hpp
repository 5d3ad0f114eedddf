// loongforge/data/video.hpp — decoding camera videos to RGB frames (FFmpeg).
//
// Contract:
//  - decode_video_rgb() decodes every frame of a file's first video stream in
//    presentation order (frame i = the i-th frame the decoder outputs), as
//    uint8 RGB, HWC. yuv420p frames use the integer BT.601 formula of
//    docs/training-semantics.md s3 (bit-exact with the reference trainer);
//    other pixel formats go through libswscale.
//  - Errors (missing file, no video stream, unsupported codec, truncated or
//    corrupt data) throw DataError naming the file and frame.
//  - Stateless and thread-safe: each call owns its FFmpeg contexts.
#pragma once

#include <cstdint>  // uint8_t, int64_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace loongforge::data {

struct RgbFrames {
  int64_t count = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;  // (count, height, width, 3)
  bool bit_exact = true;        // false when libswscale converted a non-yuv420p format
};

// Decodes frames [0, max_frames) (all when max_frames < 0).
RgbFrames decode_video_rgb(const std::string& path, int64_t max_frames = -1);

// The integer BT.601 limited-range conversion of one yuv420p image.
void yuv420p_to_rgb(const uint8_t* y, int y_stride, const uint8_t* u, int u_stride, const uint8_t* v, int v_stride,
                    int64_t width, int64_t height, uint8_t* rgb /* (height, width, 3) */);

}  // namespace loongforge::data
