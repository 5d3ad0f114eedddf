"""What the model will do with each camera's aspect ratio, for every resize mode.

The model takes square images (image_size x image_size). How a camera's
frames get there is the model's choice (its config.json image_resample and
image_letterbox, fixed at export or import; the trainer reads them), so the
converter cannot know which applies; it says what each mode does
(docs/training-semantics.md s3; src/data/frames.cpp is the code):

    box (n16 exports)        center crop of image_crop_fraction on both sides
                             (the aspect stays), then a box resize to the
                             square: a non-square frame is squashed
    bicubic_aa, bilinear_aa  resized to a square first: squashed; with
                             image_letterbox, padded with zero rows/columns
                             to a square first instead
    cv2_area                 shorter side resized, aspect kept: a non-square
                             frame cannot enter the square input and the run
                             stops, unless image_letterbox pads it first

data::camera_aspect_line (include/loongforge/data/aspect.hpp) says which one
applies for a model's settings, with the same words: kept / squashed / padded
/ refused.
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
    q = max(width, height)
    pad, side = (q - height, "rows") if width > height else (q - width, "columns")
    squash = (f"width x{height / width:.3f} relative to height" if width > height
              else f"height x{width / height:.3f} relative to width")
    return (f"{head}, aspect {ratio_text(width, height)}, not square: image_resample box, bicubic_aa and "
            f"bilinear_aa squash it to the model's square input ({squash}); with image_letterbox "
            f"(bicubic_aa, bilinear_aa, cv2_area) it is padded to {q}x{q} first ({pad} zero {side}, "
            f"{100.0 * pad / q:.1f}% of the square); cv2_area without image_letterbox refuses it (the run stops)")
