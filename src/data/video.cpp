// FFmpeg decode of a whole video to RGB frames. The only file of the data
// room that includes FFmpeg headers.
#include "loongforge/data/video.hpp"

#include <algorithm>  // std::clamp
#include <memory>     // std::unique_ptr

extern "C" {
#include <libavcodec/avcodec.h>    // AVCodecContext, avcodec_send_packet
#include <libavformat/avformat.h>  // AVFormatContext, av_read_frame
#include <libavutil/imgutils.h>    // av_image_fill_arrays
#include <libswscale/swscale.h>    // sws_scale
}

#include "loongforge/common/error.hpp"

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

RgbFrames decode_video_rgb(const std::string& path, int64_t max_frames) {
  auto fail = [&](const std::string& what) { return DataError(path + ": " + what); };
  AVFormatContext* raw_fmt = nullptr;
  int rc = avformat_open_input(&raw_fmt, path.c_str(), nullptr, nullptr);
  if (rc < 0) throw fail("cannot open video (" + av_error(rc) + "); check the dataset's videos/ folder");
  std::unique_ptr<AVFormatContext, FormatCloser> fmt(raw_fmt);
  if ((rc = avformat_find_stream_info(fmt.get(), nullptr)) < 0)
    throw fail("cannot read stream info (" + av_error(rc) + "): truncated or not a video file?");
  const AVCodec* codec = nullptr;
  const int stream = av_find_best_stream(fmt.get(), AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
  if (stream < 0) throw fail("has no video stream");
  if (codec == nullptr)
    throw fail("no decoder for codec '" + std::string(avcodec_get_name(fmt->streams[stream]->codecpar->codec_id)) +
               "' in this FFmpeg build");
  std::unique_ptr<AVCodecContext, CodecCloser> dec(avcodec_alloc_context3(codec));
  avcodec_parameters_to_context(dec.get(), fmt->streams[stream]->codecpar);
  dec->thread_count = 1;  // callers parallelize across videos
  if ((rc = avcodec_open2(dec.get(), codec, nullptr)) < 0) throw fail("cannot open decoder (" + av_error(rc) + ")");

  RgbFrames out;
  out.width = dec->width;
  out.height = dec->height;
  const size_t frame_bytes = static_cast<size_t>(out.width * out.height * 3);
  std::unique_ptr<AVFrame, FrameFree> frame(av_frame_alloc());
  std::unique_ptr<AVPacket, PacketFree> packet(av_packet_alloc());
  std::unique_ptr<SwsContext, SwsFree> sws;

  auto take = [&](AVFrame* f) {
    if (max_frames >= 0 && out.count >= max_frames) return;
    if (f->width != out.width || f->height != out.height)
      throw fail("frame " + std::to_string(out.count) + " changes size mid-stream");
    out.pixels.resize(out.pixels.size() + frame_bytes);
    uint8_t* dst = out.pixels.data() + out.count * frame_bytes;
    if (f->format == AV_PIX_FMT_YUV420P) {
      yuv420p_to_rgb(f->data[0], f->linesize[0], f->data[1], f->linesize[1], f->data[2], f->linesize[2], out.width,
                     out.height, dst);
    } else {
      out.bit_exact = false;
      if (!sws)
        sws.reset(sws_getContext(f->width, f->height, static_cast<AVPixelFormat>(f->format), f->width, f->height,
                                 AV_PIX_FMT_RGB24, SWS_BILINEAR | SWS_ACCURATE_RND, nullptr, nullptr, nullptr));
      if (!sws) throw fail("cannot convert pixel format " + std::to_string(f->format) + " to RGB");
      uint8_t* planes[4] = {dst, nullptr, nullptr, nullptr};
      int strides[4] = {static_cast<int>(out.width * 3), 0, 0, 0};
      sws_scale(sws.get(), f->data, f->linesize, 0, f->height, planes, strides);
    }
    ++out.count;
  };
  auto drain = [&]() {
    while ((rc = avcodec_receive_frame(dec.get(), frame.get())) >= 0) {
      take(frame.get());
      av_frame_unref(frame.get());
    }
    if (rc != AVERROR(EAGAIN) && rc != AVERROR_EOF)
      throw fail("decode error after frame " + std::to_string(out.count) + " (" + av_error(rc) + ")");
  };
  while ((rc = av_read_frame(fmt.get(), packet.get())) >= 0) {
    if (packet->stream_index == stream) {
      const int sent = avcodec_send_packet(dec.get(), packet.get());
      av_packet_unref(packet.get());
      if (sent < 0) throw fail("corrupt packet after frame " + std::to_string(out.count) + " (" + av_error(sent) + ")");
      drain();
      if (max_frames >= 0 && out.count >= max_frames) return out;
    } else {
      av_packet_unref(packet.get());
    }
  }
  if (rc != AVERROR_EOF) throw fail("read error after frame " + std::to_string(out.count) + " (" + av_error(rc) + ")");
  avcodec_send_packet(dec.get(), nullptr);  // flush delayed frames
  drain();
  return out;
}

}  // namespace loongforge::data
