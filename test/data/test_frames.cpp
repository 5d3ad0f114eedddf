// Proves that frames resized on the device are the CPU path's frames: the
// arithmetic the kernel runs (cuda/data/frame_math.hpp, here on the host)
// equals ATen's adaptive_avg_pool2d and the normalisation bit for bit, and a
// micro-batch built with frames_on_device (cropped uint8 frames in the cache
// and the batch) and resized by resize_frames equals the CPU-resize batch bit
// for bit, crop included. Padded to a square first (data.image_aspect pad),
// the kernel's arithmetic, which reads the pad as zeros without storing it,
// equals ATen's zero pad and box resize bit for bit too; box_window keeps the
// crop's center square (data.image_aspect crop), after image_crop_fraction's
// crop; and crop or pad are refused, naming the key, the model and why, for
// a model that keeps upstream's preprocessing (a processor record, or an
// image_resample other than box). The device kernel itself is held to the same
// arithmetic by test_frame_convert_gpu. The bicubic_aa path (GR00T N1.7)
// normalises every uint8 value as upstream's Qwen3-VL processor does,
// (v - 127.5) / 127.5 in float (test/reference/test_n17_pixel_values.py holds
// upstream's pixel_values to the same IEEE division).
#include <random>  // std::mt19937

#include <ATen/ATen.h>  // at::randint

#include "catch_compat.hpp"
#include "frame_math.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/data/batch.hpp"
#include "loongforge/data/dataset.hpp"
#include "loongforge/data/frames.hpp"
#include "loongforge/data/source.hpp"

using namespace loongforge::data;
using lf_catch::Contains;

namespace {
const std::string kData = LOONGFORGE_TEST_DATASET;

// frame_math.hpp's arithmetic for every output value of uint8 frames (n, h, w, 3).
at::Tensor host_arithmetic(const at::Tensor& u8, int64_t S) {
  const int64_t n = u8.size(0), h = u8.size(1), w = u8.size(2);
  const at::Tensor src = u8.contiguous();
  at::Tensor out = at::empty({n, 3, S, S}, at::kFloat);
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x)
          *o++ = loongforge::cuda::resized_pixel(src.data_ptr<uint8_t>() + i * h * w * 3, h, w, S, y, x, c);
  return out;
}

// The same with each frame centered on a black square first (frame_math.hpp padded_resized_pixel).
at::Tensor host_padded_arithmetic(const at::Tensor& u8, int64_t S) {
  const int64_t n = u8.size(0), h = u8.size(1), w = u8.size(2);
  const at::Tensor src = u8.contiguous();
  at::Tensor out = at::empty({n, 3, S, S}, at::kFloat);
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x)
          *o++ = loongforge::cuda::padded_resized_pixel(src.data_ptr<uint8_t>() + i * h * w * 3, h, w, S, y, x, c);
  return out;
}

// ATen's box resize, the definition resize_frames keeps on the CPU (Note [Box resize on the CPU]): the frame
// to float, zeros around it to a square (pad), adaptive_avg_pool2d, the normalisation.
at::Tensor aten_box_resize(const at::Tensor& u8, int64_t S, bool pad = false) {
  const int64_t h = u8.size(1), w = u8.size(2), q = std::max(h, w);
  at::Tensor f = u8.permute({0, 3, 1, 2}).to(at::kFloat).contiguous();
  if (pad && h != w) f = at::constant_pad_nd(f, {(q - w) / 2, q - w - (q - w) / 2, (q - h) / 2, q - h - (q - h) / 2}, 0);
  return ((at::adaptive_avg_pool2d(f, {S, S}) / 255.0) - 0.5) / 0.5;
}

SampleOptions options(bool on_device, double crop) {
  SampleOptions o;
  o.micro_batch_size = 8;
  o.image_size = 64;
  o.image_crop_fraction = crop;
  if (on_device) {
    const Dataset ds = Dataset::open(kData);
    o.frames_on_device = true;
    o.frame_height = cropped_size(ds.cameras()[0].height, crop);
    o.frame_width = cropped_size(ds.cameras()[0].width, crop);
  }
  return o;
}
}  // namespace

