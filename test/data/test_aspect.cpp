// Proves what the run's start line says about each camera's aspect
// (aspect.hpp): a 4:3 camera (320x240, and 240x320 upright) is squashed by
// image_resample box (after its center crop, which keeps the aspect up to
// rounding), bicubic_aa and bilinear_aa, padded to a square with image_letterbox,
// refused by cv2_area without it; a square camera is kept by every mode; and the
// line for the bundled dataset (one 256x256 camera) names the mode, the input
// size, the camera and its frame count. With data.image_aspect crop or pad the
// box resize crops the 4:3 camera to its center square or pads it to a square
// (after its center crop), the line names the key; image_aspect is not named
// where it does not apply (another image_resample, or a model with an upstream
// processor record, whose line says it keeps upstream's preprocessing).
#include <string>  // std::string

#include "catch_compat.hpp"
#include "loongforge/data/aspect.hpp"
#include "loongforge/data/batch.hpp"
#include "loongforge/data/dataset.hpp"

using namespace loongforge::data;

namespace {
SampleOptions model(const std::string& resample, bool letterbox = false, double crop = 1.0,
                    const std::string& aspect = "squash") {
  SampleOptions o;
  o.image_size = 64;
  o.image_resample = resample;
  o.image_letterbox = letterbox;
  o.image_crop_fraction = crop;
  o.image_aspect = aspect;
  return o;
}
}  // namespace

TEST_CASE("aspect: a 4:3 camera is squashed by box, bicubic_aa and bilinear_aa") {
  for (const char* mode : {"box", "bicubic_aa", "bilinear_aa"}) {
    const CameraAspect a = camera_aspect(240, 320, model(mode));
    REQUIRE(a.outcome == AspectOutcome::squashed);
    REQUIRE(a.squash == 0.75);
    REQUIRE(a.text == "squashed (width x0.750 relative to height)");
  }
  const CameraAspect upright = camera_aspect(320, 240, model("bilinear_aa"));
  REQUIRE(upright.text == "squashed (height x0.750 relative to width)");
  // box crops 95% of each side first: 228 x 304 rows and columns, still 3:4
  REQUIRE(camera_aspect(240, 320, model("box", false, 0.95)).squash == 228.0 / 304.0);
  REQUIRE(std::string(aspect_outcome_name(AspectOutcome::squashed)) == "squashed");
}

TEST_CASE("aspect: with image_letterbox a 4:3 camera is padded to a square, and cv2_area refuses it without") {
  for (const char* mode : {"bicubic_aa", "bilinear_aa", "cv2_area"}) {
    const CameraAspect a = camera_aspect(240, 320, model(mode, true));
    REQUIRE(a.outcome == AspectOutcome::padded);
    REQUIRE(a.pad == 80);
    REQUIRE(a.pad_share == 0.25);
    REQUIRE(a.text == "padded to 320x320 (80 zero rows, 25.0% of the square)");
  }
  REQUIRE(camera_aspect(320, 240, model("cv2_area", true)).text ==
          "padded to 320x320 (80 zero columns, 25.0% of the square)");
  const CameraAspect refused = camera_aspect(240, 320, model("cv2_area"));
  REQUIRE(refused.outcome == AspectOutcome::refused);
  REQUIRE_THAT(refused.text, lf_catch::Contains("refused (image_resample cv2_area keeps the aspect"));
}

TEST_CASE("aspect: a square camera is kept by every mode") {
  for (const char* mode : {"box", "bicubic_aa", "bilinear_aa", "cv2_area"})
    for (const bool letterbox : {false, true}) {
      const CameraAspect a = camera_aspect(256, 256, model(mode, letterbox));
      REQUIRE(a.outcome == AspectOutcome::kept);
      REQUIRE(a.text == "kept (square)");
    }
}

TEST_CASE("aspect: the start line names the mode, the input size, each used camera and its frames") {
  const Dataset ds = Dataset::open(LOONGFORGE_TEST_DATASET);
  REQUIRE(camera_aspect_line(ds, model("box")) ==
          "cameras (image_resample box, 64x64 input): 'observation.images.ego_view' 256x256 kept (square), 2096 "
          "frames in 5 episode(s)");
  REQUIRE(camera_aspect_line(ds, model("cv2_area", true)) ==
          "cameras (image_resample cv2_area, image_letterbox, 64x64 input): 'observation.images.ego_view' 256x256 "
          "kept (square), 2096 frames in 5 episode(s)");
}

