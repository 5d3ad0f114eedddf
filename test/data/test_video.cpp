// Proves the checked video path (Note [Checked video] in src/data/video.cpp,
// Note [Bad videos] in src/data/batch.cpp) on corrupted copies of the bundled
// dataset made here: 4 KiB flipped inside a keyframe, one episode's video
// swapped for another's, a 320x240 video swapped in and a re-timed video are
// each refused naming the file (first by size and SHA-256 against the index;
// with the index forged to match, by the decoder's own error detection, the
// frame count, the resolution and the frame timestamps); a dataset converted
// before hashes were recorded is refused with the fix; with
// on_bad_video=skip the bad video's samples keep their slots, masked out of
// the loss, counted, while every other sample stays bit-identical; FFmpeg's
// log lines reach the data logger; and an AV1 copy (SVT-AV1, -g 2, as LeRobot
// encodes) decodes through libdav1d to the h264 original's frames (PSNR >=
// 30 dB per frame).
#include <fcntl.h>   // open
#include <unistd.h>  // dup, dup2

#include <cmath>    // std::log10
#include <cstdio>   // popen, std::fflush
#include <cstring>  // std::memcmp
#include <fstream>  // std::ifstream, std::ofstream
#include <set>      // std::set
#include <sstream>  // std::stringstream
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/ATen.h>        // at::Tensor
#include <nlohmann/json.hpp>  // nlohmann::json

#include "catch_compat.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/data/batch.hpp"
#include "loongforge/data/dataset.hpp"
#include "loongforge/data/source.hpp"
#include "loongforge/data/video.hpp"
#include "loongforge/engines/adfe/adfe.hpp"

using namespace loongforge;
using namespace loongforge::data;
using lf_catch::Contains;