TEST_CASE("frames: the device kernel's arithmetic equals ATen's box resize and normalisation bit for bit") {
  struct Size {
    int64_t h, w, S;
  };
  for (const Size& z : {Size{256, 256, 224}, Size{240, 320, 64}, Size{480, 640, 96}, Size{100, 77, 64},
                        Size{37, 53, 224}, Size{256, 256, 256}}) {
    const at::Tensor u8 = at::randint(0, 256, {2, z.h, z.w, 3}, at::kByte);
    INFO(z.h << "x" << z.w << " -> " << z.S);
    REQUIRE(at::equal(host_arithmetic(u8, z.S), aten_box_resize(u8, z.S)));
    REQUIRE(at::equal(resize_frames(u8, z.S), aten_box_resize(u8, z.S)));  // the CPU's integer sums
  }
}

TEST_CASE("frames: on the CPU, resize_frames equals ATen's pad, box resize and normalisation bit for bit, any size") {
  at::manual_seed(7);
  for (int k = 0; k < 60; ++k) {
    const int64_t h = at::randint(1, 400, {1}).item<int64_t>(), w = at::randint(1, 400, {1}).item<int64_t>();
    const int64_t S = at::randint(1, 260, {1}).item<int64_t>(), n = at::randint(1, 4, {1}).item<int64_t>();
    const at::Tensor u8 = at::randint(0, 256, {n, h, w, 3}, at::kByte);
    INFO(n << " x " << h << "x" << w << " -> " << S);
    REQUIRE(at::equal(resize_frames(u8, S), aten_box_resize(u8, S)));
    REQUIRE(at::equal(resize_frames(u8, S, /*pad_square=*/true), aten_box_resize(u8, S, /*pad=*/true)));
  }
  // Leading dimensions are kept; windows too large for an exact float sum take ATen's own path.
  const at::Tensor u8 = at::randint(0, 256, {2, 3, 50, 60, 3}, at::kByte);
  REQUIRE(at::equal(resize_frames(u8, 16), aten_box_resize(u8.reshape({6, 50, 60, 3}), 16).reshape({2, 3, 3, 16, 16})));
  const at::Tensor big = at::randint(0, 256, {1, 600, 600, 3}, at::kByte);
  REQUIRE(at::equal(resize_frames(big, 2), aten_box_resize(big, 2)));
}

TEST_CASE("frames: padded to a square, the device kernel's arithmetic equals ATen's zero pad and box resize bit "
          "for bit") {
  struct Size {
    int64_t h, w, S;
  };
  for (const Size& z : {Size{240, 320, 64}, Size{320, 240, 64}, Size{31, 44, 16}, Size{100, 77, 64},
                        Size{37, 53, 224}, Size{480, 640, 96}}) {
    const at::Tensor u8 = at::randint(1, 256, {2, z.h, z.w, 3}, at::kByte);  // no black pixel of its own
    INFO(z.h << "x" << z.w << " -> " << z.S);
    const int64_t q = std::max(z.h, z.w), top = (q - z.h) / 2, left = (q - z.w) / 2;
    const at::Tensor square = at::constant_pad_nd(u8, {0, 0, left, q - z.w - left, top, q - z.h - top}, 0);
    const at::Tensor want = aten_box_resize(square, z.S);  // the zeros stored, then the box resize
    REQUIRE(at::equal(host_padded_arithmetic(u8, z.S), want));
    REQUIRE(at::equal(resize_frames(u8, z.S, /*pad_square=*/true), want));
    REQUIRE_FALSE(at::equal(resize_frames(u8, z.S), want));  // squashed instead
  }
  // 31 x 44 to 44 x 44 unresized: 6 black rows on top, the frame, the odd 7 below
  const at::Tensor u8 = at::randint(1, 256, {1, 31, 44, 3}, at::kByte);
  const at::Tensor padded = resize_frames(u8, 44, true);
  REQUIRE(padded.narrow(2, 0, 6).eq(-1.0f).all().item<bool>());
  REQUIRE(at::equal(padded.narrow(2, 6, 31), ((u8.permute({0, 3, 1, 2}).to(at::kFloat) / 255.0) - 0.5) / 0.5));
  REQUIRE(padded.narrow(2, 37, 7).eq(-1.0f).all().item<bool>());
  // a square frame is left as it is
  const at::Tensor square = at::randint(0, 256, {1, 40, 40, 3}, at::kByte);
  REQUIRE(at::equal(resize_frames(square, 32, true), resize_frames(square, 32)));
}

