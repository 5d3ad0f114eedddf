"""`loongforge validate-dataset PATH` through the real binaries (the verb runs
loongforge-validate-dataset: data::validate_dataset, include/loongforge/data/check.hpp)
on copies of the converted bundled dataset: the intact dataset passes (exit 0,
VALID; with --full every one of its 2096 frames is decoded), and each of these
damages is found, named with its file and exit 1: a truncated video, a video
with bytes flipped in the middle (same size), two videos swapped, a missing
shard, a row count that disagrees with the frames the index records. A usage
error exits 2, --json gives the same report as JSON, --progress-s 0 prints a
progress line after every episode.

Environment (set by ctest): LOONGFORGE_CLI, LOONGFORGE_TEST_DATASET.
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = os.environ.get("LOONGFORGE_CLI", str(REPO / "build/cli/loongforge"))
DATASET = Path(os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf")))


def validate(path, *extra):
    r = subprocess.run([CLI, "validate-dataset", str(path), *extra], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture
def copy(tmp_path):
    """A writable copy of the converted bundled dataset, and its index."""
    if not (DATASET / "loongforge_dataset.json").is_file():
        raise RuntimeError(f"{DATASET} holds no converted dataset (ctest's convert_test_dataset makes it)")
    dst = tmp_path / "ds"
    shutil.copytree(DATASET, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst, json.loads((dst / "loongforge_dataset.json").read_text())


def video(dst, doc, ep):
    return dst / doc["episodes"][ep]["videos"][0]["file"]


def problems(out):
    return [ln.strip()[len("PROBLEM: "):] for ln in out.splitlines() if ln.strip().startswith("PROBLEM: ")]


def test_the_intact_dataset_is_valid(copy):
    dst, doc = copy
    rc, out, err = validate(dst)
    assert rc == 0, out + err
    assert out.splitlines()[0] == f"dataset {dst}"
    assert "  5 episodes, 2096 rows, 1 shard(s) 0.9 MB, 5 videos 4.6 MB (1 camera(s))" in out
    assert "; every video's size and SHA-256 match; " in out
    assert out.splitlines()[-1] == "VALID"
    assert problems(out) == []


def test_full_decodes_every_frame_and_progress_lines_follow_each_video(copy):
    dst, _ = copy
    rc, out, err = validate(dst, "--full", "--progress-s", "0")
    assert rc == 0, out + err
    assert "every frame decoded (2096)" in out
    lines = [ln for ln in err.splitlines() if ln.startswith("validate-dataset: ")]
    assert len(lines) == 5  # after each episode
    assert lines[-1].startswith("validate-dataset: 5/5 episodes, 5/5 videos (4.6 MB of 4.6 MB), ")


def test_a_truncated_video_is_found(copy):
    dst, doc = copy
    v = video(dst, doc, 2)
    data = v.read_bytes()
    v.write_bytes(data[:-1000])
    rc, out, _ = validate(dst)
    assert rc == 1
    assert problems(out) == [f"episode 2 camera 'observation.images.ego_view': {v}: the file has {len(data) - 1000} "
                             f"bytes but the dataset index records {len(data)} (replaced or truncated); re-run "
                             "scripts/convert_lerobot.py"]
    assert out.splitlines()[-1] == "INVALID: do not train on this dataset as it is"


def test_a_video_with_bytes_flipped_in_the_middle_is_found(copy):
    dst, doc = copy
    v = video(dst, doc, 1)
    data = bytearray(v.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 16] = bytes(b ^ 0xFF for b in data[mid:mid + 16])
    v.write_bytes(bytes(data))
    rc, out, _ = validate(dst)
    assert rc == 1
    (p,) = problems(out)
    assert p.startswith(f"episode 1 camera 'observation.images.ego_view': {v}: SHA-256 ")
    assert "differs from the dataset index's" in p and "(the file was modified or swapped after conversion)" in p


def test_two_swapped_videos_are_each_found(copy):
    dst, doc = copy
    a, b = video(dst, doc, 0), video(dst, doc, 3)
    tmp = a.with_suffix(".tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    rc, out, _ = validate(dst)
    assert rc == 1
    found = problems(out)
    assert len(found) == 2
    assert found[0].startswith(f"episode 0 camera 'observation.images.ego_view': {a}: the file has ")
    assert found[1].startswith(f"episode 3 camera 'observation.images.ego_view': {b}: the file has ")


def test_a_missing_shard_is_found(copy):
    dst, _ = copy
    (dst / "shard-00000.lfshard").unlink()
    rc, out, _ = validate(dst)
    assert rc == 1
    assert problems(out) == [f"cannot open shard '{dst}/shard-00000.lfshard': No such file or directory; re-run "
                             "scripts/convert_lerobot.py"]


def test_a_row_count_that_disagrees_with_the_frames_is_found(copy):
    dst, doc = copy
    doc["episodes"][3]["videos"][0]["frame_count"] = 411  # the episode has 412 rows, its video 412 frames
    (dst / "loongforge_dataset.json").write_text(json.dumps(doc, indent=1))
    rc, out, _ = validate(dst)
    assert rc == 1
    found = problems(out)
    assert found[0] == (f"{dst}/shard-00000.lfshard: episode 3 camera 'observation.images.ego_view': 412 rows but "
                        f"loongforge_dataset.json records 411 frames for its video {doc['episodes'][3]['videos'][0]['file']}"
                        " (one frame per row); re-run scripts/convert_lerobot.py")
    assert "video_pts:observation.images.ego_view has 412 rows but loongforge_dataset.json records 411 frames" in found[1]


def test_json_report_and_usage_error(copy):
    dst, _ = copy
    rc, out, _ = validate(dst, "--json")
    assert rc == 0
    j = json.loads(out)
    assert (j["valid"], j["episodes"], j["rows"], j["videos"], j["problems"]) == (True, 5, 2096, 5, [])
    rc, _, err = validate("")
    assert rc == 1  # an empty path: a dataset that cannot be opened
    r = subprocess.run([CLI, "validate-dataset"], capture_output=True, text=True)
    assert r.returncode == 2 and "dir is required" in r.stderr
