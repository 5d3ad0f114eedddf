#!/usr/bin/env python3
"""Digests of what scripts/bench_data.py's two FFmpeg users decode, so that two
machines (two FFmpeg builds) can be compared bit for bit without moving frames:

  - per video: sha256 of the reference's decode, lf_dataset.decode_ffmpeg (its
    `ffmpeg ... -f rawvideo -pix_fmt yuv420p -` through the ffmpeg on PATH);
  - per video: sha256 of torchcodec's frames and pts for every 25th frame, each
    fetched by its own get_frames_at (seek_mode="approximate"), as
    bench_data.py's torchcodec rows fetch them.

    python3 scripts/dev/gpu/decode_digest.py DATASET... > digests.txt

One line per video and decoder: "<sha256>  <dataset folder>/<video file> <decoder>".
scripts/dev/gpu/prepare_decode_carry.sh writes the CPU machine's (system FFmpeg),
scripts/dev/gpu/issue12_decode.sh compares the GPU machine's (.gpu-carry/ffmpeg-bench) with them.
"""
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reference"))
from lf_dataset import decode_ffmpeg  # noqa: E402

FRAME_STRIDE = 25


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    from torchcodec.decoders import VideoDecoder
    for ds in map(Path, sys.argv[1:]):
        meta = json.loads((ds / "loongforge_dataset.json").read_text())
        for e in meta["episodes"]:
            for v in e["videos"]:
                path, name = ds / v["file"], f"{ds.name}/{v['file']}"
                print(hashlib.sha256(decode_ffmpeg(path, v["frame_count"]).frames.tobytes()).hexdigest(),
                      f" {name} ffmpeg-yuv420p", flush=True)
                dec, h = VideoDecoder(str(path), seek_mode="approximate"), hashlib.sha256()
                for i in range(0, v["frame_count"], FRAME_STRIDE):
                    got = dec.get_frames_at(indices=[i])
                    h.update(got.data.numpy().tobytes())
                    h.update(got.pts_seconds.numpy().tobytes())
                print(h.hexdigest(), f" {name} torchcodec-rgb24-every-{FRAME_STRIDE}", flush=True)


if __name__ == "__main__":
    main()
