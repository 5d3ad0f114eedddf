# What this file proves: scripts/convert_lerobot.py turns the standing LeRobot
# fixture robot_sim.PickNPlace into LoongForge shards that an independent
# reader, written here from docs/shard-format.md alone (struct +
# numpy.frombuffer, no import of the writer), reads back with every numeric
# value equal to the Parquet source (state/action within float32 rounding,
# relative error <= 2^-24; everything else exact), every checksum valid, every
# array 64-byte aligned, and a flipped byte detected; videos are copied byte
# for byte. Each doctored copy of the fixture (one thing broken per test) stops
# the conversion with exit status 1 and a message naming the episode, the file
# and the fix -- except a constant timestamp offset, which is corrected and
# reported, and an unused video feature without files, which only warns.
#
# Run: cd /work/main && PYTHONPATH=scripts python -m pytest test/data -q

import contextlib
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
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

if str(REPO / "scripts") not in sys.path:
    sys.path.insert(0, str(REPO / "scripts"))
import convert_lerobot  # noqa: E402

pytestmark = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"fixture {FIXTURE} not present")


# ---------------------------------------------------------------------------
# Independent reader, per docs/shard-format.md section 3


class ShardCorrupt(Exception):
    pass


def crc32_bitwise(data):
    """The doc's C reference CRC, in Python (slow; used on small inputs)."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0xEDB88320 & -(c & 1))
    return c ^ 0xFFFFFFFF


def crc32(data):
    return zlib.crc32(data) & 0xFFFFFFFF


DTYPES = {1: "<f4", 2: "<f8", 3: "<i8", 4: "u1", 5: "<i4"}


class Shard:
    def __init__(self, path, data=None):
        self.path = path
        b = self.buf = data if data is not None else Path(path).read_bytes()
        if len(b) < 128:
            raise ShardCorrupt("shorter than the header")
        u32 = lambda o: struct.unpack_from("<I", b, o)[0]  # noqa: E731
        u64 = lambda o: struct.unpack_from("<Q", b, o)[0]  # noqa: E731
        if b[0:8] != b"LFSHARD\0":
            raise ShardCorrupt("bad magic")
        if crc32(b[0:124]) != u32(124):
            raise ShardCorrupt("header crc32 mismatch")
        self.version, self.header_bytes, self.alignment = u32(8), u32(12), u32(16)
        self.shard_id, self.column_count, self.episode_count = u32(20), u32(24), u32(28)
        self.file_bytes, self.ct_off, self.ct_bytes = u64(32), u64(40), u64(48)
        self.idx_off, self.idx_bytes, self.total_rows = u64(56), u64(64), u64(72)
        ct_crc, idx_crc = u32(80), u32(84)
        if self.file_bytes != len(b):
            raise ShardCorrupt("file_bytes differs from the file size")
        ct = b[self.ct_off:self.ct_off + self.ct_bytes]
        if crc32(ct) != ct_crc:
            raise ShardCorrupt("column table crc32 mismatch")
        idx = b[self.idx_off:self.idx_off + self.idx_bytes]
        if crc32(idx) != idx_crc:
            raise ShardCorrupt("index crc32 mismatch")
        self.reserved_zero = b[88:124] == bytes(36)
        self.columns = []
        for i in range(self.column_count):
            o = self.ct_off + 96 * i
            name = b[o:o + 64].split(b"\0", 1)[0].decode("utf-8")
            dtype, elem, width, row_kind, cam, src, flags = struct.unpack_from("<7I", b, o + 64)
            self.columns.append(dict(name=name, dtype=dtype, elem_bytes=elem, width=width, row_kind=row_kind,
                                     camera_id=cam, source_dtype=src, flags=flags))
        self.index = []
        for i in range(self.episode_count):
            ep, off, nbytes, rows, crc = struct.unpack_from("<qQQII", b, self.idx_off + 32 * i)
            self.index.append(dict(episode_index=ep, record_offset=off, record_bytes=nbytes, row_count=rows,
                                   record_crc32=crc))

    def check_record(self, e):
        rec = self.buf[e["record_offset"]:e["record_offset"] + e["record_bytes"]]
        if crc32(rec) != e["record_crc32"]:
            raise ShardCorrupt(f"episode {e['episode_index']}: record crc32 mismatch")
        return rec

    def episode(self, episode_index):
        e = next(x for x in self.index if x["episode_index"] == episode_index)
        rec = self.check_record(e)
        magic = rec[0:8]
        ep, rows, nbytes = struct.unpack_from("<qQQ", rec, 8)
        (array_count,) = struct.unpack_from("<I", rec, 32)
        assert magic == b"LFEPISOD" and ep == episode_index and rows == e["row_count"]
        assert nbytes == e["record_bytes"] and array_count == self.column_count
        out, layout = {}, []
        for i, col in enumerate(self.columns):
            cid, _res, off, arows, abytes = struct.unpack_from("<IIQQQ", rec, 64 + 32 * i)
            assert cid == i
            assert abytes == arows * col["width"] * col["elem_bytes"]
            arr = np.frombuffer(rec, dtype=DTYPES[col["dtype"]], count=arows * col["width"], offset=off)
            out[col["name"]] = arr.reshape(arows, col["width"]) if col["width"] > 1 else arr
            layout.append((off, abytes))
        return out, layout


# ---------------------------------------------------------------------------
# Helpers


def run_convert(src, dst, *extra):
    """main() in-process; returns (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = convert_lerobot.main([str(src), str(dst), *extra])
    return rc, out.getvalue(), err.getvalue()


def copy_fixture(dst):
    """A writable copy (the fixture's files and folders are read-only)."""
    for f in FIXTURE.rglob("*"):
        if f.is_file():
            t = dst / f.relative_to(FIXTURE)
            t.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, t)
    return dst