TEST_CASE("frames: box_window keeps image_crop_fraction's center crop, and with image_aspect crop its center "
          "square") {
  const auto same = [](FrameWindow a, FrameWindow b) {
    return a.top == b.top && a.left == b.left && a.height == b.height && a.width == b.width;
  };
  REQUIRE(same(box_window(240, 320, 1.0, "squash"), {0, 0, 240, 320}));
  REQUIRE(same(box_window(240, 320, 1.0, "pad"), {0, 0, 240, 320}));   // pad adds its zeros at the resize
  REQUIRE(same(box_window(240, 320, 1.0, "crop"), {0, 40, 240, 240}));  // columns 40..279
  REQUIRE(same(box_window(320, 240, 1.0, "crop"), {40, 0, 240, 240}));  // upright: rows 40..279
  // 95%: 228 x 304 from row 6, column 8; then its center 228 x 228, 38 columns further in
  REQUIRE(same(box_window(240, 320, 0.95, "squash"), {6, 8, 228, 304}));
  REQUIRE(same(box_window(240, 320, 0.95, "crop"), {6, 46, 228, 228}));
  REQUIRE(same(box_window(33, 50, 1.0, "crop"), {0, 8, 33, 33}));  // (50 - 33) / 2 = 8, the odd column right
  REQUIRE(same(box_window(256, 256, 1.0, "crop"), {0, 0, 256, 256}));
}

TEST_CASE(
    "frames: bicubic_aa frames are normalised as upstream's Qwen3-VL processor, (v - 127.5) / 127.5 in "
    "float, for every uint8 value") {
  // A 16 x 16 frame holding each value once per channel, already at S = 16: no resize, no crop.
  const at::Tensor u8 =
      at::arange(256, at::kInt).to(at::kByte).reshape({1, 16, 16, 1}).expand({1, 16, 16, 3}).contiguous();
  const at::Tensor out = resize_frames_bicubic_aa(u8, 0, 1.0, 0, 16).contiguous();  // (1, 3, 16, 16)
  REQUIRE(out.scalar_type() == at::kFloat);
  const float* p = out.data_ptr<float>();
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) {
      INFO("channel " << c << ", value " << v);
      REQUIRE(p[c * 256 + v] == (static_cast<float>(v) - 127.5f) / 127.5f);
    }
}

TEST_CASE(
    "frames: bicubic_aa with a target size resizes to the target (the edge defaulting to it), then to the model "
    "size, as upstream's processor resizes the transform's frames again") {
  const at::Tensor u8 = at::randint(0, 256, {2, 40, 52, 3}, at::kByte);
  const auto aa = [](const at::Tensor& x, int64_t side) {  // (n, 3, h, w) uint8
    return at::_upsample_bicubic2d_aa(x, {side, side}, /*align_corners=*/false);
  };
  const at::Tensor chw = u8.permute({0, 3, 1, 2}).contiguous();
  // edge = target 28, crop 0.9 there (round(25.2) = 25 from (28 - 25) / 2 = 1), target 28, model 32
  const at::Tensor want = (aa(aa(aa(chw, 28).narrow(2, 1, 25).narrow(3, 1, 25).contiguous(), 28), 32).to(at::kFloat) -
                           127.5) / 127.5;
  const at::Tensor got = resize_frames_bicubic_aa(u8, 0, 0.9, 28, 32);
  REQUIRE(got.sizes() == at::IntArrayRef({2, 3, 32, 32}));
  REQUIRE(at::equal(got, want));
  // the target left at 0 is the model size: one resize fewer, other values
  REQUIRE(at::equal(resize_frames_bicubic_aa(u8, 0, 0.9, 0, 32), resize_frames_bicubic_aa(u8, 0, 0.9, 32, 32)));
  REQUIRE_FALSE(at::equal(resize_frames_bicubic_aa(u8, 0, 0.9, 0, 32), got));
}

