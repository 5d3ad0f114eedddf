// FFmpeg decode of a whole video to RGB frames, with the checks of
// Note [Checked video]. The only file of the data room that includes FFmpeg
// headers.
//
// Note [Checked video]
// A training sample must never show a frame other than the one its row
// names, and a damaged video must never train silently. FFmpeg's decoders
// conceal errors by default (a damaged macroblock is patched from its
// neighbours and the frame is output as if nothing happened), so:
//  - before decoding, the file's size and SHA-256 must equal the dataset
//    index's (catches flipped bytes and a video swapped for another one);
//  - decoding runs with err_recognition = CRCCHECK | BITSTREAM | BUFFER |
//    EXPLODE (the decoder returns an error instead of concealing) and with
//    AV_CODEC_FLAG_OUTPUT_CORRUPT (h264 would otherwise drop frames it cannot
//    reconstruct, silently shifting every later frame); a frame that still
//    comes out with decode_error_flags or AV_FRAME_FLAG_CORRUPT is an error;
//  - the resolution must equal the dataset's cameras[] entry;
//  - frame i's pts * time_base must equal the shard's video_pts[i] (the
//    converter computed it the same way from ffprobe's frames), and the
//    decoded frame count must equal the index's frame_count.
// The index checks run first, so the decoder-level checks only see files the
// converter accepted: they catch a source video that was already damaged
// (or an index edited by hand). The batch builder applies data.on_bad_video.
//
// Note [Span decoding]
// A span decode gives frames [k_j, k_{j+1}) of a video, k_j its keyframes in
// presentation order, without decoding what comes before k_j: what makes
// random access cheap on videos with short keyframe intervals (LeRobot
// encodes AV1 with -g 2, so a span is two frames). The file checks move to
// open_video_checked(): size and SHA-256 as above, then a demux-only scan of
// every packet: the packet count must be the index's frame_count and the
// sorted presentation times its video_pts (so a span decode need not reach
// the end of the file to know the count). A span decode seeks the demuxer to
// the keyframe packet's dts (AVSEEK_FLAG_BACKWARD: at or before it), decodes
// with the same error detection, drops the frames whose timestamp is before
// frame k_j's (leading frames, which may reference an earlier span, and
// anything before the keyframe when the seek landed earlier), then checks and
// hands over frames k_j, k_j + 1, ... exactly as the whole decode does, and
// stops after k_{j+1} - 1. A keyframe is taken to start a closed group (no
// frame of the span refers to one before it), so the frames are the bits the
// whole decode gives for those indices: test_video checks it for every span
// of the bundled h264 videos and their AV1 copy. A video whose keyframes
// open groups (h264 open GOP) breaks the assumption; what the decoder then
// does with a frame referring past the seek (an error under the detection
// above, or a frame marked damaged) is not tested: no such video is in the
// test data. data.video_decode=whole does not depend on it.
#include "loongforge/data/video.hpp"

#include <algorithm>  // std::clamp, std::sort, std::upper_bound
#include <cmath>      // std::fabs
#include <cstdarg>    // va_list
#include <cstdio>     // std::snprintf
#include <cstring>    // std::memcpy
#include <fstream>    // std::ifstream
#include <memory>     // std::unique_ptr
#include <mutex>      // std::once_flag
#include <stdexcept>  // std::invalid_argument

extern "C" {
#include <libavcodec/avcodec.h>    // AVCodecContext, avcodec_send_packet
#include <libavformat/avformat.h>  // AVFormatContext, av_read_frame
#include <libavformat/avio.h>      // avio_alloc_context
#include <libavutil/imgutils.h>    // av_image_fill_arrays
#include <libavutil/log.h>         // av_log_set_callback, av_log_format_line2
#include <libswscale/swscale.h>    // sws_scale
}

#include "loongforge/common/log.hpp"
#include "loongforge/common/sha256.hpp"