def parquet(root, ep):
    return root / f"data/chunk-000/episode_{ep:06d}.parquet"


def video(root, ep, key=CAM):
    return root / f"videos/chunk-000/{key}/episode_{ep:06d}.mp4"


def rewrite_parquet(root, ep, change):
    """Load an episode table, let change(dict of columns) edit it, write it back."""
    t = pq.read_table(parquet(root, ep))
    cols = {name: t.column(name).to_pylist() for name in t.column_names}
    change(cols)
    types = {f.name: f.type for f in t.schema}
    pq.write_table(pa.table({k: pa.array(v, type=types.get(k)) for k, v in cols.items()}), parquet(root, ep))


def edit_json(path, change):
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d, indent=2))


def ffprobe_pts(path):
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "frame=pts_time",
                          "-of", "csv=p=0", str(path)], capture_output=True, text=True, check=True).stdout
    return np.array([float(x.strip(",")) for x in out.split() if x.strip(",")])


def load_tokenizer():
    # by file path: `import model` would import torch, which this test does not need
    import importlib.util
    spec = importlib.util.spec_from_file_location("tokenizer_under_test", REPO / "scripts/model/tokenizer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    dst = tmp_path_factory.mktemp("pnp") / "out"
    rc, out, err = run_convert(FIXTURE, dst)
    assert rc == 0, err
    doc = json.loads((dst / "loongforge_dataset.json").read_text())
    return dst, doc, out, err


# ---------------------------------------------------------------------------
# The fixture converts, and reads back exactly


def test_picknplace_converts_five_episodes_and_reports_the_one_frame_timestamp_offset(converted):
    dst, doc, out, err = converted
    assert doc["totals"]["episodes"] == 5 and doc["totals"]["frames"] == 2096
    assert [e["length"] for e in doc["episodes"]] == [ROWS[i] for i in range(5)]
    for e in doc["episodes"]:
        v = e["videos"][0]
        assert v["offset_corrected"] and v["timestamp_offset_s"] == pytest.approx(0.05, abs=2e-5)
        assert v["first_pts_s"] == 0.0 and v["max_residual_s"] < 1e-4
    assert out.count("constant offset +0.0499") == 5
    assert "done: 5 episodes, 2096 frames, 1 shard(s) 912672 bytes" in out
    assert ("warning: feature 'observation.images.egoview' in meta/info.json has no video files and "
            "meta/modality.json does not use it; skipped") in err
    assert [f["name"] for f in doc["features"] if not f["stored"]] == ["observation.images.egoview"]
    assert doc["cameras"] == [{"camera_id": 0, "key": CAM, "modality_name": "ego_view", "height": 256,
                               "width": 256, "codec": "h264", "fps": 20.0}]
    assert doc["embodiment_tag"] == "gr1" and doc["fps"] == 20.0


def test_every_shard_value_reads_back_equal_to_the_parquet_source(converted):
    dst, doc, _, _ = converted
    shard = Shard(dst / "shard-00000.lfshard")
    assert [c["name"] for c in shard.columns] == [c["name"] for c in doc["columns"]]
    for ep in range(5):
        got, _ = shard.episode(ep)
        src = pq.read_table(parquet(FIXTURE, ep))
        for name in ("observation.state", "action"):
            x = np.array(src.column(name).to_pylist(), dtype=np.float64)
            y = got[name]
            assert y.dtype == np.float32 and y.shape == (ROWS[ep], 44)
            # float32 rounding: |y - x| <= 2^-24 |x| (half an ulp), and it is numpy's own rounding
            assert np.all(np.abs(y.astype(np.float64) - x) <= 2.0 ** -24 * np.abs(x))
            assert np.array_equal(y, x.astype(np.float32))
        assert np.array_equal(got["timestamp"], src.column("timestamp").to_numpy())
        for name in ("annotation.human.action.task_description", "task_index", "annotation.human.validity",
                     "episode_index", "index"):
            assert got[name].dtype == np.int64 and np.array_equal(got[name], src.column(name).to_numpy()), name
        assert np.array_equal(got["next.reward"], src.column("next.reward").to_numpy())
        assert np.array_equal(got["next.done"], src.column("next.done").to_numpy(zero_copy_only=False))
        assert np.array_equal(got["frame_index"], np.arange(ROWS[ep]))
        assert np.array_equal(got["video_frame:" + CAM], np.arange(ROWS[ep]))
        assert np.allclose(got["video_pts:" + CAM], ffprobe_pts(video(FIXTURE, ep)), atol=1e-6, rtol=0)


def test_every_checksum_verifies_and_every_array_is_64_byte_aligned(converted):
    dst, doc, _, _ = converted
    shard = Shard(dst / "shard-00000.lfshard")
    assert crc32_bitwise(b"123456789") == 0xCBF43926 == crc32(b"123456789")
    assert crc32_bitwise(shard.buf[0:124]) == struct.unpack_from("<I", shard.buf, 124)[0]
    assert (shard.version, shard.header_bytes, shard.alignment, shard.ct_off) == (1, 128, 64, 128)
    assert shard.reserved_zero and shard.total_rows == 2096 and shard.idx_off % 64 == 0
    for e, j in zip(shard.index, doc["episodes"]):
        assert (e["episode_index"], e["record_offset"], e["record_bytes"], e["record_crc32"]) == \
            (j["episode_index"], j["record_offset"], j["record_bytes"], j["record_crc32"])
        assert e["record_offset"] % 64 == 0 and e["record_bytes"] % 64 == 0
        _, layout = shard.episode(e["episode_index"])
        for off, nbytes in layout:
            assert (e["record_offset"] + off) % 64 == 0
    # records are packed back to back after the column table, the index after the last one
    assert shard.index[0]["record_offset"] == (128 + 96 * shard.column_count + 63) // 64 * 64
    for a, b in zip(shard.index, shard.index[1:]):
        assert a["record_offset"] + a["record_bytes"] == b["record_offset"]
    assert shard.index[-1]["record_offset"] + shard.index[-1]["record_bytes"] == shard.idx_off


def test_a_flipped_byte_anywhere_is_detected_by_a_checksum(converted):
    dst, _, _, _ = converted
    good = (dst / "shard-00000.lfshard").read_bytes()
    shard = Shard(None, good)
    e = shard.index[2]
    state_byte = e["record_offset"] + 512 + 1000  # inside episode 2's observation.state array

    def flipped(pos):
        b = bytearray(good)
        b[pos] ^= 0x10
        return bytes(b)

    bad = Shard(None, flipped(state_byte))  # header, column table and index still verify
    bad.episode(1)
    with pytest.raises(ShardCorrupt, match="episode 2: record crc32 mismatch"):
        bad.episode(2)
    with pytest.raises(ShardCorrupt, match="header crc32 mismatch"):
        Shard(None, flipped(30))
    with pytest.raises(ShardCorrupt, match="column table crc32 mismatch"):
        Shard(None, flipped(128 + 5))
    with pytest.raises(ShardCorrupt, match="index crc32 mismatch"):
        Shard(None, flipped(shard.idx_off + 9))


def test_videos_are_copied_byte_for_byte_and_tasks_carry_the_model_tokenizer_ids(converted):
    dst, doc, _, _ = converted
    for e in doc["episodes"]:
        v = e["videos"][0]
        data = (dst / v["file"]).read_bytes()
        assert data == video(FIXTURE, e["episode_index"]).read_bytes()
        # the trainer re-checks size, hash and frame count when it opens the episode
        assert v["bytes"] == len(data) and v["sha256"] == hashlib.sha256(data).hexdigest()
        assert v["frame_count"] == e["length"]
    tokenizer = load_tokenizer()
    texts = [json.loads(line)["task"] for line in (FIXTURE / "meta/tasks.jsonl").read_text().splitlines()]
    assert [t["text"] for t in doc["tasks"]] == texts
    for t in doc["tasks"]:
        ids, length = tokenizer.encode(t["text"], doc["tokenizer"]["max_len"])
        assert t["token_ids"] == list(ids[:length]) and t["token_ids"][0] == 1 and t["token_ids"][-1] == 2
    assert doc["tokenizer"]["vocab_size"] == 8192
    assert [e["task_indices"] for e in doc["episodes"]] == [[0, 1], [1, 2], [1, 3], [1, 4], [1, 5]]
    assert set(doc["stats"]["observation.state"]) == {"mean", "std", "min", "max", "q01", "q99"}


def test_a_small_max_shard_bytes_spreads_episodes_over_several_shards(tmp_path):
    rc, out, err = run_convert(FIXTURE, tmp_path / "out", "--episodes", "3,4", "--max-shard-bytes", "100000")
    assert rc == 0, err
    doc = json.loads((tmp_path / "out/loongforge_dataset.json").read_text())
    assert [(e["episode_index"], e["shard"]) for e in doc["episodes"]] == \
        [(3, "shard-00000.lfshard"), (4, "shard-00001.lfshard")]
    got, _ = Shard(tmp_path / "out/shard-00001.lfshard").episode(4)
    assert got["action"].shape == (328, 44)


# ---------------------------------------------------------------------------
# Doctored copies: one thing broken each


def test_a_missing_video_names_episode_and_file_and_leaves_no_output(tmp_path):
    src = copy_fixture(tmp_path / "src")
    video(src, 3).unlink()
    rc, out, err = run_convert(src, tmp_path / "out")
    assert rc == 1
    assert (f"error: episode 3 ({video(src, 3)}): video file is missing for feature '{CAM}', which "
            "meta/modality.json uses as video.ego_view (1 of 5 episodes lack it)") in err
    assert f"fix: copy the videos of '{CAM}', or remove video.ego_view from meta/modality.json" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_a_missing_parquet_file_is_an_error(tmp_path):
    src = copy_fixture(tmp_path / "src")
    parquet(src, 1).unlink()
    rc, _, err = run_convert(src, tmp_path / "out")
    assert rc == 1 and f"error: episode 1 ({parquet(src, 1)}): parquet file is missing" in err


def test_a_missing_meta_file_is_an_error(tmp_path):
    src = copy_fixture(tmp_path / "src")
    (src / "meta/tasks.jsonl").unlink()
    rc, _, err = run_convert(src, tmp_path / "out")
    assert rc == 1 and (f"error: {src / 'meta/tasks.jsonl'}: is missing; a LeRobot v2.x dataset needs "
                        "meta/info.json, meta/tasks.jsonl, meta/episodes.jsonl") in err


def test_without_modality_json_a_v2_dataset_converts_with_the_default_modality(tmp_path):
    src = copy_fixture(tmp_path / "src")
    (src / "meta/modality.json").unlink()  # plain LeRobot datasets have none (GR00T's add it)
    edit_json(src / "meta/info.json", lambda d: d["features"].pop("observation.images.egoview"))  # no files
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "0")
    assert rc == 0, err
    assert f"warning: {src / 'meta/modality.json'} is missing; using the default" in err
    doc = json.loads((tmp_path / "out/loongforge_dataset.json").read_text())
    assert doc["modality"]["state"] == {"state": {"start": 0, "end": 44, "original_key": "observation.state"}}
    assert [c["key"] for c in doc["cameras"]] == [CAM] and doc["cameras"][0]["modality_name"] == "ego_view"


