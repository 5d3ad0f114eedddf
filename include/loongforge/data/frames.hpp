// loongforge/data/frames.hpp — decoded frames to the model's image input, on
// the CPU or on the device (issue #12 level 2).
//
// Contract:
//  - resize_frames(u8, S, pad_square): u8 is uint8 (..., h, w, 3), HWC frames with any
//    leading dimensions; returns float32 (..., 3, S, S) on u8's device: each
//    frame box-resized over ATen's adaptive-average windows and normalised as
//    ((x / 255) - 0.5) / 0.5 (docs/training-semantics.md s3). With pad_square
//    (data.image_aspect pad) a frame that is not square is first padded with
//    zeros (black) to q x q, q = max(h, w), as image_letterbox places them:
//    (q - w) / 2 columns on the left, (q - h) / 2 rows on top, the rest right
//    and below. The values are ATen's constant_pad_nd, adaptive_avg_pool2d and
//    that normalisation, bit for bit: on the CPU computed with integer window
//    sums (Note [Box resize on the CPU] in frames.cpp; ATen's own path where a
//    window is too large for an exact sum), on CUDA by cuda/data's kernel on
//    the current stream, the pad read as zeros in place
//    (cuda/data/frame_math.hpp; test_frames, test_frame_convert_gpu).
//  - model_images(u8, S, blank, pad_square): resize_frames of a micro-batch's uint8
//    images (B, V, h, w, 3), then the samples listed in `blank` (skipped for a
//    bad video) set to zeros, as the CPU path leaves them.
//  - resize_frames_bicubic_aa(u8, E, f, T, S, letterbox) (config.json image_resample
//    "bicubic_aa", GR00T N1.7's default transform): u8 uint8 (n, h, w, 3), CPU;
//    with letterbox (config.json image_letterbox, upstream's letter_box_transform)
//    each frame first padded with zeros to q x q, q = max(h, w), (q - w) / 2
//    columns left and (q - h) / 2 rows on top, the rest right and below; then
//    each frame resized to E x E (E = 0: T; T = 0: S) by ATen's antialiased bicubic
//    interpolation on uint8 (skipped when it is E x E), center-cropped to c = round(E * f) rows
//    and columns (half to even, as Python rounds) from (E - c) / 2 when
//    0 < f < 1, resized to T x T the same way (skipped when it is: upstream's
//    transform ends here), then to S x S (skipped when T = S: upstream's
//    processor resizing to its smart_resize size, config.json image_target_size), then
//    normalised as upstream's Qwen3-VL processor does, (x - 127.5) / 127.5 in
//    float32 (the same values as above up to one float rounding) -> float32
//    (n, 3, S, S). Bit for bit the reference trainer's, and upstream's
//    pixel_values (test_image_resample.py, test_n17_pixel_values.py).
//  - resize_frames_cv2_area(u8, T, f, S, letterbox) (config.json image_resample "cv2_area":
//    GR00T N1.7 checkpoints saved with use_albumentations, lerobot 0.6.1's
//    _transform_n1_7_image_for_vlm_albumentations at eval): u8 uint8 (n, h, w, 3), CPU; letterboxed
//    as above when asked; then each frame's shorter side resized to T (T = 0: S) by OpenCV's
//    INTER_AREA (resize_area, area_resize.hpp), the longer one to round(side * T / shorter),
//    half to even (skipped when the shorter side is T already); when 0 < f < 1 center-cropped to
//    int(side * f) rows and columns (at least 1) from (side - crop) / 2, and the shorter side
//    resized to T again the same way; then resized to S x S by ATen's antialiased bicubic on
//    uint8 when T != S (upstream's processor, as above) and normalised as above -> float32
//    (n, 3, S, S). A frame that is not square after the first resize (no letterbox, a
//    non-square camera) throws DataError: upstream keeps its aspect ratio, which the model's
//    square input cannot take. Bit for bit the reference trainer's (e2e_parity) and upstream's
//    (test_image_resample.py).
//  - resize_frames_bilinear_aa(u8, T, f, S, letterbox) (config.json image_resample
//    "bilinear_aa": Isaac-GR00T N1.6's torchvision transform at eval, then Eagle's processor):
//    u8 uint8 (n, h, w, 3), CPU; letterboxed as above when asked; each frame resized to T x T
//    (T = 0: S; the aspect ratio not kept) by ATen's antialiased bilinear interpolation on uint8
//    (skipped when it is T x T); when 0 < f < 1 center-cropped to c = round(T * f) rows and
//    columns from round((T - c) / 2) (half to even, as torchvision's CenterCrop) and resized to
//    T x T again the same way; then to S x S the same way (skipped when T = S, as for Eagle,
//    whose processor does not resize); normalised as above -> float32 (n, 3, S, S). Bit for bit
//    the reference trainer's (e2e_parity) and torchvision's (test_image_resample.py).
//  - cv2_area_size(h, w, T): the (rows, columns) that resize's shorter-side step makes of an h x w
//    frame (unchanged when the shorter side is T).
//  - cv2_area_first(u8, T, letterbox) -> uint8 (n, T, T, 3): that transform up to its crop (the
//    frame cache's form when the crop window is drawn per sample); cv2_area_rest(u8, f, S, pos_y,
//    pos_x): the rest, from there. pos < 0 (the default) takes the center crop; pos in [0, 1]
//    puts the window's top (left) at round((T - crop) * pos), half to even: upstream's train-time
//    random crop (model image_random_crop; the position drawn per sample, crop_positions()).
//    resize_frames_cv2_area(u8, T, f, S, letterbox) = cv2_area_rest(cv2_area_first(...), f, S).
//  - bilinear_aa_first(u8, T, letterbox) -> uint8 (n, T, T, 3): resize_frames_bilinear_aa up to
//    its crop (the frame cache's form when the crop window is drawn per view); bilinear_aa_rest(u8,
//    f, S, pos_y, pos_x): the rest, from there; pos < 0 takes torchvision's CenterCrop, pos in
//    [0, 1) puts the window's top (left) at min(floor((T - c + 1) * pos), T - c): torchvision's
//    RandomCrop offsets, each of the T - c + 1 equally likely (Isaac-GR00T N1.6 trains with it,
//    a window per frame). resize_frames_bilinear_aa = bilinear_aa_rest(bilinear_aa_first(...)).
//  - crop_positions(seed, p, count): the crop windows of the sample at stream position p under
//    image_random_crop (docs/training-semantics.md s4): a CPU generator seeded with
//    ((seed * 1000003 + p) mod 2^63) XOR kCropSalt draws 2 * count float32 uniforms, (pos_y,
//    pos_x) per window: one window shared by the sample's views (cv2_area, as lerobot's
//    albumentations transform shares it) or one per view (bilinear_aa, as torchvision's
//    RandomCrop draws per frame).
//  - A CUDA tensor in a build without LoongForge's CUDA kernels throws DataError.
#pragma once

