"""Writes test_area_resize's oracle: random uint8 frames and what OpenCV's INTER_AREA resize
(cv2.resize of opencv-python-headless, pinned in scripts/requirements-test.txt) makes of them.

    python make_cv2_area_cases.py OUT

OUT: b"LFAREA01", then the number of cases (uint32), then per case h, w, oh, ow, c (uint32 each),
the h*w*c source bytes and the oh*ow*c resized bytes (HWC order, little-endian)."""
import struct
import sys
from pathlib import Path

import cv2
import numpy as np

SHAPES = [  # (h, w) -> (oh, ow): each INTER_AREA path of upstream's transform and its edges
    ((256, 256), (230, 230)),   # shrink by a fraction (area weights)
    ((230, 230), (256, 256)),   # grow: the crop of lerobot's default geometry, back to 256
    ((243, 243), (256, 256)),   # grow: a 0.95 crop, back
    ((512, 512), (256, 256)),   # shrink by 2 x 2 (the vector kernel's rounding)
    ((768, 768), (256, 256)),   # shrink by 3 x 3 (float mean)
    ((100, 50), (50, 50)),      # shrink by 2 on one axis only
    ((480, 640), (256, 341)),   # a camera's shorter side to 256
    ((513, 513), (256, 256)),   # almost 2 x 2: area weights
    ((58, 38), (100, 79)),      # grow where floor(d * scale) sits on an exact multiple
    ((64, 64), (200, 60)),      # grow on one axis, shrink on the other
    ((46, 90), (58, 10)),       # the same the other way round
    ((1, 1), (3, 3)), ((3, 3), (1, 1)), ((2, 7), (5, 3)), ((37, 53), (64, 91)),
]


def main(out: Path) -> None:
    rng = np.random.default_rng(20261203)
    cases = list(SHAPES)
    for _ in range(60):  # random shapes, a quarter halved and a quarter thirded
        h, w = (int(v) for v in rng.integers(1, 120, 2))
        oh, ow = (int(v) for v in rng.integers(1, 120, 2))
        k = len(cases) % 4
        if k == 0:
            oh, ow = max(1, h // 2), max(1, w // 2)
        elif k == 1:
            oh, ow = max(1, h // 3), max(1, w // 3)
        cases.append(((h, w), (oh, ow)))
    blob = bytearray(b"LFAREA01" + struct.pack("<I", len(cases)))
    for i, ((h, w), (oh, ow)) in enumerate(cases):
        src = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if i % 3 == 2:  # few distinct values: many exact halves to round
            src = (src // 64 * 64 + 1).astype(np.uint8)
        dst = cv2.resize(src, (ow, oh), interpolation=cv2.INTER_AREA)
        blob += struct.pack("<5I", h, w, oh, ow, 3) + src.tobytes() + dst.reshape(oh, ow, 3).tobytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(bytes(blob))
    print(f"{out}: {len(cases)} cases, cv2 {cv2.__version__}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
