// loongforge/data/area_resize.hpp — OpenCV's INTER_AREA resize of uint8 frames,
// reproduced bit for bit (GR00T N1.7 checkpoints saved with use_albumentations:
// image_resample cv2_area, docs/training-semantics.md s3).
//
// Contract:
//  - resize_area(hwc, oh, ow): hwc is a uint8 (h, w, c) CPU tensor (any c >= 1);
//    returns a new contiguous uint8 (oh, ow, c) tensor equal, value for value, to
//    cv2.resize(hwc, (ow, oh), interpolation=cv2.INTER_AREA) of opencv-python-headless
//    5.1.0.95 (the version scripts/requirements-test.txt pins as the oracle):
//      * shrinking on both axes by whole factors: the block mean, (sum + 2) >> 2 for
//        2 x 2 blocks, else sum * (1.f / area) rounded half to even;
//      * shrinking on both axes otherwise: the pixel-area weights, accumulated in float
//        in OpenCV's order, rounded half to even;
//      * growing on either axis: linear interpolation with INTER_AREA's coefficients
//        in 11-bit fixed point and the rounding of OpenCV's vectorised vertical pass.
//    test_area_resize checks it against cv2 on random frames of many shapes.
//  - The same size returns a copy. A size < 1 or a tensor of another kind throws DataError.
#pragma once

#include <cstdint>  // int64_t

#include <ATen/core/Tensor.h>  // at::Tensor

namespace loongforge::data {

at::Tensor resize_area(const at::Tensor& hwc, int64_t oh, int64_t ow);

}  // namespace loongforge::data
