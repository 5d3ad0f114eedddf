// Proves data.image_aspect (SampleOptions::image_aspect, docs/training-semantics.md s3) on a real 4:3
// camera: the bundled dataset's episode 0 re-encoded at 320x240 (make_aspect_dataset.py). Squash, the
// default, is the whole frame's box resize, as before the key. With crop the model's image is the box
// resize of the frame's center 240x240 square; with pad it is the frame on a black 320x320 square,
// which in 64x64 is 8 black rows (-1) above and 8 below the frame's own 5x5 block means. Frames
// resized on the device carry the crop's square or the unpadded frame in the micro-batch (its spec's
// shape), and resized after it (finish_images, as both sources do, here on the CPU) they are the CPU
// path's images bit for bit, through the plain and the ADFE source. The run's start line says
// squashed, cropped to 240x240 or padded to 320x320.
// (The device kernel's padding: test_frames and test_frame_convert_gpu; both trainers: e2e_image_aspect.)
#include <string>  // std::string

#include <ATen/ATen.h>  // at::adaptive_avg_pool2d, at::equal

#include "catch_compat.hpp"
#include "loongforge/data/aspect.hpp"
#include "loongforge/data/batch.hpp"
#include "loongforge/data/dataset.hpp"
#include "loongforge/data/frames.hpp"
#include "loongforge/data/source.hpp"
#include "loongforge/data/video.hpp"
#include "loongforge/engines/adfe/adfe.hpp"

using namespace loongforge;
using namespace loongforge::data;

namespace {
const std::string kData = LOONGFORGE_TEST_ASPECT_DATASET;  // one 320x240 camera, 416 rows

struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
} no_phases;

SampleOptions options(const std::string& aspect, bool on_device = false) {
  SampleOptions o;
  o.micro_batch_size = 8;
  o.image_size = 64;
  o.image_aspect = aspect;
  if (on_device) {
    o.frames_on_device = true;
    o.frame_height = 240, o.frame_width = 320;  // every camera's size after the (absent) image_crop_fraction crop
  }
  return o;
}

// Episode 0's camera as decoded, (416, 240, 320, 3) uint8, and the frame row `row` shows.
at::Tensor decoded_frames(const Dataset& ds) {
  RgbFrames v = decode_video_rgb(ds.episodes()[0].video_paths[0]);
  return at::from_blob(v.pixels.data(), {v.count, v.height, v.width, 3}, at::kByte).clone();
}
at::Tensor frame_of_row(const Dataset& ds, const at::Tensor& frames, int64_t row) {
  return frames[ds.array(0, ds.column_by_name("video_frame:" + ds.cameras()[0].key)).as<int64_t>()[row]];
}
at::Tensor normalised(const at::Tensor& pooled) { return ((pooled / 255.0) - 0.5) / 0.5; }
}  // namespace

TEST_CASE("image aspect: squash, the default, is the box resize of the whole 320x240 frame, as before the key") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions unset = options("squash");
  unset.image_aspect = SampleOptions{}.image_aspect;
  REQUIRE(unset.image_aspect == "squash");
  BatchBuilder squash(ds, options("squash")), by_default(ds, unset);
  const at::Tensor frames = decoded_frames(ds);
  for (const int64_t row : {0, 207, 415}) {
    INFO("row " << row);
    const at::Tensor frame =
        frame_of_row(ds, frames, row).permute({2, 0, 1}).to(at::kFloat).unsqueeze(0);  // (1, 3, 240, 320)
    const at::Tensor image = squash.sample(row).at("images")[0][0];                      // (3, 64, 64)
    REQUIRE(at::equal(image, normalised(at::adaptive_avg_pool2d(frame, {64, 64}))[0]));  // 3.75 x 5 windows
    REQUIRE(at::equal(image, by_default.sample(row).at("images")[0][0]));
  }
}

TEST_CASE("image aspect: with crop a 320x240 camera's image is the box resize of its center 240x240 square") {
  const Dataset ds = Dataset::open(kData);
  REQUIRE(ds.cameras()[0].width == 320);
  REQUIRE(ds.cameras()[0].height == 240);
  BatchBuilder crop(ds, options("crop")), squash(ds, options("squash"));
  const at::Tensor frames = decoded_frames(ds);
  for (const int64_t row : {0, 207, 415}) {
    INFO("row " << row);
    const at::Tensor frame = frame_of_row(ds, frames, row);                  // (240, 320, 3)
    const at::Tensor square = frame.narrow(1, 40, 240).unsqueeze(0);           // columns 40..279
    const at::Tensor image = crop.sample(row).at("images")[0][0];             // (3, 64, 64)
    REQUIRE(at::equal(image, resize_frames(square, 64)[0]));
    REQUIRE_FALSE(at::equal(image, squash.sample(row).at("images")[0][0]));  // the default squashes instead
  }
}