def test_dropped_parquet_rows_are_a_row_count_versus_frame_count_mismatch(tmp_path):
    src = copy_fixture(tmp_path / "src")
    rewrite_parquet(src, 4, lambda c: [v.__delitem__(slice(-10, None)) for v in c.values()])
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "4")
    assert rc == 1
    assert (f"error: episode 4 ({parquet(src, 4)}): parquet has 318 rows but video {video(src, 4)} "
            "has 328 frames") in err


def test_timestamps_drifting_against_the_video_are_rejected(tmp_path):
    src = copy_fixture(tmp_path / "src")
    rewrite_parquet(src, 4, lambda c: c.update(timestamp=[t * 1.01 for t in c["timestamp"]]))
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "4")
    assert rc == 1
    assert f"error: episode 4 ({parquet(src, 4)}): parquet timestamps drift against the frame times of video" in err
    assert ("after removing a constant offset of +0.132242 s, row 327 (timestamp 16.563984 s) is +0.081742 s "
            "from frame 327 (pts 16.350000 s); tolerance is 1/(2*fps) = 0.025000 s; the residual changes by "
            "+9.999 ms per second of video from row 0 (-0.081742 s) to row 327 (+0.081742 s)") in err
    assert "recorded on different clocks or rates" in err


def test_a_single_timestamp_jump_is_reported_at_its_row_not_as_a_drift(tmp_path):
    src = copy_fixture(tmp_path / "src")

    def jump(c):
        c["timestamp"][200] += 0.03  # still increasing, but 0.6 frame off
    rewrite_parquet(src, 4, jump)
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "4")
    assert rc == 1
    assert (f"error: episode 4 ({parquet(src, 4)}): parquet timestamps do not line up with the frame times of "
            f"video {video(src, 4)} (no steady drift, a jump): after removing a constant offset of +0.049992 s, "
            "row 200 (timestamp 10.079990 s) is +0.029998 s from frame 200 (pts 10.000000 s)") in err
    assert "fix: fix the timestamps of" in err and "around row 200 (expected about 10.049992 s)" in err