namespace {
const std::string kData = LOONGFORGE_TEST_DATASET;
const std::string kAv1Data = LOONGFORGE_TEST_AV1_DATASET;
const std::string kCamera = "observation.images.ego_view";

std::string video_of(const std::string& dir, int episode) {
  char name[256];
  std::snprintf(name, sizeof(name), "/videos/chunk-000/%s/episode_%06d.mp4", kCamera.c_str(), episode);
  return dir + name;
}

// A private copy of the converted dataset that a test may damage.
std::string copy_dataset(const std::string& name) {
  const std::string dst = std::string(LOONGFORGE_TEST_MODELS) + "/video-" + name;
  remove_tree(dst);
  copy_tree(kData, dst);
  return dst;
}

std::string run(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  REQUIRE(pclose(p) == 0);
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Flips (XOR 0xFF) 4 KiB inside the largest packet of the video, a keyframe's
// slice data, leaving the container and the NAL length prefixes intact. (A
// flip across a packet boundary breaks a NAL length, which FFmpeg's parser
// already refused before these checks; this one it used to conceal.)
void flip_4k_in_keyframe(const std::string& path) {
  std::stringstream packets(
      run("ffprobe -v error -select_streams v:0 -show_entries packet=size,pos -of csv=p=0 '" + path + "'"));
  int64_t best_size = 0, best_pos = 0;
  for (std::string line; std::getline(packets, line);) {
    const auto comma = line.find(',');
    const int64_t size = std::stoll(line.substr(0, comma)), pos = std::stoll(line.substr(comma + 1));
    if (size > best_size) best_size = size, best_pos = pos;
  }
  REQUIRE(best_size >= 3 * 4096);
  std::string bytes = read_file(path);
  const int64_t at = best_pos + best_size / 4;
  for (int64_t i = at; i < at + 4096; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(bytes[i] ^ 0xFF);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

void ffmpeg(const std::string& args) { run("ffmpeg -v error -nostdin -y " + args + " 2>&1"); }

// Makes the index agree with the (damaged) file: size and SHA-256, as if the
// source video had been damaged before conversion. The decoder-level checks
// must then catch it.
void forge_index(const std::string& dir, int episode) {
  const std::string json_path = dir + "/loongforge_dataset.json";
  nlohmann::json j = nlohmann::json::parse(read_file(json_path));
  const std::string bytes = read_file(video_of(dir, episode));
  for (auto& e : j["episodes"])
    if (e["episode_index"] == episode) {
      e["videos"][0]["bytes"] = bytes.size();
      e["videos"][0]["sha256"] = sha256_hex(bytes);
    }
  std::ofstream(json_path, std::ios::trunc) << j.dump(1);
}

// The index's facts about episode position `episode`'s video.
VideoCheck check_of(const Dataset& ds, size_t episode) {
  const EpisodeInfo& e = ds.episodes()[episode];
  VideoCheck c;
  c.bytes = e.videos[0].bytes;
  c.sha256 = e.videos[0].sha256;
  c.frame_count = e.videos[0].frame_count;
  c.width = ds.cameras()[0].width;
  c.height = ds.cameras()[0].height;
  const ArrayView pts = ds.array(episode, ds.column_by_name("video_pts:" + kCamera));
  c.pts_s = pts.as<double>();
  return c;
}

// decode_video_checked with the index's facts about episode position `episode`.
RgbFrames decode_checked(const Dataset& ds, size_t episode) {
  return decode_video_checked(ds.episodes()[episode].video_paths[0], check_of(ds, episode));
}

SampleOptions options(const std::string& policy) {
  SampleOptions o;
  o.micro_batch_size = 8;
  o.image_size = 64;
  o.on_bad_video = policy;
  return o;
}

// The message a bad video of episode 0 stops training with, up to the cause.
std::string stop_message(const std::string& dir) {
  return "bad video (data.on_bad_video=error): shard shard-00000.lfshard, episode 0, camera '" + kCamera +
         "', video " + video_of(dir, 0) + ": ";
}

double psnr(const uint8_t* a, const uint8_t* b, size_t n) {
  double se = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    se += d * d;
  }
  const double mse = se / static_cast<double>(n);
  return mse == 0 ? 99.0 : 10.0 * std::log10(255.0 * 255.0 / mse);
}
}  // namespace

TEST_CASE("video: a clean episode video passes every check and decodes to the same frames as before") {
  const Dataset ds = Dataset::open(kData);
  const RgbFrames checked = decode_checked(ds, 0);
  const RgbFrames plain = decode_video_rgb(ds.episodes()[0].video_paths[0]);
  REQUIRE(checked.count == 416);
  REQUIRE(checked.decoder == "h264");
  REQUIRE(checked.pixels == plain.pixels);
  const ArrayView pts = ds.array(0, ds.column_by_name("video_pts:" + kCamera));
  for (int64_t i = 0; i < checked.count; ++i) REQUIRE(checked.pts_s[i] == pts.as<double>()[i]);
}

TEST_CASE("video: the streaming decode hands over each frame once, in order, from one frame-sized buffer, "
          "with the bits and timestamps of the whole-video decode") {
  const Dataset ds = Dataset::open(kData);
  const RgbFrames whole = decode_checked(ds, 0);
  const size_t frame_bytes = static_cast<size_t>(whole.height * whole.width * 3);
  std::set<const uint8_t*> buffers;
  int64_t next = 0;
  const VideoFormat f = decode_video_checked(ds.episodes()[0].video_paths[0], check_of(ds, 0),
                                             [&](const DecodedFrame& frame) {
    REQUIRE(frame.index == next);
    REQUIRE(frame.height == whole.height);
    REQUIRE(frame.width == whole.width);
    REQUIRE(frame.pts_s == whole.pts_s[static_cast<size_t>(next)]);
    REQUIRE(std::memcmp(frame.rgb, whole.pixels.data() + static_cast<size_t>(next) * frame_bytes, frame_bytes) == 0);
    buffers.insert(frame.rgb);
    ++next;
  });
  REQUIRE(f.count == whole.count);
  REQUIRE(next == whole.count);
  REQUIRE(buffers.size() == 1);  // one full-size frame held, whatever the video's length
}

TEST_CASE("video: 4 KiB flipped inside a keyframe is refused before decoding by its SHA-256, naming the file") {
  const std::string dir = copy_dataset("flip");
  flip_4k_in_keyframe(video_of(dir, 0));
  const Dataset ds = Dataset::open(dir);
  BatchBuilder builder(ds, options("error"));
  REQUIRE_THROWS_WITH(builder.sample(3), Contains(stop_message(dir) + "SHA-256 ") &&
                                             Contains("(the file was modified or swapped after conversion)") &&
                                             Contains("data.on_bad_video=skip"));
}

TEST_CASE("video: a keyframe damaged before conversion (index forged to match) is a decoder error, not a concealed frame") {
  const std::string dir = copy_dataset("flip-forged");
  flip_4k_in_keyframe(video_of(dir, 0));
  forge_index(dir, 0);
  const Dataset ds = Dataset::open(dir);
  try {
    decode_checked(ds, 0);
    FAIL("the damaged video decoded");
  } catch (const BadVideoError& e) {
    INFO(e.what());
    REQUIRE(e.path() == video_of(dir, 0));
    REQUIRE(e.frame() > 0);  // the damage is in the second keyframe
    REQUIRE(e.frame() < 416);
    REQUIRE_THAT(e.cause(), Contains("the bitstream is corrupt"));
  }
  // The unchecked decode has the same error detection.
  REQUIRE_THROWS_WITH(decode_video_rgb(video_of(dir, 0)), Contains("the bitstream is corrupt"));
  BatchBuilder builder(ds, options("error"));
  const std::string prefix = stop_message(dir);
  REQUIRE_THROWS_WITH(builder.sample(3), Contains(prefix.substr(0, prefix.size() - 2) + ", frame ") &&
                                             Contains("the bitstream is corrupt"));
}

TEST_CASE("video: one episode's video swapped for another's is refused by size, and by frame count when forged") {
  const std::string dir = copy_dataset("swap");
  std::ofstream(video_of(dir, 0), std::ios::binary | std::ios::trunc) << read_file(video_of(kData, 1));
  {
    const Dataset ds = Dataset::open(dir);
    BatchBuilder builder(ds, options("error"));
    REQUIRE_THROWS_WITH(builder.sample(3),
                        Contains(stop_message(dir) + "the file has " +
                                 std::to_string(read_file(video_of(kData, 1)).size()) +
                                 " bytes but the dataset index records " +
                                 std::to_string(read_file(video_of(kData, 0)).size())));
  }
  forge_index(dir, 0);
  const Dataset ds = Dataset::open(dir);
  REQUIRE(Dataset::open(kData).episodes()[1].length == 470);  // same frame times, 54 frames more
  REQUIRE_THROWS_WITH(decode_checked(ds, 0), Contains(video_of(dir, 0) + ": frame 416: the video has more frames "
                                                                          "than the 416 the dataset index records"));
}

TEST_CASE("video: a 320x240 video swapped in is refused by size, and by its resolution when forged, naming the file") {
  const std::string dir = copy_dataset("small");
  ffmpeg("-i '" + video_of(kData, 0) + "' -vf scale=320:240 -c:v libx264 -pix_fmt yuv420p -g 2 '" + video_of(dir, 0) + "'");
  {
    const Dataset ds = Dataset::open(dir);
    BatchBuilder builder(ds, options("error"));
    REQUIRE_THROWS_WITH(builder.sample(3), Contains(stop_message(dir) + "the file has "));
  }
  forge_index(dir, 0);
  const Dataset ds = Dataset::open(dir);
  BatchBuilder builder(ds, options("error"));
  REQUIRE_THROWS_WITH(builder.sample(3),
                      Contains(stop_message(dir) + "video is 320x240 (width x height) but the dataset's cameras[] "
                                                   "entry says 256x256"));
}

TEST_CASE("video: a re-timed video (index forged) is refused at the first frame whose timestamp differs") {
  const std::string dir = copy_dataset("retimed");
  // Same frames, each shown twice as long: frame 1 at 0.1 s instead of 0.05 s.
  ffmpeg("-i '" + video_of(kData, 0) + "' -vf setpts=2*PTS -fps_mode passthrough -c:v libx264 -pix_fmt yuv420p -g 2 '" +
         video_of(dir, 0) + "'");
  forge_index(dir, 0);
  const Dataset ds = Dataset::open(dir);
  REQUIRE_THROWS_WITH(decode_checked(ds, 0),
                      Contains(video_of(dir, 0) + ": frame 1: decoded timestamp 0.100000 s differs from the "
                                                  "0.050000 s the shard's video_pts records"));
}

TEST_CASE("video: a dataset converted before video hashes were recorded is refused with the fix") {
  const std::string dir = copy_dataset("old-format");
  const std::string json_path = dir + "/loongforge_dataset.json";
  nlohmann::json j = nlohmann::json::parse(read_file(json_path));
  for (auto& e : j["episodes"]) e["videos"][0].erase("sha256");
  std::ofstream(json_path, std::ios::trunc) << j.dump(1);
  REQUIRE_THROWS_WITH(Dataset::open(dir),
                      Contains(json_path + ": episode 0 video 'videos/chunk-000/" + kCamera +
                               "/episode_000000.mp4' has no sha256") &&
                          Contains("re-run scripts/convert_lerobot.py SRC " + dir + " --overwrite"));
}

TEST_CASE("video: with on_bad_video=skip a bad video's samples keep their slots, masked out and counted, the rest unchanged") {
  const std::string dir = copy_dataset("skip");
  flip_4k_in_keyframe(video_of(dir, 0));
  const Dataset bad_ds = Dataset::open(dir), good_ds = Dataset::open(kData);
  BatchBuilder bad(bad_ds, options("skip")), good(good_ds, options("skip"));
  Sampler order(2096, 42, true, 0, 1, 8, 1);
  int64_t skipped = 0, kept = 0;
  for (int64_t step = 0; step < 4; ++step) {
    const std::vector<int64_t> ids = order.micro_batch(step, 0);
    MicroBatch b = bad.micro_batch(step, 0), g = good.micro_batch(step, 0);
    int64_t skipped_valid = 0;
    for (int64_t s = 0; s < 8; ++s) {
      INFO("step " << step << " slot " << s << " sample " << ids[s]);
      if (ids[s] < 416) {  // episode 0
        ++skipped;
        skipped_valid += g.tensors["action_mask"][s].sum().item<int64_t>();
        REQUIRE(b.tensors["action_mask"][s].sum().item<float>() == 0.0f);
        REQUIRE(b.tensors["actions"][s].abs().sum().item<float>() == 0.0f);
        REQUIRE(b.tensors["images"][s].abs().sum().item<float>() == 0.0f);
      } else {
        ++kept;
        for (const char* k : {"images", "state", "actions", "action_mask", "text_tokens", "text_mask"})
          REQUIRE(at::equal(b.tensors[k][s], g.tensors[k][s]));
      }
      REQUIRE(at::equal(b.tensors["fm_noise"][s], g.tensors["fm_noise"][s]));
    }
    REQUIRE(b.num_valid == g.num_valid - skipped_valid);
    REQUIRE(b.num_valid == b.tensors["action_mask"].sum().item<int64_t>());
  }
  REQUIRE(skipped > 0);
  REQUIRE(kept > 0);
  REQUIRE(bad.stats().samples_skipped == skipped);
  REQUIRE(bad.stats().videos_bad == 1);  // found once, never decoded again
  REQUIRE(good.stats().samples_skipped == 0);
}

TEST_CASE("video: with frames resized on the device, a skipped sample's images are zeros after the resize too") {
  const std::string dir = copy_dataset("skip-device");
  flip_4k_in_keyframe(video_of(dir, 0));
  const Dataset bad_ds = Dataset::open(dir);
  SampleOptions dev = options("skip");
  dev.frames_on_device = true;
  dev.frame_height = bad_ds.cameras()[0].height;
  dev.frame_width = bad_ds.cameras()[0].width;
  BatchBuilder bad_cpu(bad_ds, options("skip")), bad_dev(bad_ds, dev);
  int64_t blanks = 0;
  for (int64_t step = 0; step < 4; ++step) {
    const MicroBatch want = bad_cpu.micro_batch(step, 0);
    MicroBatch got = bad_dev.micro_batch(step, 0);
    blanks += static_cast<int64_t>(got.blank_slots.size());
    finish_images(got.tensors, 64, got.blank_slots);  // the sources' last step (on the CPU here)
    INFO("step " << step);
    REQUIRE(got.blank_slots == want.blank_slots);
    REQUIRE(at::equal(got.tensors.at("images"), want.tensors.at("images")));
  }
  REQUIRE(blanks > 0);
}

// Decodes `path`, expecting a BadVideoError, with stderr captured; returns it.
std::string decode_capturing_stderr(const std::string& path, const std::string& log_path) {
  std::fflush(stderr);
  const int saved = dup(2);
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  dup2(fd, 2);
  bool threw = false;
  try {
    decode_video_rgb(path);
  } catch (const BadVideoError&) {
    threw = true;
  }
  std::fflush(stderr);
  dup2(saved, 2);
  ::close(fd);
  ::close(saved);
  REQUIRE(threw);
  return read_file(log_path);
}

TEST_CASE("video: FFmpeg's own log lines go through the data logger, errors at error, info at debug") {
  const std::string dir = copy_dataset("log");
  // 4 KiB flipped across packets: FFmpeg's parser logs an error (a broken NAL length).
  {
    std::string bytes = read_file(video_of(dir, 0));
    for (size_t i = bytes.size() / 2; i < bytes.size() / 2 + 4096; ++i) bytes[i] = static_cast<char>(bytes[i] ^ 0xFF);
    std::ofstream(video_of(dir, 0), std::ios::binary | std::ios::trunc) << bytes;
  }
  std::string log = decode_capturing_stderr(video_of(dir, 0), dir + "/stderr-1.txt");
  INFO(log);
  REQUIRE_THAT(log, Contains("[loongforge.data] [error] ffmpeg: [h264 @ "));
  // Inside a keyframe: h264 conceals and says so at its info level, which we
  // show at debug (and not at info).
  std::ofstream(video_of(dir, 1), std::ios::binary | std::ios::trunc) << read_file(video_of(kData, 0));
  flip_4k_in_keyframe(video_of(dir, 1));
  log = decode_capturing_stderr(video_of(dir, 1), dir + "/stderr-2.txt");
  REQUIRE_THAT(log, !Contains("ffmpeg: [h264 @ "));
  set_log_level("debug");
  log = decode_capturing_stderr(video_of(dir, 1), dir + "/stderr-3.txt");
  set_log_level("info");
  INFO(log);
  REQUIRE_THAT(log, Contains("[loongforge.data] [debug] ffmpeg: [h264 @ ") && Contains("concealing"));
}

TEST_CASE("video: an AV1 copy (SVT-AV1, -g 2) decodes through libdav1d to the h264 frames, PSNR >= 30 dB each") {
  const Dataset h264 = Dataset::open(kData), av1 = Dataset::open(kAv1Data);
  REQUIRE(av1.episodes().size() == h264.episodes().size());
  for (size_t e : {size_t{0}, size_t{3}}) {
    const RgbFrames a = decode_checked(av1, e), h = decode_video_rgb(h264.episodes()[e].video_paths[0]);
    REQUIRE(a.codec == "av1");
    REQUIRE(a.decoder == "libdav1d");
    REQUIRE(a.count == h.count);
    REQUIRE(a.width == h.width);
    REQUIRE(a.height == h.height);
    const size_t frame_bytes = static_cast<size_t>(h.width * h.height * 3);
    double worst = 99.0;
    for (int64_t i = 0; i < a.count; ++i)
      worst = std::min(worst, psnr(a.pixels.data() + i * frame_bytes, h.pixels.data() + i * frame_bytes, frame_bytes));
    INFO("episode " << e << ": lowest per-frame PSNR " << worst << " dB over " << a.count << " frames");
    CHECK(worst >= 30.0);
    // The same frame is nearer than one 3 s later (the PSNR bound is not met by any frame).
    REQUIRE(psnr(a.pixels.data() + 100 * frame_bytes, h.pixels.data() + 160 * frame_bytes, frame_bytes) <
            psnr(a.pixels.data() + 100 * frame_bytes, h.pixels.data() + 100 * frame_bytes, frame_bytes));
  }
}

namespace {
// Every span of episode position `e` decoded alone equals the whole decode's frames, bit for bit.
int64_t check_every_span(const Dataset& ds, size_t e, const std::string& codec) {
  const RgbFrames whole = decode_checked(ds, e);
  const VideoCheck check = check_of(ds, e);
  const VideoFile file = open_video_checked(ds.episodes()[e].video_paths[0], check);
  REQUIRE(file.frame_count == whole.count);
  REQUIRE(file.key_frames.front() == 0);
  REQUIRE(file.key_frames.size() == file.key_dts.size());
  const size_t frame_bytes = static_cast<size_t>(whole.height * whole.width * 3);
  int64_t next = 0;
  for (size_t k = 0; k < file.key_frames.size(); ++k) {
    const int64_t first = file.key_frames[k];
    const int64_t end = k + 1 < file.key_frames.size() ? file.key_frames[k + 1] : file.frame_count;
    REQUIRE(file.span_of(first) == std::make_pair(first, end));
    REQUIRE(file.span_of(end - 1) == std::make_pair(first, end));
    const VideoFormat f = decode_span_checked(file, check, first, end, [&](const DecodedFrame& frame) {
      INFO(codec << " episode " << e << " span " << k << " frame " << frame.index);
      REQUIRE(frame.index == next);
      REQUIRE(frame.pts_s == whole.pts_s[static_cast<size_t>(next)]);
      REQUIRE(std::memcmp(frame.rgb, whole.pixels.data() + static_cast<size_t>(next) * frame_bytes, frame_bytes) == 0);
      ++next;
    });
    REQUIRE(f.count == end - first);
  }
  REQUIRE(next == whole.count);  // the spans cover the video once, in order
  return static_cast<int64_t>(file.key_frames.size());
}
}  // namespace

TEST_CASE(
    "video: every keyframe span decoded alone (a seek) gives the whole decode's frames bit for bit, "
    "h264 with B-frames and its AV1 copy") {
  const Dataset h264 = Dataset::open(kData), av1 = Dataset::open(kAv1Data);
  for (size_t e : {size_t{0}, size_t{3}}) {
    const int64_t hs = check_every_span(h264, e, "h264"), as = check_every_span(av1, e, "av1");
    INFO("episode " << e << ": " << hs << " h264 spans, " << as << " AV1 spans");
    REQUIRE(hs >= 2);
    REQUIRE(as > 100);  // -g 2: a keyframe every 2 frames or so
  }
}

TEST_CASE(
    "video: span decoding checks the file once when it is opened: a swapped video, a packet count or a "
    "timestamp off the index is refused naming the file; a span that is not one is refused") {
  const Dataset ds = Dataset::open(kData);
  VideoCheck check = check_of(ds, 0);
  const std::string path = ds.episodes()[0].video_paths[0];
  VideoCheck wrong_hash = check;
  wrong_hash.sha256 = std::string(64, '0');
  REQUIRE_THROWS_WITH(open_video_checked(path, wrong_hash), Contains(path) && Contains("SHA-256 "));
  VideoCheck fewer = check;
  fewer.frame_count -= 1;
  REQUIRE_THROWS_WITH(open_video_checked(path, fewer),
                      Contains(path) && Contains("has 416 video packets but the dataset index records 415 frames"));
  std::vector<double> shifted(check.pts_s, check.pts_s + check.frame_count);
  shifted[200] += 0.01;
  VideoCheck retimed = check;
  retimed.pts_s = shifted.data();
  REQUIRE_THROWS_WITH(open_video_checked(path, retimed), Contains(path + ": frame 200: packet timestamp"));
  const VideoFile file = open_video_checked(path, check);
  REQUIRE_THROWS_WITH(decode_span_checked(file, check, 1, 2, [](const DecodedFrame&) {}), Contains("is not a span"));
  // A span decode still checks each frame against video_pts: one retimed inside the span is an error.
  const auto [first, end] = file.span_of(200);
  REQUIRE_THROWS_WITH(decode_span_checked(file, retimed, first, end, [](const DecodedFrame&) {}),
                      Contains(path + ": frame 200: decoded timestamp"));
}

namespace {
struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
};

void require_same_batch(const ReadyBatch& a, const ReadyBatch& b) {
  REQUIRE(a.num_valid == b.num_valid);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [key, t] : a.tensors) {
    INFO("key " << key);
    REQUIRE(at::equal(t, b.tensors.at(key)));
  }
}

SampleOptions span_options(const std::string& decode, const std::string& policy = "error") {
  SampleOptions o = options(policy);
  o.shuffle = true;
  o.video_decode = decode;
  return o;
}
}  // namespace

