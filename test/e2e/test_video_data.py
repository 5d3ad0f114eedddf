"""Training on damaged and on AV1 videos, as a user sees it. Corrupted copies
of the converted bundled dataset are made here: 4 KiB flipped inside a
keyframe, the next episode's video swapped in, a 320x240 re-encode swapped
in, and a damaged keyframe with the index forged to match (a source video
damaged before conversion). Before the checks each of these trained to exit 0
on concealed or wrong frames. Now:
  - data.on_bad_video=error (default): the run stops (exit 1) at the first
    step needing the video with a data_error naming the step, shard, episode,
    camera, video and cause; when good steps came first, after a checkpoint
    of the last good one;
  - data.on_bad_video=skip: the run finishes (exit 0); the video is reported
    once, each of its samples is logged, and they are counted in metrics.jsonl
    and summary.json (exactly the samples the documented order gives it).
An AV1 copy (SVT-AV1, -g 2) trains like the h264 original.

Environment as in test_parity.py (set by ctest), plus LOONGFORGE_TEST_AV1_DATASET.
"""
import hashlib
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = Path(os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf")))
AV1 = Path(os.environ.get("LOONGFORGE_TEST_AV1_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.av1.lf")))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"
CAM = "observation.images.ego_view"
BAD_EPISODE = 1  # rows 416..885 of the 2096 samples
BAD_ROWS = range(416, 886)
BATCH = 4
GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def epoch_permutation(n, seed, epoch):
    """docs/training-semantics.md s2: SplitMix64 Fisher-Yates (data::epoch_permutation)."""
    perm, state = list(range(n)), (seed + epoch * GOLDEN) & MASK
    for i in range(n - 1, 0, -1):
        state = (state + GOLDEN) & MASK
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        j = z % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def seed_and_first_bad_step():
    """A seed whose first BATCH-sample steps (one rank, K = 1) leave the bad
    episode alone for at least 2 steps, and the 1-based step that first needs it."""
    for seed in range(1, 100):
        perm = epoch_permutation(2096, seed, 0)
        step = next(s for s in range(2096 // BATCH) if any(p in BAD_ROWS for p in perm[s * BATCH:(s + 1) * BATCH]))
        if 2 <= step <= 4:
            return seed, step + 1
    raise AssertionError("no suitable seed")


def video(root, ep):
    return Path(root) / f"videos/chunk-000/{CAM}/episode_{ep:06d}.mp4"


def flip_4k_in_keyframe(path):
    """XOR 4 KiB inside the video's first keyframe (its slice data), keeping NAL lengths intact: the frames
    step 1 needs lie in that keyframe's span, so span decoding (the default) meets it as whole decoding does."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "packet=size,pos,flags",
                          "-of", "csv=p=0", str(path)], check=True, capture_output=True, text=True).stdout
    size, pos = next((int(f[0]), int(f[1])) for f in (line.split(",") for line in out.split()) if "K" in f[2])
    data = bytearray(path.read_bytes())
    at = pos + size // 4
    for i in range(at, at + 4096):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def forge_index(root, ep):
    """Make the index agree with the damaged file (as if damaged before conversion)."""
    doc_path = root / "loongforge_dataset.json"
    doc = json.loads(doc_path.read_text())
    data = video(root, ep).read_bytes()
    for e in doc["episodes"]:
        if e["episode_index"] == ep:
            e["videos"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    doc_path.write_text(json.dumps(doc, indent=1))


def damage(root, case, ep):
    v = video(root, ep)
    if case == "flipped":
        flip_4k_in_keyframe(v)
    elif case == "swapped":
        shutil.copyfile(video(DATA, ep + 1), v)
    elif case == "320x240":
        subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-y", "-i", str(video(DATA, ep)), "-vf",
                        "scale=320:240", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-g", "2", str(v)], check=True)
    elif case == "flipped-before-conversion":
        flip_4k_in_keyframe(v)
        forge_index(root, ep)


# The cause each case is reported with.
CAUSES = {
    "flipped": "SHA-256 ",
    "swapped": "bytes but the dataset index records",
    "320x240": "bytes but the dataset index records",
    "flipped-before-conversion": "the bitstream is corrupt",
}


def damaged_copy(tmp_path, case, ep):
    root = tmp_path / "data"
    shutil.copytree(DATA, root)
    damage(root, case, ep)
    return root


def stop_message(root, step, ep):
    return (f"data_error: step {step} on rank 0: bad video (data.on_bad_video=error): shard "
            f"shard-00000.lfshard, episode {ep}, camera '{CAM}', video {video(root, ep)}")


def train(tmp_path, data, *sets):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
           "--set", f"data.path={data}", "--set", f"run.output_dir={tmp_path / 'runs'}",
           "--set", "logging.progress=off", "--set", f"trainer.micro_batch_size={BATCH}",
           "--set", "checkpoint.interval_steps=1000"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("case", list(CAUSES))
def test_a_bad_video_stops_training_naming_the_step_shard_episode_video_and_cause(tmp_path, case):
    root = damaged_copy(tmp_path, case, 0)
    r = train(tmp_path, root, "data.shuffle=false", "trainer.max_steps=2")  # step 1 needs episode 0
    assert r.returncode == 1, r.stderr[-3000:]
    line = next((x for x in r.stderr.splitlines() if x.startswith("loongforge-train: " + stop_message(root, 1, 0))),
                None)
    assert line is not None, r.stderr[-3000:]
    assert CAUSES[case] in line and line.endswith("; or set data.on_bad_video=skip to train without its samples")
    assert "is saved" not in r.stderr  # no step was taken: nothing to keep
    if case == "flipped-before-conversion":
        assert ", frame " in line  # the decoder found it, at a frame


def test_a_bad_video_met_after_good_steps_stops_after_a_checkpoint_of_the_last_good_one(tmp_path):
    root = damaged_copy(tmp_path, "swapped", BAD_EPISODE)
    seed, bad_step = seed_and_first_bad_step()
    r = train(tmp_path, root, f"run.seed={seed}", "trainer.max_steps=8")
    assert r.returncode == 1, r.stderr[-3000:]
    run = tmp_path / "runs/n16-tiny-demo"
    assert stop_message(root, bad_step, BAD_EPISODE) in r.stderr, r.stderr[-3000:]
    good = bad_step - 1
    assert (f"The state after step {good} is saved: {run}/checkpoints/epoch_0_step_{good} "
            "(resume with --resume latest).") in r.stderr
    state = json.loads((run / f"checkpoints/epoch_0_step_{good}/trainer_state.json").read_text())
    assert state["step"] == good
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == list(range(1, bad_step))


def skip_lines(stderr):
    return [line for line in stderr.splitlines() if "skipped, its action mask zeroed:" in line]


def test_with_on_bad_video_skip_a_flipped_video_is_logged_and_counted_and_the_run_finishes(tmp_path):
    root = damaged_copy(tmp_path, "flipped", BAD_EPISODE)
    seed, bad_step = seed_and_first_bad_step()
    r = train(tmp_path, root, "data.on_bad_video=skip", f"run.seed={seed}", f"trainer.max_steps={bad_step}")
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "runs/n16-tiny-demo"
    assert r.stderr.count("bad video, its samples are skipped (data.on_bad_video=skip): shard shard-00000.lfshard, "
                          f"episode 1, camera '{CAM}', video {video(root, BAD_EPISODE)}: SHA-256 ") == 1
    skipped = skip_lines(r.stderr)
    perm = epoch_permutation(2096, seed, 0)
    expect = sum(1 for p in perm[:bad_step * BATCH] if p in BAD_ROWS)
    assert len(skipped) == expect > 0
    assert all("(episode 1, row " in line for line in skipped)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["samples_skipped"] for x in records] == [0] * (bad_step - 1) + [expect]
    assert records[-1]["videos_bad"] == 1 and all(math.isfinite(x["loss"]) for x in records)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["samples_skipped"] == expect and summary["videos_bad"] == 1


@pytest.mark.parametrize("case", ["swapped", "320x240", "flipped-before-conversion"])
def test_with_on_bad_video_skip_a_step_of_only_bad_samples_has_zero_loss_and_counts_them(tmp_path, case):
    root = damaged_copy(tmp_path, case, 0)
    r = train(tmp_path, root, "data.on_bad_video=skip", "data.shuffle=false", "trainer.max_steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert CAUSES[case] in r.stderr
    records = [json.loads(line) for line in (tmp_path / "runs/n16-tiny-demo/metrics.jsonl").read_text().splitlines()]
    assert [x["samples_skipped"] for x in records] == [BATCH, 2 * BATCH]
    assert [x["loss"] for x in records] == [0.0, 0.0] and [x["num_valid"] for x in records] == [0, 0]
    assert len(skip_lines(r.stderr)) == 2 * BATCH


def test_an_av1_copy_of_the_dataset_trains(tmp_path):
    doc = json.loads((AV1 / "loongforge_dataset.json").read_text())
    assert doc["cameras"][0]["codec"] == "av1"
    r = train(tmp_path, AV1, "trainer.max_steps=3", "data.shuffle=false")
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "runs/n16-tiny-demo"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == [1, 2, 3]
    assert all(math.isfinite(x["loss"]) and x["samples_skipped"] == 0 for x in records)
    assert json.loads((run / "summary.json").read_text())["videos_decoded"] > 0
