// loongforge/data/video.hpp — decoding camera videos to RGB frames (FFmpeg).
//
// Contract:
//  - decode_video_rgb() decodes every frame of a file's first video stream in
//    presentation order (frame i = the i-th frame the decoder outputs), as
//    uint8 RGB, HWC. yuv420p frames use the integer BT.601 formula of
//    docs/training-semantics.md s3 (bit-exact with the reference trainer);
//    other pixel formats go through libswscale.
//  - Decoder error detection is on (Note [Checked video] in video.cpp): a
//    damaged bitstream is an error, never a concealed frame. Errors (missing
//    file, no video stream, unsupported codec, truncated or corrupt data,
//    frames FFmpeg marks damaged) throw BadVideoError naming the file and
//    frame.
//  - decode_video_checked() also checks the file against what the dataset
//    index recorded (VideoCheck): size and SHA-256 before decoding, the
//    resolution, each decoded frame's timestamp, and the frame count.
//  - Its streaming form hands each frame to a FrameSink as it is decoded and
//    keeps none: one full-size RGB frame is held at a time (besides the
//    compressed file and the decoder's own reference frames), whatever the
//    video's length. The frames are the bits the RgbFrames forms return.
//  - Span decoding (open_video_checked + decode_span_checked): the file is
//    read and checked once (size, SHA-256), and its packets are scanned
//    without decoding: their count and presentation times are checked
//    against the index, and the keyframes split the video into spans. A span
//    [key_frames[k], key_frames[k+1]) then decodes from its keyframe alone (a
//    seek), with the per-frame checks, and gives the frames a whole decode
//    gives for those indices, bit for bit (Note [Span decoding] in video.cpp).
//  - FFmpeg's own log lines go to the "data" logger at their level
//    (installed on first use).
//  - Stateless and thread-safe: each call owns its FFmpeg contexts.
#pragma once

#include <cstdint>     // uint8_t, int64_t
#include <functional>  // std::function
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

#include "loongforge/common/error.hpp"

namespace loongforge::data {

// A video that cannot be used: the file, the frame (-1 when the problem is
// found before decoding) and the cause, each also in what().
class BadVideoError : public DataError {
 public:
  BadVideoError(std::string path, int64_t frame, std::string cause);
  const std::string& path() const { return path_; }
  int64_t frame() const { return frame_; }
  const std::string& cause() const { return cause_; }

 private:
  std::string path_;
  int64_t frame_;
  std::string cause_;
};

struct RgbFrames {
  int64_t count = 0, height = 0, width = 0;
  std::vector<uint8_t> pixels;  // (count, height, width, 3)
  std::vector<double> pts_s;    // (count,) presentation time of each frame, seconds (pts * time_base)
  std::string codec;            // FFmpeg codec name ("h264", "av1", ...)
  std::string decoder;          // FFmpeg decoder used ("h264", "libdav1d", ...)
  bool bit_exact = true;        // false when libswscale converted a non-yuv420p format
};

// Decodes frames [0, max_frames) (all when max_frames < 0).
RgbFrames decode_video_rgb(const std::string& path, int64_t max_frames = -1);

// What the dataset index says about one video (loongforge_dataset.json
// episodes[].videos[] and cameras[], the shard's video_pts column).
struct VideoCheck {
  uint64_t bytes = 0;
  std::string sha256;  // hex
  int64_t frame_count = 0;
  int64_t width = 0, height = 0;
  const double* pts_s = nullptr;  // (frame_count,) the video_pts column
  double pts_tolerance_s = 1e-6;  // |decoded pts - recorded pts| allowed
};

// Reads the whole file, checks its size and SHA-256, then decodes it from
// memory with the checks of VideoCheck. Throws BadVideoError on any mismatch.
RgbFrames decode_video_checked(const std::string& path, const VideoCheck& check);

// What a streaming decode saw; its frames went to the sink.
struct VideoFormat {
  int64_t count = 0, height = 0, width = 0;
  std::string codec, decoder;
  bool bit_exact = true;
};
// One decoded frame as a FrameSink sees it: its index, its RGB pixels
// (height x width x 3, HWC; valid only during the call) and its presentation
// time in seconds.
struct DecodedFrame {
  int64_t index = 0, height = 0, width = 0;
  const uint8_t* rgb = nullptr;
  double pts_s = 0;
};
// Called once per frame, in presentation order, after that frame's checks.
// An exception it throws ends the decode and propagates.
using FrameSink = std::function<void(const DecodedFrame& frame)>;
// decode_video_checked, streaming: the same checks, the frames to `sink`.
// The count check comes after the last frame: a sink may have seen the
// frames of a video that then fails it.
VideoFormat decode_video_checked(const std::string& path, const VideoCheck& check, const FrameSink& sink);

// A video read and checked once, for span decodes: its compressed bytes, and
// the frame indices (presentation order) where its keyframes are, which
// start the spans; key_frames[0] is 0. Immutable once made: decodes on
// several threads may share one.
struct VideoFile {
  std::string path;
  std::string bytes;
  std::vector<int64_t> key_frames;
  std::vector<int64_t> key_dts;  // each keyframe packet's dts (stream time base): where a span's seek goes
  int64_t frame_count = 0;
  // The span holding frame `frame`: [first, end).
  std::pair<int64_t, int64_t> span_of(int64_t frame) const;
};
// Reads the file, checks its size and SHA-256 (as decode_video_checked), and
// scans its packets: their count must be check.frame_count and their sorted
// presentation times check.pts_s. Throws BadVideoError naming the file.
VideoFile open_video_checked(const std::string& path, const VideoCheck& check);
// Decodes frames [first, end) of `file` (first a keyframe index of it, end <=
// its frame count) from that keyframe, with decode_video_checked's per-frame
// checks; `sink` gets them in order with their indices. Frames the decoder
// puts out before `first` (ones that lead a keyframe in presentation order)
// are dropped unchecked. Throws BadVideoError.
VideoFormat decode_span_checked(const VideoFile& file, const VideoCheck& check, int64_t first, int64_t end,
                                const FrameSink& sink);

// Routes FFmpeg's log (av_log) to the "data" logger; idempotent. Called by
// the decode functions; exposed for tests.
void install_ffmpeg_log();

// The integer BT.601 limited-range conversion of one yuv420p image.
void yuv420p_to_rgb(const uint8_t* y, int y_stride, const uint8_t* u, int u_stride, const uint8_t* v, int v_stride,
                    int64_t width, int64_t height, uint8_t* rgb /* (height, width, 3) */);

}  // namespace loongforge::data