TEST_CASE(
    "video: with data.video_decode=span the plain and the ADFE source give whole-video decoding's "
    "micro-batches bit for bit, h264 and AV1, also when a small cache evicts spans, decoding fewer frames") {
  NoPhases phases;
  for (const std::string& dir : {kData, kAv1Data}) {
    const Dataset ds = Dataset::open(dir);
    auto whole = make_sync_source(ds, span_options("whole"), c10::kCPU, 16);
    auto span = make_sync_source(ds, span_options("span"), c10::kCPU, 16);
    auto adfe = adfe::make_async_source(ds, span_options("span"), c10::kCPU, 16, {4, 2, 64.0});
    SampleOptions tiny = span_options("span");
    tiny.frame_cache_mb = 1;  // a few spans: most are evicted and decoded again
    auto evicting = make_sync_source(ds, tiny, c10::kCPU, 16);
    for (int64_t step = 0; step < 4; ++step) {
      INFO(dir << " step " << step);
      const ReadyBatch want = whole->next(step, 0, phases);
      require_same_batch(span->next(step, 0, phases), want);
      require_same_batch(adfe->next(step, 0, phases), want);
      require_same_batch(evicting->next(step, 0, phases), want);
    }
    const DataStats w = whole->stats(), s = span->stats();
    INFO(dir << ": whole decoded " << w.frames_decoded << " frames in " << w.spans_decoded << " decodes; span "
             << s.frames_decoded << " in " << s.spans_decoded << " spans of " << s.videos_decoded << " files");
    REQUIRE(w.spans_decoded == w.videos_decoded);
    REQUIRE(s.videos_decoded == w.videos_decoded);  // each file read and checked once
    REQUIRE(s.video_bytes_read == w.video_bytes_read);
    // The h264 videos have 2 spans each and 32 samples touch both of every video: the same frames.
    REQUIRE(s.frames_decoded <= w.frames_decoded);
    if (dir == kAv1Data) REQUIRE(s.frames_decoded * 10 < w.frames_decoded);  // -g 2: spans of about 2 frames
    REQUIRE(evicting->stats().cache_bytes <= (1 << 20) + 2 * 416 * 3 * 64 * 64 * 4);
  }
}