TEST_CASE(
    "frames: letterboxed, a frame is padded with black to a square, the odd row below, before bicubic_aa's resizes "
    "(upstream's letter_box_transform)") {
  const at::Tensor u8 = at::randint(1, 256, {2, 31, 44, 3}, at::kByte);  // no zero pixel of its own
  // At q = 44 everywhere nothing is resized: the output is the padded frame, normalised.
  const at::Tensor padded = resize_frames_bicubic_aa(u8, 44, 1.0, 44, 44, /*letterbox=*/true);
  REQUIRE(padded.sizes() == at::IntArrayRef({2, 3, 44, 44}));
  const at::Tensor chw = (u8.permute({0, 3, 1, 2}).to(at::kFloat) - 127.5) / 127.5;  // (2, 3, 31, 44)
  REQUIRE(at::equal(padded.narrow(2, 6, 31), chw));                                 // (44 - 31) / 2 = 6 rows on top
  REQUIRE(padded.narrow(2, 0, 6).eq(-1.0).all().item<bool>());                     // black: (0 - 127.5) / 127.5
  REQUIRE(padded.narrow(2, 37, 7).eq(-1.0).all().item<bool>());                    // the other 7 below
  // Then the resizes of the square frame: edge = target 28, crop 0.9 (25 from 1), model 32.
  const auto aa = [](const at::Tensor& x, int64_t side) {
    return at::_upsample_bicubic2d_aa(x, {side, side}, /*align_corners=*/false);
  };
  const at::Tensor sq = at::constant_pad_nd(u8.permute({0, 3, 1, 2}), {0, 0, 6, 7}, 0).contiguous();
  const at::Tensor want =
      (aa(aa(aa(sq, 28).narrow(2, 1, 25).narrow(3, 1, 25).contiguous(), 28), 32).to(at::kFloat) - 127.5) / 127.5;
  const at::Tensor got = resize_frames_bicubic_aa(u8, 0, 0.9, 28, 32, true);
  REQUIRE(at::equal(got, want));
  REQUIRE_FALSE(at::equal(got, resize_frames_bicubic_aa(u8, 0, 0.9, 28, 32, false)));  // squashed instead
  // A square frame is unchanged by it.
  const at::Tensor square = at::randint(0, 256, {1, 40, 40, 3}, at::kByte);
  REQUIRE(at::equal(resize_frames_bicubic_aa(square, 0, 0.9, 28, 32, true),
                    resize_frames_bicubic_aa(square, 0, 0.9, 28, 32, false)));
}

TEST_CASE("frames: a letterboxed model must resize by bicubic_aa, bilinear_aa or cv2_area, naming the key") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = options(false, 1.0);
  o.model_path = "m.pt";
  o.image_letterbox = true;
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("m.pt: config.json image_letterbox=true needs image_resample "
                                                    "bicubic_aa, bilinear_aa or cv2_area (it is box)"));
  o.image_resample = "bicubic_aa";
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
  o.image_resample = "bilinear_aa";
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
  o.image_resample = "cv2_area";
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
}

TEST_CASE("frames: a random crop window needs cv2_area or bilinear_aa with a crop, naming the key") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = options(false, 0.9);
  o.model_path = "m.pt";
  o.image_random_crop = true;
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("m.pt: config.json image_random_crop=true needs image_resample "
                                                    "cv2_area or bilinear_aa and an image_crop_fraction below 1 "
                                                    "(they are box"));
  o.image_resample = "bicubic_aa";
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("(they are bicubic_aa"));
  o.image_resample = "bilinear_aa";
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
  o.image_resample = "cv2_area";
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
  o.image_crop_fraction = 1.0;
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("(they are cv2_area and 1.0"));
}

