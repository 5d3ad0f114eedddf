"""What the model will do with each camera's aspect ratio, for every resize mode.

The model takes square images (image_size x image_size). How a camera's
frames get there is the model's choice (its config.json image_resample and
image_letterbox, fixed at export or import; the trainer reads them) and, for
n16 exports, the training config's data.image_aspect, so the converter cannot
know which applies; it says what each mode does
(docs/training-semantics.md s3; src/data/frames.cpp is the code):

    box (n16 exports)        center crop of image_crop_fraction on both sides
                             (the aspect stays), then data.image_aspect:
                             squash (the default): a box resize of the whole
                             frame, so a non-square frame is squashed; crop:
                             its center square is kept (cropped); pad: zero
                             rows or columns make it square (padded)
    bicubic_aa, bilinear_aa  upstream's transforms (imports; data.image_aspect
                             squash only): resized to a square first, so
                             squashed; with image_letterbox, padded with zero
                             rows/columns to a square first instead
    cv2_area                 shorter side resized, aspect kept: a non-square
                             frame cannot enter the square input and the run
                             stops, unless image_letterbox pads it first

data::camera_aspect_line (include/loongforge/data/aspect.hpp) says which one
applies for a model's settings at a run's start, with the same words: kept /
squashed / cropped / padded / refused.
"""

from math import gcd


def ratio_text(width, height):
    """'4:3 = 1.333' for 320 x 240; just '1.778' when the reduced ratio has large terms."""
    g = gcd(width, height) or 1
    w, h = width // g, height // g
    value = f"{width / height:.3f}"
    return f"{w}:{h} = {value}" if max(w, h) <= 32 else value


def camera_line(key, width, height, frames, episodes):
    """One line about camera `key` (width x height), whose videos hold `frames` frames in `episodes` episodes."""
    head = f"camera '{key}': {width}x{height} (width x height), {frames} frames in {episodes} episode(s)"
    if width == height:
        return head + ", square: kept by every resize mode"
    wide = width > height
    q, m = max(width, height), min(width, height)
    pad = f"{q - m} zero {'rows' if wide else 'columns'}, {100.0 * (q - m) / q:.1f}% of the square"
    cut = (f"{q - m} {'columns' if wide else 'rows'} cut, {100.0 * (q - m) / q:.1f}% of the "
           f"{'width' if wide else 'height'}")
    squash = (f"width x{height / width:.3f} relative to height" if wide
              else f"height x{width / height:.3f} relative to width")
    return (f"{head}, aspect {ratio_text(width, height)}, not square: with image_resample box (n16 exports) it is "
            f"squashed to the model's square input ({squash}) under data.image_aspect squash (the default), "
            f"cropped to {m}x{m} ({cut}) under crop, padded to {q}x{q} ({pad}) under pad; upstream's transforms "
            f"(imports of GR00T checkpoints, data.image_aspect squash only) squash it too (bicubic_aa, "
            f"bilinear_aa), pad it to {q}x{q} first with image_letterbox (bicubic_aa, bilinear_aa, cv2_area), or "
            f"refuse it (cv2_area without image_letterbox: the run stops)")
