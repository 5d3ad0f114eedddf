// loongforge/data/aspect.hpp — what the model's image resize does with each
// camera's aspect ratio, said in one line at a run's start.
//
// Contract:
//  - Pure functions of the dataset's cameras and the model's image settings
//    (SampleOptions: image_size, image_resample, image_letterbox,
//    image_crop_fraction, image_target_size, image_resize_edge; batch.hpp). They
//    read no file, log nothing and never throw for a camera the resize refuses:
//    they say so ("refused"); BatchBuilder is what stops the run.
//  - The outcomes follow frames.hpp, mode by mode: a square camera is kept; a
//    non-square one is squashed to the square input by box (after its center
//    crop, which keeps the aspect), bicubic_aa and bilinear_aa; padded with zero
//    rows or columns to a square first when image_letterbox is on (bicubic_aa,
//    bilinear_aa, cv2_area); refused by cv2_area without image_letterbox.
//    None of today's modes crops a frame to a square (the proposed
//    n16-family aspect key would add that).
//  - The words (kept, squashed, padded, refused) are those of the converter's
//    per-camera line (scripts/lerobot_convert/aspect.py), which lists every mode.
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

enum class AspectOutcome { kept, squashed, padded, refused };
const char* aspect_outcome_name(AspectOutcome outcome);

struct CameraAspect {
  AspectOutcome outcome = AspectOutcome::kept;
  // squashed: the scale of the longer side relative to the shorter one (height / width for a wide frame, < 1);
  // padded: the zero rows (wide frame) or columns (tall frame) added, and their share of the square side
  double squash = 1.0;
  int64_t pad = 0;
  double pad_share = 0.0;
  std::string text;  // e.g. "squashed (width x0.750 relative to height)"
};

// What the model's resize does with an h x w camera.
CameraAspect camera_aspect(int64_t height, int64_t width, const SampleOptions& opt);

// One line for the run's start: the resize mode, then each camera the batches use (a modality name)
// with its size, aspect, outcome and frame count (the frames of its videos, in how many episodes).
std::string camera_aspect_line(const Dataset& ds, const SampleOptions& opt);

}  // namespace loongforge::data