TEST_CASE("frames: data.image_aspect crop or pad is refused, naming the key, the model and why, for a model that "
          "keeps upstream's preprocessing") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = options(false, 1.0);
  o.model_path = "m.pt";
  o.processor.form = ProcessorForm::gr00t_n17;  // imported from an upstream N1.7 checkpoint
  o.processor.clip = true;
  for (const char* aspect : {"crop", "pad"}) {
    o.image_aspect = aspect;
    INFO("image_aspect " << aspect);
    REQUIRE_THROWS_AS(BatchBuilder(ds, o), loongforge::ConfigError);
    REQUIRE_THROWS_WITH(BatchBuilder(ds, o),
                        Contains(std::string("data.image_aspect=") + aspect + ": the model m.pt was imported from an "
                                 "upstream GR00T N1.7 checkpoint (batch_spec.json processor) and keeps upstream's "
                                 "image preprocessing (image_resample box: a frame that is not square is squashed), "
                                 "as its weights were trained; remove data.image_aspect"));
  }
  o.processor.form = ProcessorForm::gr00t_n16;
  o.image_resample = "bilinear_aa", o.image_letterbox = true;
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("upstream GR00T N1.6 checkpoint (batch_spec.json processor) and "
                                                    "keeps upstream's image preprocessing (image_resample "
                                                    "bilinear_aa, image_letterbox: a frame that is not square is "
                                                    "padded)"));
  o.image_aspect = "squash";  // the default is upstream's own
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
  // no record, but an upstream transform all the same
  o.processor = ProcessorRecord{};
  o.image_resample = "bicubic_aa", o.image_letterbox = false, o.image_aspect = "pad";
  REQUIRE_THROWS_AS(BatchBuilder(ds, o), loongforge::ConfigError);
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("data.image_aspect=pad applies to the box resize of n16 exports, "
                                                    "but the model m.pt resizes by image_resample bicubic_aa"));
  o.image_resample = "box";
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
  o.image_aspect = "stretch";
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("data.image_aspect is 'stretch'; expected squash, crop or pad"));
}

TEST_CASE("frames: with a random crop window each sample is cropped where its drawn position says, the same "
          "draws each time, and only the images change") {
  const Dataset ds = Dataset::open(kData);
  for (const char* resample : {"cv2_area", "bilinear_aa"}) {
    INFO(resample);
    SampleOptions o = options(false, 0.9);
    o.image_resample = resample;
    o.image_target_size = 72;
    o.image_random_crop = true;
    SampleOptions center = o;
    center.image_random_crop = false;
    BatchBuilder drawn(ds, o), centered(ds, center);
    const MicroBatch a = drawn.micro_batch(0, 0), c = centered.micro_batch(0, 0);
    REQUIRE(a.tensors.at("images").sizes() == c.tensors.at("images").sizes());
    REQUIRE_FALSE(at::equal(a.tensors.at("images"), c.tensors.at("images")));
    REQUIRE(at::equal(drawn.micro_batch(0, 0).tensors.at("images"), a.tensors.at("images")));  // the same draws
    REQUIRE(at::equal(a.tensors.at("state"), c.tensors.at("state")));  // only the images move
  }
}

TEST_CASE("frames: bilinear_aa's crop window sits at torchvision RandomCrop's offset floor((T - c + 1) pos), "
          "and its first step and the rest compose to the center-crop transform") {
  at::Tensor u8 = at::randint(0, 256, {2, 50, 61, 3}, at::TensorOptions().dtype(at::kByte));
  const at::Tensor first = bilinear_aa_first(u8, 40);  // (2, 40, 40, 3)
  REQUIRE(first.sizes() == at::IntArrayRef({2, 40, 40, 3}));
  REQUIRE(at::equal(bilinear_aa_rest(first, 0.9, 32), resize_frames_bilinear_aa(u8, 40, 0.9, 32)));
  const auto window = [&](int64_t top, int64_t left) {  // c = round(40 * 0.9) = 36, 5 offsets per side
    const at::Tensor x = first.permute({0, 3, 1, 2}).narrow(2, top, 36).narrow(3, left, 36).contiguous();
    const at::Tensor back = at::_upsample_bilinear2d_aa(x, {40, 40}, false);
    return (at::_upsample_bilinear2d_aa(back, {32, 32}, false).to(at::kFloat) - 127.5) / 127.5;
  };
  REQUIRE(at::equal(bilinear_aa_rest(first, 0.9, 32, 0.0, 0.999), window(0, 4)));
  REQUIRE(at::equal(bilinear_aa_rest(first, 0.9, 32, 0.5, 0.2), window(2, 1)));  // floor(2.5) = 2, floor(1.0) = 1
  REQUIRE(at::equal(bilinear_aa_rest(first, 0.9, 32, 0.79, 0.8), window(3, 4)));  // floor(3.95), floor(4.0)
}