#include <cstdint>  // int64_t, uint64_t
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

namespace loongforge::data {

at::Tensor resize_frames(const at::Tensor& u8, int64_t S, bool pad_square = false);
at::Tensor model_images(const at::Tensor& u8, int64_t S, const std::vector<int64_t>& blank, bool pad_square = false);
at::Tensor resize_frames_bicubic_aa(const at::Tensor& u8, int64_t E, double f, int64_t T, int64_t S,
                                    bool letterbox = false);
at::Tensor resize_frames_bilinear_aa(const at::Tensor& u8, int64_t T, double f, int64_t S, bool letterbox = false);
at::Tensor resize_frames_cv2_area(const at::Tensor& u8, int64_t T, double f, int64_t S, bool letterbox = false);
std::pair<int64_t, int64_t> cv2_area_size(int64_t h, int64_t w, int64_t T);
at::Tensor cv2_area_first(const at::Tensor& u8, int64_t T, bool letterbox = false);
at::Tensor cv2_area_rest(const at::Tensor& u8, double f, int64_t S, double pos_y = -1.0, double pos_x = -1.0);
at::Tensor bilinear_aa_first(const at::Tensor& u8, int64_t T, bool letterbox = false);
at::Tensor bilinear_aa_rest(const at::Tensor& u8, double f, int64_t S, double pos_y = -1.0, double pos_x = -1.0);
constexpr uint64_t kCropSalt = 0x43524F505F504F53ull;  // "CROP_POS"
std::vector<std::pair<double, double>> crop_positions(uint64_t seed, uint64_t p, int64_t count);

}  // namespace loongforge::data