TEST_CASE("aspect: with data.image_aspect crop the box resize crops a 4:3 camera to its center square") {
  const CameraAspect a = camera_aspect(240, 320, model("box", false, 1.0, "crop"));
  REQUIRE(a.outcome == AspectOutcome::cropped);
  REQUIRE(a.cut == 80);
  REQUIRE(a.cut_share == 0.25);
  REQUIRE(a.text == "cropped to 240x240 (80 columns cut, 25.0% of the width)");
  REQUIRE(camera_aspect(320, 240, model("box", false, 1.0, "crop")).text ==
          "cropped to 240x240 (80 rows cut, 25.0% of the height)");
  // after the center crop of 95%: 228 x 304, then its 228 x 228 center
  REQUIRE(camera_aspect(240, 320, model("box", false, 0.95, "crop")).text ==
          "cropped to 228x228 (76 columns cut, 25.0% of the width)");
  REQUIRE(std::string(aspect_outcome_name(AspectOutcome::cropped)) == "cropped");
}

TEST_CASE("aspect: with data.image_aspect pad the box resize pads a 4:3 camera to a square") {
  const CameraAspect a = camera_aspect(240, 320, model("box", false, 1.0, "pad"));
  REQUIRE(a.outcome == AspectOutcome::padded);
  REQUIRE(a.pad == 80);
  REQUIRE(a.pad_share == 0.25);
  REQUIRE(a.text == "padded to 320x320 (80 zero rows, 25.0% of the square)");
  REQUIRE(camera_aspect(320, 240, model("box", false, 1.0, "pad")).text ==
          "padded to 320x320 (80 zero columns, 25.0% of the square)");
  REQUIRE(camera_aspect(240, 320, model("box", false, 0.95, "pad")).text ==
          "padded to 304x304 (76 zero rows, 25.0% of the square)");
  // a frame the center crop makes square stays as it is
  for (const char* aspect : {"squash", "crop", "pad"})
    REQUIRE(camera_aspect(241, 240, model("box", false, 0.5, aspect)).text == "kept (square after its center crop)");
  REQUIRE(camera_aspect(256, 256, model("box", false, 1.0, "pad")).outcome == AspectOutcome::kept);
}

TEST_CASE("aspect: image_aspect is named where it applies, and a model with an upstream processor record keeps "
          "upstream's preprocessing and its line says so") {
  const Dataset ds = Dataset::open(LOONGFORGE_TEST_DATASET);
  const std::string cam = "'observation.images.ego_view' 256x256 kept (square), 2096 frames in 5 episode(s)";
  REQUIRE(camera_aspect_line(ds, model("box", false, 1.0, "pad")) ==
          "cameras (image_resample box, image_aspect pad, 64x64 input): " + cam);
  // not for another resize (BatchBuilder refuses the pair), where the camera keeps its outcome
  REQUIRE(camera_aspect_line(ds, model("bicubic_aa", true, 1.0, "crop")) ==
          "cameras (image_resample bicubic_aa, image_letterbox, 64x64 input): " + cam);
  REQUIRE(camera_aspect(240, 320, model("bilinear_aa", false, 1.0, "crop")).outcome == AspectOutcome::squashed);
  SampleOptions imported = model("bicubic_aa", true, 1.0, "squash");
  imported.processor.form = ProcessorForm::gr00t_n17;
  REQUIRE(camera_aspect_line(ds, imported) ==
          "cameras (image_resample bicubic_aa, image_letterbox, 64x64 input; upstream GR00T N1.7's preprocessing): " +
              cam);
  SampleOptions n16_box = model("box", false, 1.0, "crop");
  n16_box.processor.form = ProcessorForm::gr00t_n16;
  REQUIRE(camera_aspect(240, 320, n16_box).text == "squashed (width x0.750 relative to height)");
  REQUIRE(camera_aspect_line(ds, n16_box) ==
          "cameras (image_resample box, 64x64 input; upstream GR00T N1.6's preprocessing): " + cam);
}