def test_a_null_value_is_rejected_with_its_row(tmp_path):
    src = copy_fixture(tmp_path / "src")
    rewrite_parquet(src, 4, lambda c: c["next.reward"].__setitem__(5, None))
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "4")
    assert rc == 1
    assert f"error: episode 4 ({parquet(src, 4)}): column 'next.reward' has 1 null values (first at row 5)" in err


def test_timestamps_shifted_by_a_constant_are_corrected_and_reported(tmp_path):
    src = copy_fixture(tmp_path / "src")
    rewrite_parquet(src, 4, lambda c: c.update(timestamp=[t + 0.5 for t in c["timestamp"]]))
    rc, out, err = run_convert(src, tmp_path / "out", "--episodes", "3,4")
    assert rc == 0, err
    assert "episode 4: 328 rows" in out and "constant offset +0.549992 s, corrected" in out
    doc = json.loads((tmp_path / "out/loongforge_dataset.json").read_text())
    assert doc["episodes"][1]["videos"][0]["timestamp_offset_s"] == pytest.approx(0.55, abs=2e-5)
    got, _ = Shard(tmp_path / "out/shard-00000.lfshard").episode(4)
    assert np.array_equal(got["video_frame:" + CAM], np.arange(328))


def test_a_video_whose_first_pts_is_not_zero_is_aligned_by_a_negative_offset(tmp_path):
    src = copy_fixture(tmp_path / "src")
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(video(FIXTURE, 4)), "-c", "copy",
                    "-output_ts_offset", "2", str(video(src, 4))], check=True)
    rc, out, err = run_convert(src, tmp_path / "out", "--episodes", "4")
    assert rc == 0, err
    assert "constant offset -1.950008 s, corrected" in out
    v = json.loads((tmp_path / "out/loongforge_dataset.json").read_text())["episodes"][0]["videos"][0]
    assert v["first_pts_s"] == 2.0 and v["codec"] == "h264"


