# What this file proves: for datasets written by LeRobot's own writers (0.6.1's
# v3.0: one camera with every episode in one shared video; two cameras, one 4:3,
# with episodes spread over chunked data and video files; 0.3.3's v2.1: a file per
# episode; the specs of test_lerobot_datasets.py), a sample converted by
# scripts/convert_lerobot.py and read by the C++ data room
# (test/data/dump_sample.cpp: Dataset + the trainer's checked decode) equals what
# LeRobot's own reader returns for the same index (LeRobot 0.6.1's
# LeRobotDataset(...)[index], run from the wheel: lerobot_oracle.read_lerobot_items;
# a v2.1 dataset through LeRobot's own v2.1 -> v3.0 conversion, which is how
# LeRobot reads one today), and its normalization stats equal LeRobot's:
#   - every value: observation.state and action (float32, bit for bit), timestamp,
#     frame_index, episode_index, index, task_index, and the task text;
#   - every camera frame within PSNR >= 40 dB. The decoders differ: LeRobot's
#     torchcodec converts YUV to RGB with libswscale, the data room with the integer
#     BT.601 formula of docs/training-semantics.md s3 (chroma not interpolated); the
#     bitstream decode itself (libdav1d) is the same. The frame a row names is the
#     right one: the neighbouring frames of these moving test images are far below
#     the bound against it (checked on each sample too).
# Samples: the first and last rows of episodes, rows inside them, across file and
# chunk boundaries.
#
# Environment: LOONGFORGE_DUMP_SAMPLE (set by ctest; default build/test/data/dump_sample).
# Run: cd /work/main && PYTHONPATH=scripts python -m pytest test/data/test_lerobot_reader_oracle.py -q

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
DUMP = Path(os.environ.get("LOONGFORGE_DUMP_SAMPLE", REPO / "build/test/data/dump_sample"))
PSNR_BOUND_DB = 40.0

for p in (REPO / "scripts", REPO / "test", Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
import lerobot_oracle  # noqa: E402
from test_lerobot_datasets import ONE_CAMERA, TWO_CAMERAS, V21, run_convert  # noqa: E402

SPECS = {"one_camera": ONE_CAMERA, "two_cameras": TWO_CAMERAS, "v21": V21}
SAMPLES = {"one_camera": [0, 1, 13, 14, 24, 25, 33, 41],
           "two_cameras": [0, 11, 12, 20, 21, 30, 35, 36, 43, 44, 53],
           "v21": [0, 11, 12, 20, 21, 35]}


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@pytest.fixture(scope="module", params=list(SPECS))
def pair(request, tmp_path_factory):
    """(spec, LeRobot's items, ours, LeRobot's items by index (neighbours too), our dataset, LeRobot's v3.0)."""
    if not DUMP.is_file():
        raise RuntimeError(f"{DUMP} is missing: build the tests (ninja dump_sample) or set LOONGFORGE_DUMP_SAMPLE")
    name = request.param
    spec = SPECS[name]
    work = tmp_path_factory.mktemp(name)
    root = lerobot_oracle.write_lerobot_dataset(work / name, spec)
    rc, _, err = run_convert(root, work / "lf")
    assert rc == 0, err
    # LeRobot 0.6.1 reads v3.0; a v2.1 dataset it reads through its own v2.1 -> v3.0 conversion
    lerobot_root = root if spec.get("version", "v3.0") == "v3.0" else \
        lerobot_oracle.lerobot_v30_copy(root, work / f"{name}_v30")
    total = sum(e["length"] for e in spec["episodes"])
    indices = SAMPLES[name]
    neighbours = sorted({j for i in indices for j in (i - 1, i + 1) if 0 <= j < total} - set(indices))
    theirs = lerobot_oracle.read_lerobot_items(lerobot_root, indices + neighbours)
    (work / "dump").mkdir()
    subprocess.run([str(DUMP), str(work / "lf"), str(work / "dump"), *map(str, indices)], check=True)
    ours = json.loads((work / "dump/samples.json").read_text())
    for s in ours:
        for key, f in s["frames"].items():
            raw = (work / "dump" / f["file"]).read_bytes()
            f["rgb"] = np.frombuffer(raw, np.uint8).reshape(f["height"], f["width"], 3)
    by_index = {int(t["index"]): t for t in theirs}
    return spec, [by_index[i] for i in indices], ours, by_index, work / "lf", lerobot_root


def test_every_value_and_task_equals_lerobots_reader(pair):
    spec, theirs, ours, _, _, _ = pair
    for t, o in zip(theirs, ours, strict=True):
        assert int(t["index"]) == o["index"]
        assert int(t["episode_index"]) == o["episode_index"]
        assert int(t["frame_index"]) == o["row"] == o["columns"]["frame_index"][0]
        for key in ("observation.state", "action"):
            np.testing.assert_array_equal(np.asarray(o["columns"][key], np.float32), t[key], err_msg=key)
        assert np.float32(o["columns"]["timestamp"][0]) == t["timestamp"]
        assert o["columns"]["task_index"][0] == int(t["task_index"])
        assert o["columns"]["episode_index"][0] == int(t["episode_index"])
        assert o["columns"]["index"][0] == int(t["index"])
        assert o["task"] == t["task"] == spec["episodes"][o["episode_index"]]["task"]


def test_every_camera_frame_is_lerobots_within_the_psnr_bound_and_not_a_neighbour(pair):
    spec, theirs, ours, by_index, _, _ = pair
    worst = float("inf")
    for t, o in zip(theirs, ours, strict=True):
        assert list(o["frames"]) == list(spec["cameras"])
        for key, f in o["frames"].items():
            lerobot = np.transpose(t[key], (1, 2, 0))  # LeRobot's (3, h, w) -> (h, w, 3)
            assert lerobot.shape == f["rgb"].shape == (*spec["cameras"][key], 3)
            p = psnr(f["rgb"], lerobot)
            worst = min(worst, p)
            assert p >= PSNR_BOUND_DB, f"sample {o['index']} {key}: PSNR {p:.2f} dB"
            for j in (o["index"] - 1, o["index"] + 1):
                if j in by_index and int(by_index[j]["episode_index"]) == o["episode_index"]:
                    other = np.transpose(by_index[j][key], (1, 2, 0))
                    assert psnr(f["rgb"], other) < PSNR_BOUND_DB - 10, f"sample {o['index']} matches frame {j}"
    print(f"worst PSNR against LeRobot's reader: {worst:.2f} dB")


def test_the_normalization_stats_are_lerobots(pair):
    """v3.0: meta/stats.json as LeRobot wrote it; v2.1: the aggregate of its episodes_stats.jsonl, equal to
    the stats.json LeRobot's own conversion computes from it."""
    _, _, _, _, ours, lerobot_root = pair
    mine = json.loads((ours / "loongforge_dataset.json").read_text())["stats"]
    theirs = json.loads((lerobot_root / "meta/stats.json").read_text())
    for key in ("observation.state", "action"):
        for s in ("min", "max", "mean", "std"):
            assert mine[key][s] == theirs[key][s], (key, s)
