# What this file proves: scripts/convert_lerobot.py reads LeRobot datasets as
# LeRobot itself writes them, not only as this project's tests write them:
#   - the real v3.0 dataset of test/data/fixtures/apple_storage_v3 (written by
#     LeRobot-based tools of pollen-robotics, vendored by Rerun; committed, see
#     test/data/fixtures/README.md): its task text is the unnamed pandas index
#     of meta/tasks.parquet (`__index_level_0__`, Note [LeRobot tasks.parquet]),
#     its stats have no quantiles; with its video absent the conversion stops
#     at the error naming that video, and with a 320x240 stand-in video (made
#     here with ffmpeg, one keyframe per episode, as Rerun's later copy of the
#     fixture has) every episode converts with the source's values;
#   - v3.0 datasets written here by LeRobot 0.6.1's own writer
#     (LeRobotDataset.create / add_frame / save_episode / finalize, run from the
#     wheel: test/lerobot_oracle.py write_lerobot_dataset): one camera with
#     every episode in one shared video and data file, and two cameras (one
#     4:3) whose episodes LeRobot spreads over chunked files (chunk-000/file-000,
#     file-001, chunk-001/file-000) with several episodes per file; and a v2.1
#     dataset written by LeRobot 0.3.3's writer (a file per episode,
#     episodes_stats.jsonl but no stats.json, no modality.json). Each converts
#     with LeRobot's task texts, lengths and stats, and every stored value equals
#     what LeRobot's writer was given. (Frames and values against LeRobot's own
#     reader: test_lerobot_reader_oracle.py.)
#   - a 4:3 camera (320x240, made with ffmpeg from a bundled video) gets the
#     aspect line at conversion, saying what each resize mode does with it
#     (squashed, cropped or padded under data.image_aspect for box; what
#     upstream's transforms do; lerobot_convert/aspect.py); a square one is
#     "kept by every resize mode".
#
# Run: cd /work/main && PYTHONPATH=scripts python -m pytest test/data/test_lerobot_datasets.py -q

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
APPLE = REPO / "test/data/fixtures/apple_storage_v3"
PICK = Path(os.environ.get("LOONGFORGE_PICKNPLACE",
                           REPO.parent / "shared" / "datasets" / "robot_sim.PickNPlace")).resolve()
APPLE_CAM = "observation.image"
APPLE_TASK = "place the apple in the plate"

for p in (REPO / "scripts", REPO / "test"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
import convert_lerobot  # noqa: E402
import lerobot_oracle  # noqa: E402
from lerobot_convert import source  # noqa: E402

# Two datasets written by LeRobot's own writer (lerobot_oracle.write_lerobot_dataset).
ONE_CAMERA = {"fps": 15, "robot_type": "synthetic", "state_dim": 7, "action_dim": 6, "seed": 1,
              "cameras": {"observation.images.top": [64, 64]},
              "episodes": [{"length": 14, "task": "pick the cube"}, {"length": 11, "task": "place the cube"},
                           {"length": 17, "task": "pick the cube"}]}
V21 = {"version": "v2.1", "fps": 10, "robot_type": "synthetic", "state_dim": 6, "action_dim": 5, "seed": 3,
       "cameras": {"observation.images.front": [48, 64], "observation.images.wrist": [32, 32]},
       "episodes": [{"length": 12, "task": "open"}, {"length": 9, "task": "close"}, {"length": 15, "task": "open"}]}
TWO_CAMERAS = {"fps": 10, "robot_type": "synthetic", "state_dim": 6, "action_dim": 5, "seed": 2, "chunks_size": 2,
               "cameras": {"observation.images.front": [48, 64], "observation.images.wrist": [32, 32]},
               "episodes": [{"length": 12, "task": "open", "new_data_file": False, "new_video_file": False},
                            {"length": 9, "task": "close", "new_data_file": False, "new_video_file": False},
                            {"length": 15, "task": "open", "new_data_file": True, "new_video_file": True},
                            {"length": 8, "task": "wipe", "new_data_file": True, "new_video_file": True},
                            {"length": 10, "task": "close", "new_data_file": False, "new_video_file": False}]}


def run_convert(src, dst, *extra):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = convert_lerobot.main([str(src), str(dst), "--quiet", "--jobs", "2", *extra])
    return rc, out.getvalue(), err.getvalue()


def load(d):
    return json.loads((d / "loongforge_dataset.json").read_text())


def writable_copy(src, dst):
    for f in src.rglob("*"):
        if f.is_file():
            t = dst / f.relative_to(src)
            t.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, t)
    return dst