def test_an_mpeg4_video_is_rejected_as_an_unsupported_codec(tmp_path):
    src = copy_fixture(tmp_path / "src")
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", "testsrc=size=256x256:rate=20",
                    "-frames:v", "10", "-c:v", "mpeg4", str(video(src, 4))], check=True)
    edit_json(src / "meta/info.json", lambda d: d["features"][CAM]["video_info"].update({"video.codec": "mpeg4"}))
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "4")
    assert rc == 1
    assert (f"error: episode 4 ({video(src, 4)}): video {video(src, 4)} uses codec 'mpeg4', which LoongForge "
            "does not decode (accepted: av1, h264, hevc, mjpeg)") in err
    assert "fix: re-encode the video to H.264, e.g. `ffmpeg -i IN.mp4 -c:v libx264" in err


def test_a_modality_video_key_whose_files_are_missing_is_an_error(tmp_path):
    src = copy_fixture(tmp_path / "src")
    side = "observation.images.side_view"
    edit_json(src / "meta/info.json", lambda d: d["features"].update({side: d["features"][CAM]}))
    edit_json(src / "meta/modality.json", lambda d: d["video"].update({"side_view": {"original_key": side}}))
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "0")
    assert rc == 1
    assert (f"error: episode 0 ({video(src, 0, side)}): video file is missing for feature '{side}', which "
            "meta/modality.json uses as video.side_view (1 of 1 episodes lack it)") in err