TEST_CASE(
    "video: with span decoding a bad video stops with the same message, or its samples are skipped and "
    "counted as with whole-video decoding") {
  const std::string dir = copy_dataset("span-swap");
  std::ofstream(video_of(dir, 0), std::ios::binary | std::ios::trunc) << read_file(video_of(kData, 1));
  const Dataset ds = Dataset::open(dir);
  {
    BatchBuilder whole(ds, span_options("whole")), span(ds, span_options("span"));
    std::string a, b;
    try {
      whole.sample(3);
    } catch (const DataError& e) {
      a = e.what();
    }
    try {
      span.sample(3);
    } catch (const DataError& e) {
      b = e.what();
    }
    REQUIRE_THAT(a, Contains(stop_message(dir) + "the file has "));
    REQUIRE(a == b);
  }
  BatchBuilder whole(ds, span_options("whole", "skip")), span(ds, span_options("span", "skip"));
  for (int64_t step = 0; step < 4; ++step) {
    INFO("step " << step);
    MicroBatch w = whole.micro_batch(step, 0), s = span.micro_batch(step, 0);
    REQUIRE(w.num_valid == s.num_valid);
    for (const auto& [key, t] : w.tensors) REQUIRE(at::equal(t, s.tensors.at(key)));
  }
  REQUIRE(whole.stats().samples_skipped > 0);
  REQUIRE(span.stats().samples_skipped == whole.stats().samples_skipped);
  REQUIRE(span.stats().videos_bad == 1);
}