def shard_column(dst, doc, episode, name):
    """One stored column of one episode, read from the shard per docs/shard-format.md s3 (record header 64
    bytes, then 32-byte array entries: column id, pad, offset, rows, bytes)."""
    e = next(x for x in doc["episodes"] if x["episode_index"] == episode)
    col = next(c for c in doc["columns"] if c["name"] == name)
    blob = (dst / e["shard"]).read_bytes()[e["record_offset"]:e["record_offset"] + e["record_bytes"]]
    _, _, offset, rows, nbytes = struct.unpack_from("<IIQQQ", blob, 64 + 32 * col["column_id"])
    values = np.frombuffer(blob[offset:offset + nbytes], dtype={"float32": "<f4", "float64": "<f8", "int64": "<i8",
                                                                "uint8": "u1"}[col["dtype"]])
    return values.reshape(rows, col["width"]) if col["width"] > 1 else values


# ---------------------------------------------------------------------------
# The shared real v3.0 dataset (committed copy)


def test_the_shared_v3_dataset_has_its_task_text_as_an_unnamed_pandas_index():
    table = pq.read_table(APPLE / "meta/tasks.parquet")
    assert table.column_names == ["task_index", "__index_level_0__"]
    meta = source.load_meta(APPLE)
    assert meta.tasks == {0: APPLE_TASK}
    assert [e["length"] for e in meta.episodes] == [299, 300, 300]
    assert "q01" not in meta.stats["action"]  # written before LeRobot's quantile statistics


def test_the_shared_v3_dataset_converts_up_to_the_error_naming_its_missing_video(tmp_path):
    rc, _, err = run_convert(APPLE, tmp_path / "out")
    video = APPLE / f"videos/{APPLE_CAM}/chunk-000/file-000.mp4"
    assert rc == 1
    assert (f"error: episode 0 ({video}): video file is missing for feature '{APPLE_CAM}', which the default "
            "modality uses as a camera (the dataset has no meta/modality.json) (3 of 3 episodes lack it)") in err
    assert f"fix: copy the videos of '{APPLE_CAM}'" in err
    assert not (tmp_path / "out").exists()


def test_with_a_stand_in_video_every_episode_of_the_shared_v3_dataset_converts(tmp_path):
    src = writable_copy(APPLE, tmp_path / "apple")
    # 899 frames at 30 fps, 320x240 (the size Rerun's later copy re-encoded it to), an IDR frame at each
    # episode start (rows 0, 299, 599): LeRobot encodes each episode on its own before appending it.
    video = src / f"videos/{APPLE_CAM}/chunk-000/file-000.mp4"
    video.parent.mkdir(parents=True)
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-f", "lavfi", "-i", "testsrc2=size=320x240:rate=30",
                    "-frames:v", "899", "-c:v", "libx264", "-preset", "ultrafast", "-bf", "0", "-pix_fmt", "yuv420p",
                    "-force_key_frames", "expr:eq(n,0)+eq(n,299)+eq(n,599)", str(video)], check=True)
    info = json.loads((src / "meta/info.json").read_text())
    info["features"][APPLE_CAM]["shape"] = [3, 240, 320]  # channel-first, as the source writes it
    (src / "meta/info.json").write_text(json.dumps(info, indent=4))
    rc, out, err = run_convert(src, tmp_path / "out")
    assert rc == 0, err
    doc = load(tmp_path / "out")
    assert [(e["episode_index"], e["length"], e["videos"][0]["frame_count"]) for e in doc["episodes"]] == \
        [(0, 299, 299), (1, 300, 300), (2, 300, 300)]
    assert [t["text"] for t in doc["tasks"]] == [APPLE_TASK]
    assert doc["cameras"][0]["height"] == 240 and doc["cameras"][0]["width"] == 320
    data = pq.read_table(APPLE / "data/chunk-000/file-000.parquet").to_pydict()
    for ep, first in ((0, 0), (1, 299), (2, 599)):
        n = doc["episodes"][ep]["length"]
        np.testing.assert_array_equal(shard_column(tmp_path / "out", doc, ep, "observation.state"),
                                      np.array(data["observation.state"][first:first + n], dtype=np.float32))
        np.testing.assert_array_equal(shard_column(tmp_path / "out", doc, ep, "task_index"), [0] * n)
    assert (f"camera '{APPLE_CAM}': 320x240 (width x height), 899 frames in 3 episode(s), aspect 4:3 = 1.333, "
            "not square") in out