namespace loongforge::data {

namespace {

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

struct FormatCloser {
  void operator()(AVFormatContext* c) const { avformat_close_input(&c); }
};
struct CodecCloser {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct FrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct SwsFree {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};
struct AvioFree {
  void operator()(AVIOContext* c) const {
    av_freep(&c->buffer);
    avio_context_free(&c);
  }
};

// A file already read into memory, served to libavformat through custom I/O.
struct MemoryFile {
  const uint8_t* data = nullptr;
  int64_t size = 0, pos = 0;
};

int memory_read(void* opaque, uint8_t* buf, int n) {
  auto* m = static_cast<MemoryFile*>(opaque);
  const int64_t left = m->size - m->pos;
  if (left <= 0) return AVERROR_EOF;
  const int take = static_cast<int>(std::min<int64_t>(n, left));
  std::memcpy(buf, m->data + m->pos, static_cast<size_t>(take));
  m->pos += take;
  return take;
}

int64_t memory_seek(void* opaque, int64_t offset, int whence) {
  auto* m = static_cast<MemoryFile*>(opaque);
  if (whence & AVSEEK_SIZE) return m->size;
  int64_t to = offset;
  switch (whence & ~AVSEEK_FORCE) {
    case SEEK_SET: to = offset; break;
    case SEEK_CUR: to = m->pos + offset; break;
    case SEEK_END: to = m->size + offset; break;
    default: return AVERROR(EINVAL);
  }
  if (to < 0 || to > m->size) return AVERROR(EINVAL);
  m->pos = to;
  return to;
}

// FFmpeg's log lines on the "data" logger: its errors and warnings at error
// and warn; its info and verbose lines (a decoder's version banner each time
// one opens, concealment statistics) at debug, since the checks of Note
// [Checked video] report what matters with the file and frame; its debug and
// trace lines at trace. av_log may hand over a line in pieces; each thread
// assembles its own.
void ffmpeg_log(void* avcl, int level, const char* fmt, va_list vl) {
  if (level > av_log_get_level()) return;
  thread_local std::string pending;
  thread_local int print_prefix = 1;
  char piece[1024];
  av_log_format_line2(avcl, level, fmt, vl, piece, sizeof(piece), &print_prefix);
  pending += piece;
  if (pending.empty() || pending.back() != '\n') return;
  while (!pending.empty() && (pending.back() == '\n' || pending.back() == '\r')) pending.pop_back();
  const LogLevel ours = level <= AV_LOG_ERROR     ? LogLevel::error
                        : level <= AV_LOG_WARNING ? LogLevel::warn
                        : level <= AV_LOG_VERBOSE ? LogLevel::debug
                                                  : LogLevel::trace;
  const Logger& log = logger("data");
  if (!pending.empty() && log.enabled(ours)) log.write(ours, "ffmpeg: " + pending);
  pending.clear();
}

inline uint8_t clamp_u8(int v) { return static_cast<uint8_t>(std::clamp(v, 0, 255)); }

}  // namespace

void yuv420p_to_rgb(const uint8_t* y, int y_stride, const uint8_t* u, int u_stride, const uint8_t* v, int v_stride,
                    int64_t width, int64_t height, uint8_t* rgb) {
  for (int64_t r = 0; r < height; ++r) {
    const uint8_t* yr = y + r * y_stride;
    const uint8_t* ur = u + (r / 2) * u_stride;
    const uint8_t* vr = v + (r / 2) * v_stride;
    uint8_t* out = rgb + r * width * 3;
    for (int64_t x = 0; x < width; ++x) {
      const int c = yr[x] - 16, d = ur[x / 2] - 128, e = vr[x / 2] - 128;
      out[3 * x + 0] = clamp_u8((298 * c + 409 * e + 128) >> 8);
      out[3 * x + 1] = clamp_u8((298 * c - 100 * d - 208 * e + 128) >> 8);
      out[3 * x + 2] = clamp_u8((298 * c + 516 * d + 128) >> 8);
    }
  }
}

BadVideoError::BadVideoError(std::string path, int64_t frame, std::string cause)
    : DataError(path + (frame >= 0 ? ": frame " + std::to_string(frame) : std::string()) + ": " + cause),
      path_(std::move(path)),
      frame_(frame),
      cause_(std::move(cause)) {}

void install_ffmpeg_log() {
  static std::once_flag once;
  std::call_once(once, [] { av_log_set_callback(ffmpeg_log); });
  // FFmpeg formats only what the "data" logger prints now (its level can change).
  const Logger& log = logger("data");
  av_log_set_level(log.enabled(LogLevel::trace)   ? AV_LOG_TRACE
                   : log.enabled(LogLevel::debug) ? AV_LOG_VERBOSE
                                                  : AV_LOG_WARNING);
}

namespace {

// A span decode's request (Note [Span decoding]): frames [first, end),
// reached by seeking to dts `seek_dts`.
struct SpanRequest {
  int64_t first = 0, end = 0, seek_dts = 0;
};

// An opened demuxer over a file or over bytes in memory (the reader the
// custom I/O reads from lives beside it, at a fixed address).
struct Input {
  MemoryFile reader;
  std::unique_ptr<AVIOContext, AvioFree> avio;
  std::unique_ptr<AVFormatContext, FormatCloser> fmt;
};

// probe: avformat_find_stream_info, which may decode frames to learn what the
// container does not say; skipped by span decodes (open_video_checked probed
// the same bytes when it scanned them).
std::unique_ptr<Input> open_input(const std::string& path, const MemoryFile* memory, bool probe = true) {
  install_ffmpeg_log();
  auto in = std::make_unique<Input>();
  AVFormatContext* raw_fmt = avformat_alloc_context();
  if (raw_fmt == nullptr) throw BadVideoError(path, -1, "out of memory allocating a demuxer");
  raw_fmt->error_recognition = AV_EF_EXPLODE;
  if (memory != nullptr) {
    in->reader = *memory;
    constexpr int kIoBytes = 1 << 16;
    auto* buf = static_cast<uint8_t*>(av_malloc(kIoBytes));
    in->avio.reset(buf ? avio_alloc_context(buf, kIoBytes, 0, &in->reader, memory_read, nullptr, memory_seek)
                       : nullptr);
    if (!in->avio) {
      av_free(buf);
      avformat_free_context(raw_fmt);
      throw BadVideoError(path, -1, "out of memory allocating the reader");
    }
    raw_fmt->pb = in->avio.get();
    raw_fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
  }
  int rc = avformat_open_input(&raw_fmt, path.c_str(), nullptr, nullptr);  // frees raw_fmt on failure
  if (rc < 0)
    throw BadVideoError(path, -1, "cannot open video (" + av_error(rc) + "); check the dataset's videos/ folder");
  in->fmt.reset(raw_fmt);
  if (probe && (rc = avformat_find_stream_info(in->fmt.get(), nullptr)) < 0)
    throw BadVideoError(path, -1, "cannot read stream info (" + av_error(rc) + "): truncated or not a video file?");
  return in;
}

// The decode shared by every entry point. `memory` (may be null: read the
// file by path) holds the whole file; `check` (may be null) the index's facts;
// `span` (may be null: the whole video) a span to decode instead; each frame
// goes to `sink` from one reused buffer.
VideoFormat decode(const std::string& path, const MemoryFile* memory, const VideoCheck* check, int64_t max_frames,
                   const FrameSink& sink, const SpanRequest* span = nullptr) {
  auto fail = [&](int64_t frame, const std::string& what) { return BadVideoError(path, frame, what); };
  const std::unique_ptr<Input> in = open_input(path, memory, /*probe=*/span == nullptr);
  AVFormatContext* const fmt_ctx = in->fmt.get();
  int rc = 0;
  const AVCodec* codec = nullptr;
  const int stream = av_find_best_stream(fmt_ctx, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
  if (stream < 0) throw fail(-1, "has no video stream");
  const AVStream* st = fmt_ctx->streams[stream];
  if (codec == nullptr)
    throw fail(-1, "no decoder for codec '" + std::string(avcodec_get_name(st->codecpar->codec_id)) +
                       "' in this FFmpeg build");
  std::unique_ptr<AVCodecContext, CodecCloser> dec(avcodec_alloc_context3(codec));
  avcodec_parameters_to_context(dec.get(), st->codecpar);
  dec->thread_count = 1;  // callers parallelize across videos
  // Note [Checked video]: errors instead of concealment, and no silent drops.
  dec->err_recognition = AV_EF_CRCCHECK | AV_EF_BITSTREAM | AV_EF_BUFFER | AV_EF_EXPLODE;
  dec->flags |= AV_CODEC_FLAG_OUTPUT_CORRUPT;
  if ((rc = avcodec_open2(dec.get(), codec, nullptr)) < 0) throw fail(-1, "cannot open decoder (" + av_error(rc) + ")");

  VideoFormat out;
  out.width = dec->width;
  out.height = dec->height;
  out.codec = avcodec_get_name(st->codecpar->codec_id);
  out.decoder = codec->name;
  auto check_size = [&](int64_t frame, int64_t w, int64_t h) {
    if (check != nullptr && (w != check->width || h != check->height))
      throw fail(frame, "video is " + std::to_string(w) + "x" + std::to_string(h) +
                            " (width x height) but the dataset's cameras[] entry says " +
                            std::to_string(check->width) + "x" + std::to_string(check->height) +
                            "; the file is not the one converted: re-run scripts/convert_lerobot.py");
  };
  check_size(-1, out.width, out.height);
  const double time_base = static_cast<double>(st->time_base.num) / static_cast<double>(st->time_base.den);
  const size_t frame_bytes = static_cast<size_t>(out.width * out.height * 3);
  std::unique_ptr<AVFrame, FrameFree> frame(av_frame_alloc());
  std::unique_ptr<AVPacket, PacketFree> packet(av_packet_alloc());
  std::unique_ptr<SwsContext, SwsFree> sws;
  std::vector<uint8_t> rgb(frame_bytes);  // the one frame in flight

  const int64_t first = span ? span->first : 0;
  if (span != nullptr) {
    if ((rc = av_seek_frame(fmt_ctx, stream, span->seek_dts, AVSEEK_FLAG_BACKWARD)) < 0)
      throw fail(first,
                 "cannot seek to the keyframe at dts " + std::to_string(span->seek_dts) + " (" + av_error(rc) + ")");
    max_frames = span->end - span->first;
  }
  auto take = [&](AVFrame* f) {
    if (max_frames >= 0 && out.count >= max_frames) return;
    if (span != nullptr) {  // Note [Span decoding]: frames before the span's first are dropped unchecked
      const int64_t p = f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
      if (p != AV_NOPTS_VALUE && out.count == 0 &&
          static_cast<double>(p) * time_base < check->pts_s[first] - check->pts_tolerance_s)
        return;
    }
    const int64_t i = first + out.count;
    if (f->decode_error_flags != 0 || (f->flags & AV_FRAME_FLAG_CORRUPT) != 0) {
      char flags[96];
      std::snprintf(flags, sizeof(flags), "decode_error_flags 0x%x%s", static_cast<unsigned>(f->decode_error_flags),
                    (f->flags & AV_FRAME_FLAG_CORRUPT) != 0 ? ", AV_FRAME_FLAG_CORRUPT" : "");
      throw fail(i, std::string("the decoder marked the frame damaged (") + flags +
                        "): the bitstream is corrupt; re-copy or re-encode the video, then re-run "
                        "scripts/convert_lerobot.py");
    }
    check_size(i, f->width, f->height);
    if (f->width != out.width || f->height != out.height) throw fail(i, "the frame size changes mid-stream");
    const int64_t pts = f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
    if (pts == AV_NOPTS_VALUE) throw fail(i, "the decoded frame has no timestamp");
    const double pts_s = static_cast<double>(pts) * time_base;
    if (check != nullptr) {
      if (i >= check->frame_count)
        throw fail(i, "the video has more frames than the " + std::to_string(check->frame_count) +
                          " the dataset index records; the file is not the one converted: re-run "
                          "scripts/convert_lerobot.py");
      if (check->pts_s != nullptr && !(std::fabs(pts_s - check->pts_s[i]) <= check->pts_tolerance_s)) {
        char what[256];
        std::snprintf(what, sizeof(what),
                      "decoded timestamp %.6f s differs from the %.6f s the shard's video_pts records for this "
                      "frame; the file is not the one converted: re-run scripts/convert_lerobot.py",
                      pts_s, check->pts_s[i]);
        throw fail(i, what);
      }
    }
    uint8_t* dst = rgb.data();
    if (f->format == AV_PIX_FMT_YUV420P) {
      yuv420p_to_rgb(f->data[0], f->linesize[0], f->data[1], f->linesize[1], f->data[2], f->linesize[2], out.width,
                     out.height, dst);
    } else {
      out.bit_exact = false;
      if (!sws)
        sws.reset(sws_getContext(f->width, f->height, static_cast<AVPixelFormat>(f->format), f->width, f->height,
                                 AV_PIX_FMT_RGB24, SWS_BILINEAR | SWS_ACCURATE_RND, nullptr, nullptr, nullptr));
      if (!sws) throw fail(i, "cannot convert pixel format " + std::to_string(f->format) + " to RGB");
      uint8_t* planes[4] = {dst, nullptr, nullptr, nullptr};
      int strides[4] = {static_cast<int>(out.width * 3), 0, 0, 0};
      sws_scale(sws.get(), f->data, f->linesize, 0, f->height, planes, strides);
    }
    sink(DecodedFrame{i, out.height, out.width, dst, pts_s});
    ++out.count;
  };
  auto drain = [&]() {
    while ((rc = avcodec_receive_frame(dec.get(), frame.get())) >= 0) {
      take(frame.get());
      av_frame_unref(frame.get());
    }
    if (rc != AVERROR(EAGAIN) && rc != AVERROR_EOF)
      throw fail(first + out.count, "decoder error after " + std::to_string(out.count) + " good frame(s) (" +
                                        av_error(rc) + "): the bitstream is corrupt; re-copy or re-encode the video");
  };
  while ((rc = av_read_frame(fmt_ctx, packet.get())) >= 0) {
    if (packet->stream_index == stream) {
      if ((packet->flags & AV_PKT_FLAG_CORRUPT) != 0)
        throw fail(out.count, "the demuxer marked a packet corrupt after " + std::to_string(out.count) +
                                  " good frame(s)");
      const int sent = avcodec_send_packet(dec.get(), packet.get());
      av_packet_unref(packet.get());
      if (sent < 0)
        throw fail(first + out.count, "decoder error after " + std::to_string(out.count) + " good frame(s) (" +
                                          av_error(sent) +
                                          "): the bitstream is corrupt; re-copy or re-encode the video");
      drain();
      if (max_frames >= 0 && out.count >= max_frames) return out;
    } else {
      av_packet_unref(packet.get());
    }
  }
  if (rc != AVERROR_EOF)
    throw fail(out.count, "read error after " + std::to_string(out.count) + " frame(s) (" + av_error(rc) + ")");
  avcodec_send_packet(dec.get(), nullptr);  // flush delayed frames
  drain();
  if (span != nullptr && out.count != max_frames)
    throw fail(first + out.count, "the span from frame " + std::to_string(first) + " gave " +
                                      std::to_string(out.count) + " of its " + std::to_string(max_frames) +
                                      " frames; the file is not the one converted: re-run scripts/convert_lerobot.py");
  if (span == nullptr && check != nullptr && out.count != check->frame_count)
    throw fail(out.count, "decoded " + std::to_string(out.count) + " frames but the dataset index records " +
                              std::to_string(check->frame_count) +
                              "; the file is truncated or not the one converted: re-run scripts/convert_lerobot.py");
  return out;
}

// The RgbFrames forms: a sink that keeps every frame.
RgbFrames keep_all(const std::function<VideoFormat(const FrameSink&)>& run) {
  RgbFrames out;
  const VideoFormat f = run([&](const DecodedFrame& frame) {
    out.pixels.insert(out.pixels.end(), frame.rgb, frame.rgb + frame.height * frame.width * 3);
    out.pts_s.push_back(frame.pts_s);
  });
  out.count = f.count;
  out.height = f.height;
  out.width = f.width;
  out.codec = f.codec;
  out.decoder = f.decoder;
  out.bit_exact = f.bit_exact;
  return out;
}

}  // namespace

RgbFrames decode_video_rgb(const std::string& path, int64_t max_frames) {
  return keep_all([&](const FrameSink& sink) { return decode(path, nullptr, nullptr, max_frames, sink); });
}

RgbFrames decode_video_checked(const std::string& path, const VideoCheck& check) {
  return keep_all([&](const FrameSink& sink) { return decode_video_checked(path, check, sink); });
}

namespace {

// The file's bytes, after its size and SHA-256 matched the index (Note [Checked video]).
std::string read_checked(const std::string& path, const VideoCheck& check) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw BadVideoError(path, -1, "cannot open the video file; check the dataset's videos/ folder");
  const auto size = static_cast<int64_t>(in.tellg());
  if (size < 0 || static_cast<uint64_t>(size) != check.bytes)
    throw BadVideoError(path, -1, "the file has " + std::to_string(size) + " bytes but the dataset index records " +
                                      std::to_string(check.bytes) +
                                      " (replaced or truncated); re-run scripts/convert_lerobot.py");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(bytes.data(), size)) throw BadVideoError(path, -1, "read error");
  const std::string digest = sha256_hex(bytes);
  if (digest != check.sha256)
    throw BadVideoError(path, -1, "SHA-256 " + digest.substr(0, 16) + "... differs from the dataset index's " +
                                      check.sha256.substr(0, 16) +
                                      "... (the file was modified or swapped after conversion); restore it or "
                                      "re-run scripts/convert_lerobot.py");
  return bytes;
}

MemoryFile memory_of(const std::string& bytes) {
  MemoryFile m;
  m.data = reinterpret_cast<const uint8_t*>(bytes.data());
  m.size = static_cast<int64_t>(bytes.size());
  return m;
}

}  // namespace

VideoFormat decode_video_checked(const std::string& path, const VideoCheck& check, const FrameSink& sink) {
  const std::string bytes = read_checked(path, check);
  const MemoryFile memory = memory_of(bytes);
  return decode(path, &memory, &check, -1, sink);
}

std::pair<int64_t, int64_t> VideoFile::span_of(int64_t frame) const {
  const auto it = std::upper_bound(key_frames.begin(), key_frames.end(), frame);  // key_frames[0] == 0 <= frame
  const int64_t first = *(it - 1);
  return {first, it == key_frames.end() ? frame_count : *it};
}

VideoFile open_video_checked(const std::string& path, const VideoCheck& check) {
  VideoFile file;
  file.path = path;
  file.bytes = read_checked(path, check);
  const MemoryFile memory = memory_of(file.bytes);
  const std::unique_ptr<Input> in = open_input(path, &memory);
  const int stream = av_find_best_stream(in->fmt.get(), AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
  if (stream < 0) throw BadVideoError(path, -1, "has no video stream");
  const AVRational tb = in->fmt->streams[stream]->time_base;
  const double time_base = static_cast<double>(tb.num) / static_cast<double>(tb.den);
  struct Packet {
    int64_t pts, dts;
    bool key;
  };
  std::vector<Packet> packets;
  std::unique_ptr<AVPacket, PacketFree> packet(av_packet_alloc());
  int rc = 0;
  while ((rc = av_read_frame(in->fmt.get(), packet.get())) >= 0) {
    if (packet->stream_index == stream) {
      if ((packet->flags & AV_PKT_FLAG_CORRUPT) != 0 || packet->pts == AV_NOPTS_VALUE)
        throw BadVideoError(
            path, -1,
            "packet " + std::to_string(packets.size()) +
                ((packet->flags & AV_PKT_FLAG_CORRUPT) != 0 ? " is marked corrupt" : " has no timestamp"));
      packets.push_back({packet->pts, packet->dts, (packet->flags & AV_PKT_FLAG_KEY) != 0});
    }
    av_packet_unref(packet.get());
  }
  if (rc != AVERROR_EOF) throw BadVideoError(path, -1, "read error while scanning packets (" + av_error(rc) + ")");
  if (static_cast<int64_t>(packets.size()) != check.frame_count)
    throw BadVideoError(path, -1,
                        "has " + std::to_string(packets.size()) +
                            " video packets but the dataset index "
                            "records " +
                            std::to_string(check.frame_count) +
                            " frames; the file is not the one converted: re-run scripts/convert_lerobot.py "
                            "(or set data.video_decode=whole)");
  std::sort(packets.begin(), packets.end(), [](const Packet& a, const Packet& b) { return a.pts < b.pts; });
  for (size_t i = 0; i < packets.size(); ++i) {
    const double pts_s = static_cast<double>(packets[i].pts) * time_base;
    if (check.pts_s != nullptr && !(std::fabs(pts_s - check.pts_s[i]) <= check.pts_tolerance_s)) {
      char what[256];
      std::snprintf(what, sizeof(what),
                    "packet timestamp %.6f s differs from the %.6f s the shard's video_pts records for this frame; "
                    "the file is not the one converted: re-run scripts/convert_lerobot.py",
                    pts_s, check.pts_s[i]);
      throw BadVideoError(path, static_cast<int64_t>(i), what);
    }
    if (packets[i].key || i == 0) {
      file.key_frames.push_back(static_cast<int64_t>(i));
      file.key_dts.push_back(packets[i].dts != AV_NOPTS_VALUE ? packets[i].dts : packets[i].pts);
    }
  }
  file.frame_count = static_cast<int64_t>(packets.size());
  return file;
}

VideoFormat decode_span_checked(const VideoFile& file, const VideoCheck& check, int64_t first, int64_t end,
                                const FrameSink& sink) {
  const auto it = std::lower_bound(file.key_frames.begin(), file.key_frames.end(), first);
  if (it == file.key_frames.end() || *it != first || end <= first || end > file.frame_count)
    throw std::invalid_argument("decode_span_checked: [" + std::to_string(first) + ", " + std::to_string(end) +
                                ") is not a span of " + file.path);
  if (check.pts_s == nullptr) throw std::invalid_argument("decode_span_checked: the check needs video_pts");
  SpanRequest span;
  span.first = first;
  span.end = end;
  span.seek_dts = file.key_dts[static_cast<size_t>(it - file.key_frames.begin())];
  const MemoryFile memory = memory_of(file.bytes);
  return decode(file.path, &memory, &check, -1, sink, &span);
}

}  // namespace loongforge::data
