"""ADFE (adfe.enable=true) through the real binary: training with the
asynchronous data source gives the plain source's loss sequence exactly; a
run stopped at step 3 and resumed with ADFE continues with the uninterrupted
run's losses; a bad video stops training with the plain source's message at
the same step, after a checkpoint of the last good one; with
on_bad_video=skip the same skips are counted step by step; metrics.jsonl
carries the queue depth and the decode rate.

Environment as in test_video_data.py (set by ctest).
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

from test_video_data import BAD_EPISODE, BAD_ROWS, epoch_permutation

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = Path(os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf")))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"
CAM = "observation.images.ego_view"
ADFE = ["adfe.enable=true", "adfe.decode_threads=2", "adfe.prefetch_factor=3"]


def train(out, data, *sets):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
           "--set", f"data.path={data}", "--set", f"run.output_dir={out}", "--set", "logging.progress=off",
           "--set", "trainer.micro_batch_size=4", "--set", "trainer.gradient_accumulation_steps=2",
           "--set", "run.deterministic=true", "--set", "checkpoint.interval_steps=1000"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def records(out):
    return [json.loads(line) for line in (out / "n16-tiny-demo/metrics.jsonl").read_text().splitlines()]


def video(root, ep):
    return Path(root) / f"videos/chunk-000/{CAM}/episode_{ep:06d}.mp4"


def swapped_copy(tmp_path, ep):
    """Episode `ep`'s video replaced by the next one's (refused by size against the index)."""
    root = tmp_path / "data"
    shutil.copytree(DATA, root)
    shutil.copyfile(video(DATA, ep + 1), video(root, ep))
    return root


def test_adfe_trains_to_the_plain_sources_losses_and_resumes_to_the_same_ones(tmp_path):
    # In order (data.shuffle=false): one video decoded per run, not five, keeps the runs short;
    # test/engines/adfe/test_adfe.cpp compares the shuffled order's batches bit for bit.
    plain = train(tmp_path / "plain", DATA, "trainer.max_steps=6", "data.shuffle=false")
    assert plain.returncode == 0, plain.stderr[-3000:]
    # ADFE for steps 1-3, stopped there (a checkpoint), then resumed with ADFE for steps 4-6.
    first = train(tmp_path / "adfe", DATA, "trainer.max_steps=6", "data.shuffle=false", "trainer.steps_per_run=3",
                  *ADFE)
    assert first.returncode == 0, first.stderr[-3000:]
    rest = train(tmp_path / "adfe", DATA, "trainer.max_steps=6", "data.shuffle=false", "checkpoint.resume=latest",
                 *ADFE)
    assert rest.returncode == 0, rest.stderr[-3000:]
    want, got = records(tmp_path / "plain"), records(tmp_path / "adfe")
    assert [(r["step"], r["loss"], r["num_valid"], r["grad_norm"]) for r in got] == \
        [(r["step"], r["loss"], r["num_valid"], r["grad_norm"]) for r in want]
    assert all(r["queue_depth"] == 0 for r in want)
    assert all(0 <= r["queue_depth"] <= 3 for r in got)
    assert sum(r["decoded_frames_per_s"] for r in got) > 0 and sum(r["decoded_frames_per_s"] for r in want) > 0
    # Level 0's queue and rate are recorded; the plain source has no I/O threads.
    assert all(r["io_jobs"] == 0 and r["readahead_mb_per_s"] == 0 for r in want)
    assert all(r["io_jobs"] >= 0 and r["readahead_mb_per_s"] >= 0 for r in got)


def stop_line(stderr):
    return next((x for x in stderr.splitlines() if x.startswith("loongforge-train: data_error: ")), None)


def seed_with_good_steps_first():
    """A seed whose first 2-4 steps of 8 samples leave the bad episode alone."""
    for seed in range(1, 200):
        perm = epoch_permutation(2096, seed, 0)
        first_bad = next(s for s in range(2096 // 8) if any(p in BAD_ROWS for p in perm[s * 8:(s + 1) * 8]))
        if 2 <= first_bad <= 4:
            return seed
    raise AssertionError("no suitable seed")


def test_a_bad_video_stops_adfe_at_the_plain_sources_step_with_its_message_after_a_checkpoint(tmp_path):
    root = swapped_copy(tmp_path, BAD_EPISODE)
    seed = seed_with_good_steps_first()
    plain = train(tmp_path / "plain", root, "trainer.max_steps=8", f"run.seed={seed}")
    adfe = train(tmp_path / "adfe", root, "trainer.max_steps=8", f"run.seed={seed}", *ADFE)
    assert plain.returncode == adfe.returncode == 1, adfe.stderr[-3000:]
    line = stop_line(plain.stderr)
    assert line is not None and f"episode 1, camera '{CAM}', video {video(root, 1)}" in line, plain.stderr[-3000:]
    assert stop_line(adfe.stderr) == line
    steps = [r["step"] for r in records(tmp_path / "plain")]
    assert len(steps) >= 2 and [r["step"] for r in records(tmp_path / "adfe")] == steps
    assert (f"The state after step {steps[-1]} is saved: {tmp_path}/adfe/n16-tiny-demo/checkpoints/"
            f"epoch_0_step_{steps[-1]} (resume with --resume latest).") in adfe.stderr


def test_with_on_bad_video_skip_adfe_counts_the_same_skips_step_by_step(tmp_path):
    root = swapped_copy(tmp_path, BAD_EPISODE)
    plain = train(tmp_path / "plain", root, "trainer.max_steps=3", "data.on_bad_video=skip")
    adfe = train(tmp_path / "adfe", root, "trainer.max_steps=3", "data.on_bad_video=skip", *ADFE)
    assert plain.returncode == adfe.returncode == 0, adfe.stderr[-3000:]
    fields = ("step", "loss", "num_valid", "samples_skipped", "videos_bad")
    want = [tuple(r[k] for k in fields) for r in records(tmp_path / "plain")]
    assert [tuple(r[k] for k in fields) for r in records(tmp_path / "adfe")] == want
    assert want[-1][3] > 0 and want[-1][4] == 1
    assert adfe.stderr.count("bad video, its samples are skipped") == 1