# ---------------------------------------------------------------------------
# Datasets written by LeRobot 0.6.1's own writer


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """{name: (LeRobot's v3.0 dataset, its conversion, the converter's output)}."""
    work = tmp_path_factory.mktemp("lerobot_written")
    out = {}
    for name, spec in (("one_camera", ONE_CAMERA), ("two_cameras", TWO_CAMERAS), ("v21", V21)):
        root = lerobot_oracle.write_lerobot_dataset(work / name, spec)
        rc, stdout, err = run_convert(root, work / f"{name}.lf")
        assert rc == 0, err
        out[name] = (root, work / f"{name}.lf", stdout)
    return out


def test_lerobot_wrote_v21_files_and_v30_shared_and_chunked_files_with_several_episodes_each(written):
    one = written["one_camera"][0]
    assert [p.relative_to(one).as_posix() for p in sorted(one.glob("**/*.mp4"))] == \
        ["videos/observation.images.top/chunk-000/file-000.mp4"]
    assert [p.relative_to(one).as_posix() for p in sorted(one.glob("data/**/*.parquet"))] == \
        ["data/chunk-000/file-000.parquet"]
    v21 = written["v21"][0]  # LeRobot 0.3.3's v2.1: a file per episode, per-episode stats, no stats.json
    assert json.loads((v21 / "meta/info.json").read_text())["codebase_version"] == "v2.1"
    assert sorted(p.relative_to(v21).as_posix() for p in v21.rglob("*") if p.is_file()) == [
        *(f"data/chunk-000/episode_{e:06d}.parquet" for e in range(3)),
        "meta/episodes.jsonl", "meta/episodes_stats.jsonl", "meta/info.json", "meta/tasks.jsonl",
        *(f"videos/chunk-000/{k}/episode_{e:06d}.mp4" for k in V21["cameras"] for e in range(3))]
    two = written["two_cameras"][0]
    for key in TWO_CAMERAS["cameras"]:
        assert [p.relative_to(two / "videos" / key).as_posix() for p in sorted((two / "videos" / key).glob("*/*.mp4"))] \
            == ["chunk-000/file-000.mp4", "chunk-000/file-001.mp4", "chunk-001/file-000.mp4"]
    ep = pq.read_table(next((two / "meta/episodes").glob("*/*.parquet"))).to_pydict()
    assert ep["data/file_index"] == [0, 0, 1, 0, 0] and ep["data/chunk_index"] == [0, 0, 0, 1, 1]
    assert ep["videos/observation.images.wrist/file_index"] == [0, 0, 1, 0, 0]
    assert ep["videos/observation.images.wrist/from_timestamp"][1] == pytest.approx(12 / 10)
    assert json.loads((two / "meta/info.json").read_text())["codebase_version"] == "v3.0"


