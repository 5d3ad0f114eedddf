# What this file proves: scripts/convert_lerobot.py reads LeRobot v3.0 datasets
# (episodes as rows of shared parquet files and time ranges of shared videos)
# and gives the trainer the same samples as from the v2.x original. The v3.0
# copy of the bundled robot_sim.PickNPlace is made here by LeRobot 0.6.1's own
# v2.1 -> v3.0 conversion (test/lerobot_oracle.py make_v30_copy), not by our
# code; converting it and the v2.0 original gives byte-identical shards (every
# state, action, timestamp, index and video_pts value), the same tasks, token
# ids, columns, cameras and episode table, and per-episode videos whose decoded
# frames are identical (ffmpeg framemd5). What differs, and why:
#   - the video files: LeRobot's concatenation stores each episode's first
#     keyframe with its parameter sets in-band (37 bytes more per episode here),
#     so bytes and SHA-256 differ while every decoded frame is the same;
#   - stats: LeRobot recomputes them (per-episode stats, aggregated); min/max
#     equal the GR00T stats.json within its float32 rounding, mean/std within
#     1e-4 relative, q01/q99 are LeRobot's averages of per-episode quantiles;
#   - features: the v3.0 copy lacks the file-less egoview feature (LeRobot's
#     tool needs files for every video feature).
# Malformed v3.0 datasets (a missing meta file, an episode range outside the
# video or not starting at a keyframe, rows missing from a data file) stop the
# conversion with exit status 1 and a message naming the file and the fix.
#
# Run: cd /work/main && PYTHONPATH=scripts python -m pytest test/data/test_convert_lerobot_v3.py -q

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(os.environ.get("LOONGFORGE_PICKNPLACE",
                              REPO.parent / "shared" / "datasets" / "robot_sim.PickNPlace")).resolve()
CAM = "observation.images.ego_view"
ROWS = {0: 416, 1: 470, 2: 470, 3: 412, 4: 328}