TEST_CASE("image aspect: with pad its image is 8 black rows, the frame's 5x5 block means, then 8 black rows") {
  const Dataset ds = Dataset::open(kData);
  BatchBuilder pad(ds, options("pad"));
  const at::Tensor frames = decoded_frames(ds);
  for (const int64_t row : {0, 207, 415}) {
    INFO("row " << row);
    const at::Tensor frame =
        frame_of_row(ds, frames, row).permute({2, 0, 1}).to(at::kFloat).unsqueeze(0);  // (1, 3, 240, 320)
    const at::Tensor image = pad.sample(row).at("images")[0][0];                         // (3, 64, 64)
    // 40 zero rows on top and 40 below a 320-row square: 8 and 8 output rows of 5, all black
    REQUIRE(image.narrow(1, 0, 8).eq(-1.0f).all().item<bool>());
    REQUIRE(image.narrow(1, 56, 8).eq(-1.0f).all().item<bool>());
    // and between them the frame's own 5x5 windows, 48 rows of them (240 / 5)
    REQUIRE(at::equal(image.narrow(1, 8, 48), normalised(at::adaptive_avg_pool2d(frame, {48, 64}))[0]));
  }
}

TEST_CASE("image aspect: frames resized on the device carry the crop's square or the unpadded frame, and resized "
          "they are the CPU path's images bit for bit, through both sources") {
  const Dataset ds = Dataset::open(kData);
  for (const char* aspect : {"crop", "pad"}) {
    INFO("image_aspect " << aspect);
    const SampleOptions cpu_opt = options(aspect), dev_opt = options(aspect, /*on_device=*/true);
    const int64_t width = std::string(aspect) == "crop" ? 240 : 320;
    REQUIRE(micro_batch_spec(dev_opt)[0].shape == std::vector<int64_t>{8, 1, 240, width, 3});
    BatchBuilder cpu(ds, cpu_opt), dev(ds, dev_opt);
    auto sync = make_sync_source(ds, dev_opt, c10::kCPU, 16);
    auto adfe = adfe::make_async_source(ds, dev_opt, c10::kCPU, 16, {2, 2, 8.0});
    for (int64_t step = 0; step < 3; ++step) {
      INFO("step " << step);
      const MicroBatch want = cpu.micro_batch(step, 0);
      MicroBatch got = dev.micro_batch(step, 0);
      REQUIRE(got.tensors.at("images").scalar_type() == at::kByte);
      REQUIRE(got.tensors.at("images").sizes() == at::IntArrayRef({8, 1, 240, width, 3}));
      finish_images(got.tensors, 64, got.blank_slots, dev_opt.image_aspect == "pad");
      REQUIRE(at::equal(got.tensors.at("images"), want.tensors.at("images")));
      REQUIRE(at::equal(sync->next(step, 0, no_phases).tensors.at("images"), want.tensors.at("images")));
      REQUIRE(at::equal(adfe->next(step, 0, no_phases).tensors.at("images"), want.tensors.at("images")));
    }
  }
}

TEST_CASE("image aspect: the start line says the 4:3 camera is squashed, cropped to 240x240 or padded to 320x320") {
  const Dataset ds = Dataset::open(kData);
  const std::string cam = "'observation.images.ego_view' 320x240 (4:3 = 1.333) ";
  REQUIRE(camera_aspect_line(ds, options("squash")) ==
          "cameras (image_resample box, 64x64 input): " + cam +
              "squashed (width x0.750 relative to height), 416 frames in 1 episode(s)");
  REQUIRE(camera_aspect_line(ds, options("crop")) ==
          "cameras (image_resample box, image_aspect crop, 64x64 input): " + cam +
              "cropped to 240x240 (80 columns cut, 25.0% of the width), 416 frames in 1 episode(s)");
  REQUIRE(camera_aspect_line(ds, options("pad")) ==
          "cameras (image_resample box, image_aspect pad, 64x64 input): " + cam +
              "padded to 320x320 (80 zero rows, 25.0% of the square), 416 frames in 1 episode(s)");
}