@pytest.mark.parametrize("name,spec", [("one_camera", ONE_CAMERA), ("two_cameras", TWO_CAMERAS), ("v21", V21)])
def test_each_lerobot_written_dataset_converts_with_its_tasks_lengths_stats_and_values(written, name, spec):
    root, dst, _ = written[name]
    doc = load(dst)
    texts = list(dict.fromkeys(e["task"] for e in spec["episodes"]))  # LeRobot numbers tasks as first seen
    assert [(t["task_index"], t["text"]) for t in doc["tasks"]] == list(enumerate(texts))
    assert [(e["episode_index"], e["length"]) for e in doc["episodes"]] == \
        [(i, e["length"]) for i, e in enumerate(spec["episodes"])]
    assert [c["key"] for c in doc["cameras"]] == list(spec["cameras"])
    assert all(v["codec"] == "av1" for e in doc["episodes"] for v in e["videos"])  # LeRobot's default encoder
    if name != "v21":
        stats = json.loads((root / "meta/stats.json").read_text())
        assert doc["stats"]["action"]["q99"] == stats["action"]["q99"]
        assert doc["stats"]["observation.state"]["mean"] == stats["observation.state"]["mean"]
    else:  # LeRobot's v2.1 keeps per-episode stats only (equal to its reader's aggregate: the oracle test)
        assert not (root / "meta/stats.json").exists() and (root / "meta/episodes_stats.jsonl").is_file()
        assert doc["source"]["stats"] == "meta/episodes_stats.jsonl, aggregated as LeRobot 0.3 (v2.1) does"
        assert set(doc["stats"]["action"]) == {"mean", "std", "min", "max"}
    data = pq.read_table(sorted(root.glob("data/*/*.parquet"))[0]).to_pydict()
    first = spec["episodes"][0]["length"]
    np.testing.assert_array_equal(shard_column(dst, doc, 0, "action"), np.array(data["action"][:first], np.float32))
    np.testing.assert_array_equal(shard_column(dst, doc, 0, "timestamp"), np.array(data["timestamp"][:first]))
    for ep, e in enumerate(spec["episodes"]):
        want = lerobot_oracle.synthetic_values(spec["seed"], ep, e["length"], spec["action_dim"], 2)
        np.testing.assert_array_equal(shard_column(dst, doc, ep, "action"), want)


# ---------------------------------------------------------------------------
# Cameras that are not square: the aspect line at conversion


def test_a_4_by_3_camera_gets_the_aspect_line_for_every_resize_mode(tmp_path):
    if not PICK.is_dir():
        raise RuntimeError(f"the bundled dataset {PICK} is missing (set LOONGFORGE_PICKNPLACE)")
    src = writable_copy(PICK, tmp_path / "pick")
    cam = "observation.images.ego_view"
    video = src / f"videos/chunk-000/{cam}/episode_000000.mp4"
    squeezed = tmp_path / "320x240.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(video), "-vf", "scale=320:240",
                    "-fps_mode", "passthrough", "-c:v", "libx264", "-preset", "ultrafast", "-bf", "0",
                    "-pix_fmt", "yuv420p", str(squeezed)], check=True)
    shutil.move(squeezed, video)
    info = json.loads((src / "meta/info.json").read_text())
    info["features"][cam]["shape"] = [240, 320, 3]
    (src / "meta/info.json").write_text(json.dumps(info, indent=2))
    rc, out, err = run_convert(src, tmp_path / "out", "--episodes", "0")
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith(f"camera '{cam}'"))
    assert line == (f"camera '{cam}': 320x240 (width x height), 416 frames in 1 episode(s), aspect 4:3 = 1.333, "
                    "not square: with image_resample box (n16 exports) it is squashed to the model's square input "
                    "(width x0.750 relative to height) under data.image_aspect squash (the default), cropped to "
                    "240x240 (80 columns cut, 25.0% of the width) under crop, padded to 320x320 (80 zero rows, "
                    "25.0% of the square) under pad; upstream's transforms (imports of GR00T checkpoints, "
                    "data.image_aspect squash only) squash it too (bicubic_aa, bilinear_aa), pad it to 320x320 "
                    "first with image_letterbox (bicubic_aa, bilinear_aa, cv2_area), or refuse it (cv2_area "
                    "without image_letterbox: the run stops)")


def test_lerobots_4_by_3_and_square_cameras_get_their_aspect_lines(written):
    out = written["two_cameras"][2].splitlines()
    assert ("camera 'observation.images.front': 64x48 (width x height), 54 frames in 5 episode(s), aspect 4:3 = "
            "1.333, not square: with image_resample box (n16 exports) it is squashed to the model's square input "
            "(width x0.750 relative to height) under data.image_aspect squash (the default), cropped to 48x48 "
            "(16 columns cut, 25.0% of the width) under crop, padded to 64x64 (16 zero rows, 25.0% of the square) "
            "under pad; upstream's transforms (imports of GR00T checkpoints, data.image_aspect squash only) squash "
            "it too (bicubic_aa, bilinear_aa), pad it to 64x64 first with image_letterbox (bicubic_aa, bilinear_aa, "
            "cv2_area), or refuse it (cv2_area without image_letterbox: the run stops)") in out
    assert ("camera 'observation.images.wrist': 32x32 (width x height), 54 frames in 5 episode(s), square: kept by "
            "every resize mode") in out