def test_a_modality_key_absent_from_info_json_is_an_error(tmp_path):
    src = copy_fixture(tmp_path / "src")
    edit_json(src / "meta/modality.json", lambda d: d["video"].update({"wrist": {}}))
    rc, _, err = run_convert(src, tmp_path / "out")
    assert rc == 1
    assert (f"error: {src / 'meta/modality.json'}: video.wrist uses feature 'observation.images.wrist', which "
            "meta/info.json does not list as a video feature") in err


def test_a_state_of_the_wrong_width_is_rejected_against_the_info_json_shape(tmp_path):
    src = copy_fixture(tmp_path / "src")
    rewrite_parquet(src, 2, lambda c: c.update({"observation.state": [r[:43] for r in c["observation.state"]]}))
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "2")
    assert rc == 1
    assert (f"error: episode 2 ({parquet(src, 2)}): column 'observation.state' has 43 values in row 0 but "
            "meta/info.json features['observation.state'].shape is [44]") in err


def test_a_non_monotonic_frame_index_is_rejected(tmp_path):
    src = copy_fixture(tmp_path / "src")

    def add_frame_index(c):
        fi = list(range(len(c["timestamp"])))
        fi[100], fi[101] = 101, 100
        c["frame_index"] = fi
    rewrite_parquet(src, 4, add_frame_index)
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "4")
    assert rc == 1
    assert (f"error: episode 4 ({parquet(src, 4)}): frame_index is not monotonic: row 101 has frame_index 100 "
            "after 101 at row 100") in err


def test_a_nan_in_the_action_column_names_row_and_element(tmp_path):
    src = copy_fixture(tmp_path / "src")

    def poison(c):
        c["action"][7][30] = float("nan")
    rewrite_parquet(src, 0, poison)
    rc, _, err = run_convert(src, tmp_path / "out", "--episodes", "0")
    assert rc == 1
    assert (f"error: episode 0 ({parquet(src, 0)}): column 'action' holds 1 non-finite value(s) "
            "(nan at row 7, element 30)") in err


def test_the_command_line_exits_non_zero_with_the_message_on_stderr(tmp_path):
    src = copy_fixture(tmp_path / "src")
    (src / "meta/stats.json").unlink()
    p = subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(src), str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith(f"error: {src / 'meta/stats.json'}: is missing")