for p in (REPO / "scripts", REPO / "test"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
import convert_lerobot  # noqa: E402
import lerobot_oracle  # noqa: E402


def run_convert(src, dst, *extra):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = convert_lerobot.main([str(src), str(dst), "--quiet", "--jobs", "2", *extra])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(v2 original converted, v3.0 copy made by LeRobot, v3.0 copy converted)."""
    if not FIXTURE.is_dir():
        raise RuntimeError(f"the bundled dataset {FIXTURE} is missing (set LOONGFORGE_PICKNPLACE)")
    work = tmp_path_factory.mktemp("v3")
    v3 = lerobot_oracle.make_v30_copy(FIXTURE, work / "lerobot")
    shutil.copyfile(FIXTURE / "meta/modality.json", v3 / "meta/modality.json")  # GR00T flavour
    a, b = work / "from_v2", work / "from_v3"
    rc, _, err = run_convert(FIXTURE, a)
    assert rc == 0, err
    rc, _, err = run_convert(v3, b)
    assert rc == 0, err
    return a, v3, b


def load(d):
    return json.loads((d / "loongforge_dataset.json").read_text())


def v3_copy(v3, tmp_path):
    dst = tmp_path / "v3"
    shutil.copytree(v3, dst)
    return dst


def edit_episodes(root, fn):
    path = next((root / "meta/episodes").glob("*/*.parquet"))
    table = pq.read_table(path)
    cols = {n: table.column(n).to_pylist() for n in table.column_names}
    fn(cols)
    pq.write_table(pa.table({n: pa.array(v, type=table.schema.field(n).type) for n, v in cols.items()}), path)
    return path


# ---------------------------------------------------------------------------
# The v3.0 copy converts to what the v2.0 original converts to


def test_lerobot_made_a_real_v3_dataset_with_shared_files(pair):
    _, v3, _ = pair
    assert json.loads((v3 / "meta/info.json").read_text())["codebase_version"] == "v3.0"
    assert [p.relative_to(v3).as_posix() for p in sorted(v3.glob("data/*/*.parquet"))] == \
        ["data/chunk-000/file-000.parquet"]
    assert [p.relative_to(v3).as_posix() for p in sorted(v3.glob("videos/**/*.mp4"))] == \
        [f"videos/{CAM}/chunk-000/file-000.mp4"]
    ep = pq.read_table(next(v3.glob("meta/episodes/*/*.parquet"))).to_pydict()
    assert ep["length"] == list(ROWS.values())
    assert ep[f"videos/{CAM}/from_timestamp"][1] == pytest.approx(416 / 20)


def test_shards_are_byte_identical_to_those_of_the_v2_original(pair):
    a, _, b = pair
    da, db = load(a), load(b)
    assert [s["file"] for s in da["shards"]] == [s["file"] for s in db["shards"]] == ["shard-00000.lfshard"]
    for s in da["shards"]:
        assert (a / s["file"]).read_bytes() == (b / s["file"]).read_bytes()


def test_metadata_equals_the_v2_original_except_source_stats_and_video_files(pair):
    a, _, b = pair
    da, db = load(a), load(b)
    for key in ("fps", "embodiment_tag", "alignment", "columns", "modality", "cameras", "tokenizer", "tasks",
                "float32_conversion", "shards"):
        assert da[key] == db[key], key
    assert db["source"]["codebase_version"] == "v3.0" and da["source"]["codebase_version"] == "v2.0"
    for ea, eb in zip(da["episodes"], db["episodes"], strict=True):
        for va, vb in zip(ea.pop("videos"), eb.pop("videos"), strict=True):
            for k in ("bytes", "sha256"):
                va.pop(k), vb.pop(k)
            assert va == vb  # same file name, codec, time base, frame count, first pts, offset, residual
        assert ea == eb
    assert da["totals"]["frames"] == db["totals"]["frames"] == sum(ROWS.values())


def test_every_cut_video_decodes_to_the_frames_of_the_v2_episode_video(pair):
    a, _, b = pair
    for e in load(b)["episodes"]:
        (v,) = e["videos"]
        digests = []
        for root in (a, b):
            r = subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(root / v["file"]), "-map", "0:v:0",
                                "-f", "framemd5", "-"], capture_output=True, text=True, check=True)
            digests.append([ln.split(",")[-1].strip() for ln in r.stdout.splitlines() if not ln.startswith("#")])
        assert len(digests[0]) == ROWS[e["episode_index"]] == v["frame_count"]
        assert digests[0] == digests[1], f"episode {e['episode_index']}: decoded frames differ"


def test_stats_are_lerobots_recomputation_close_to_the_original(pair):
    a, v3, b = pair
    sa, sb = load(a)["stats"], load(b)["stats"]
    assert sb == {k: {s: v for s, v in st.items() if s in ("mean", "std", "min", "max", "q01", "q99")}
                  for k, st in json.loads((v3 / "meta/stats.json").read_text()).items()}
    for key in ("observation.state", "action"):
        for s, rel in (("min", 2.0 ** -23), ("max", 2.0 ** -23), ("mean", 1e-4), ("std", 1e-4)):
            x, y = np.array(sa[key][s]), np.array(sb[key][s])
            assert np.all(np.abs(x - y) <= rel * np.maximum(np.abs(x), 1e-3)), (key, s)


def test_without_modality_json_a_default_modality_is_used_with_a_warning(pair, tmp_path):
    _, v3, _ = pair
    src = v3_copy(v3, tmp_path)
    (src / "meta/modality.json").unlink()
    rc, _, err = run_convert(src, tmp_path / "out")
    assert rc == 0, err
    assert f"warning: {src / 'meta/modality.json'} is missing; using the default" in err
    d = load(tmp_path / "out")
    assert d["modality"]["state"] == {"state": {"start": 0, "end": 44, "original_key": "observation.state"}}
    assert d["modality"]["video"] == {"ego_view": {"original_key": CAM}}
    roles = {c["name"]: c["role"] for c in d["columns"]}
    assert roles["observation.state"] == "state" and roles["action"] == "action"
    assert d["cameras"][0]["modality_name"] == "ego_view"


# ---------------------------------------------------------------------------
# Malformed v3.0 datasets


@pytest.mark.parametrize("rel", ["meta/tasks.parquet", "meta/stats.json", "meta/episodes"])
def test_a_missing_v3_meta_file_is_an_error_naming_it(pair, tmp_path, rel):
    _, v3, _ = pair
    src = v3_copy(v3, tmp_path)
    target = src / rel
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    rc, _, err = run_convert(src, tmp_path / "out")
    assert rc == 1
    assert f"error: {target}: is missing; a LeRobot v3.0 dataset needs meta/info.json, meta/tasks.parquet" in err
    assert "fix: copy the complete dataset (meta/ included)" in err
    assert not (tmp_path / "out").exists()


def test_an_episode_range_past_the_end_of_the_video_is_an_error(pair, tmp_path):
    _, v3, _ = pair
    src = v3_copy(v3, tmp_path)
    edit_episodes(src, lambda c: c[f"videos/{CAM}/to_timestamp"].__setitem__(4, c[f"videos/{CAM}/to_timestamp"][4] + 5))
    rc, _, err = run_convert(src, tmp_path / "out")
    video = src / f"videos/{CAM}/chunk-000/file-000.mp4"
    assert rc == 1
    assert (f"error: episode 4 ({video}): the episode's time range [88.400000, 109.800000) s lies outside video "
            f"{video} (2096 frames, the last at 104.750000 s)") in err
    assert "fix: regenerate meta/episodes with LeRobot (videos/<key>/from_timestamp and to_timestamp)" in err


def test_an_episode_range_that_does_not_start_at_a_keyframe_is_an_error(pair, tmp_path):
    _, v3, _ = pair
    src = v3_copy(v3, tmp_path)
    edit_episodes(src, lambda c: c[f"videos/{CAM}/from_timestamp"].__setitem__(1, 20.85))
    rc, _, err = run_convert(src, tmp_path / "out")
    video = src / f"videos/{CAM}/chunk-000/file-000.mp4"
    assert rc == 1
    assert (f"error: episode 1 ({video}): the episode's time range [20.850000, 44.300000) s in video {video} "
            "does not start at a keyframe") in err
    assert "fix: re-encode the video with a keyframe at every episode start" in err


def test_an_episode_whose_rows_are_missing_from_the_data_file_is_an_error(pair, tmp_path):
    _, v3, _ = pair
    src = v3_copy(v3, tmp_path)
    edit_episodes(src, lambda c: c["dataset_to_index"].__setitem__(0, 420) or c["length"].__setitem__(0, 420))
    rc, _, err = run_convert(src, tmp_path / "out")
    data = src / "data/chunk-000/file-000.parquet"
    assert rc == 1
    assert (f"error: episode 0 ({data}): data file has 416 rows of episode 0 but meta/episodes says 420 "
            "(dataset_from_index 0 .. dataset_to_index 420)") in err
    assert "fix: regenerate meta/episodes with LeRobot, or restore the data file" in err