TEST_CASE("frames: per-view crop windows are distinct draws of the sample's generator, the same each time") {
  const auto views = crop_positions(7, 1234, 3);
  REQUIRE(views.size() == 3);
  REQUIRE((views[0].first != views[1].first || views[0].second != views[1].second));
  REQUIRE((views[1].first != views[2].first || views[1].second != views[2].second));
  for (const auto& [y, x] : views) REQUIRE((y >= 0.0 && y < 1.0 && x >= 0.0 && x < 1.0));
  REQUIRE(crop_positions(7, 1234, 3)[2] == views[2]);
  REQUIRE(crop_positions(7, 1235, 3)[0] != views[0]);  // another sample, other windows
}

TEST_CASE("frames: a box-resize model with a target size of its own is refused, naming the key") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = options(false, 1.0);
  o.model_path = "m.pt";
  o.image_target_size = 48;  // box resizes to image_size (64) only
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("m.pt: config.json image_target_size=48 must be 0 or image_size "
                                                    "(64) when image_resample is box"));
  o.image_target_size = 64;
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
}

TEST_CASE("frames: with frames on the device the batch carries cropped uint8 frames, and resized they are the "
          "CPU-resize batch bit for bit") {
  const Dataset ds = Dataset::open(kData);
  for (const double crop : {1.0, 0.9}) {
    BatchBuilder cpu(ds, options(false, crop)), dev(ds, options(true, crop));
    for (int64_t step = 0; step < 3; ++step) {
      const MicroBatch a = cpu.micro_batch(step, 0);
      MicroBatch b = dev.micro_batch(step, 0);
      const at::Tensor& u8 = b.tensors.at("images");
      REQUIRE(u8.scalar_type() == at::kByte);
      REQUIRE(u8.sizes() == at::IntArrayRef({8, 1, cropped_size(ds.cameras()[0].height, crop),
                                             cropped_size(ds.cameras()[0].width, crop), 3}));
      finish_images(b.tensors, 64, b.blank_slots);
      INFO("crop " << crop << ", step " << step);
      REQUIRE(at::equal(a.tensors.at("images"), b.tensors.at("images")));
      REQUIRE(at::equal(a.tensors.at("actions"), b.tensors.at("actions")));
    }
    // The cache holds uint8 frames: at most a quarter of the float bytes at this size (and far less
    // than the float frames at the model's size when the camera is smaller).
    INFO("cache bytes, float " << cpu.stats().cache_bytes << ", uint8 " << dev.stats().cache_bytes);
    REQUIRE(dev.stats().cache_bytes > 0);
  }
}

TEST_CASE("frames: the bytes read counter adds each decoded video's file size once") {
  const Dataset ds = Dataset::open(kData);
  BatchBuilder b(ds, options(false, 1.0));
  int64_t all = 0;
  for (const auto& e : ds.episodes()) all += static_cast<int64_t>(e.videos[0].bytes);
  for (int64_t step = 0; step < 200 && b.stats().videos_decoded < static_cast<int64_t>(ds.episodes().size()); ++step)
    b.micro_batch(step, 0);
  REQUIRE(b.stats().videos_decoded == static_cast<int64_t>(ds.episodes().size()));
  REQUIRE(b.stats().video_bytes_read == all);  // the cache holds them all: none is read twice
}
