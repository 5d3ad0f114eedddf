// loongforge/data/aspect.hpp — what the model's image resize does with each
// camera's aspect ratio, said in one line at a run's start.
//
// Contract:
//  - Pure functions of the dataset's cameras, the model's image settings
//    (SampleOptions: image_size, image_resample, image_letterbox,
//    image_crop_fraction, image_target_size, image_resize_edge, processor;
//    batch.hpp) and data.image_aspect (SampleOptions::image_aspect). They
//    read no file, log nothing and never throw for a camera the resize refuses:
//    they say so ("refused"); BatchBuilder is what stops the run.
//  - The outcomes follow frames.hpp, mode by mode: a square camera is kept; a
//    non-square one, under box (after its center crop, which keeps the aspect),
//    is squashed to the square input (image_aspect squash), cropped to its
//    center square (crop) or padded with zero rows or columns to a square
//    (pad); bicubic_aa and bilinear_aa squash it; with image_letterbox it is
//    padded to a square first (bicubic_aa, bilinear_aa, cv2_area); cv2_area
//    without image_letterbox refuses it. image_aspect applies to box only, and
//    not to a model with an upstream processor record (an import: BatchBuilder
//    refuses any value but squash there); the line says "upstream GR00T N1.x's
//    preprocessing" for such a model.
//  - The words (kept, squashed, cropped, padded, refused) are those of the
//    converter's per-camera line (scripts/lerobot_convert/aspect.py), which
//    lists every mode.
//
// Example (the trainer, once per run):
//   LF_LOG(logger("data"), info) << camera_aspect_line(dataset, sample_options);
//   // "cameras (image_resample box, 64x64 input): 'observation.images.front' 320x240 (4:3 = 1.333)
//   //  squashed (width x0.750 relative to height), 416 frames in 1 episode(s)"
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string

namespace loongforge::data {

class Dataset;
struct SampleOptions;

enum class AspectOutcome { kept, squashed, cropped, padded, refused };
const char* aspect_outcome_name(AspectOutcome outcome);

struct CameraAspect {
  AspectOutcome outcome = AspectOutcome::kept;
  // squashed: the scale of the longer side relative to the shorter one (height / width for a wide frame, < 1);
  // padded: the zero rows (wide frame) or columns (tall frame) added, and their share of the square side;
  // cropped: the columns (wide frame) or rows (tall frame) cut, and their share of that side
  double squash = 1.0;
  int64_t pad = 0;
  double pad_share = 0.0;
  int64_t cut = 0;
  double cut_share = 0.0;
  std::string text;  // e.g. "squashed (width x0.750 relative to height)"
};

// What the model's resize does with an h x w camera.
CameraAspect camera_aspect(int64_t height, int64_t width, const SampleOptions& opt);

// One line for the run's start: the resize mode (and image_aspect where it is not squash, or the
// upstream preprocessing a processor record keeps), then each camera the batches use (a modality
// name) with its size, aspect, outcome and frame count (the frames of its videos, in how many episodes).
std::string camera_aspect_line(const Dataset& ds, const SampleOptions& opt);

}  // namespace loongforge::data
