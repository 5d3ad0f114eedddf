"""Preemption saves (Note [Preemption saves] in src/checkpoint/writer.cpp,
Note [Preemption lead time] in src/trainer/trainer_close.cpp), through the real
binaries on the CPU:

- two ranks over Gloo with the optimizer sharded (each rank writes its own
  shard, rank 1's through the peer files): SIGUSR1 to rank 1 mid-run makes
  both finish the step, write a preemption save (manifest format 3,
  "verified": false, a CRC-32 per chunk in every tensor file, rank 1's shard
  included), record its time in <run>/preemption.json and the log against
  checkpoint.preempt_lead_s, keep the earlier checkpoint, and exit 75;
  `loongforge validate-checkpoint` accepts it by its CRC-32s;
- a resume with a lead time shorter than that recorded save is refused on
  both ranks before anything loads, naming both figures and the key;
- `--resume latest` then verifies the save before training (the log says so,
  its manifest becomes format 2 with SHA-256s) and ends bitwise equal to an
  uninterrupted two-rank run (losses, weights, both optimizer shards);
- one rank (plumbing only): a preemption save with a flipped byte is refused
  when named (--resume DIR: the chunk and what to do), rejected by
  validate-checkpoint, and skipped by --resume latest for the previous
  complete checkpoint.

Environment (ctest): LOONGFORGE_TRAIN, LOONGFORGE_CLI, LOONGFORGE_TEST_DATASET, LOONGFORGE_TEST_MODELS.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comm"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "control"))
from test_multi_rank import launch, losses, wait_all  # noqa: E402
from trainer_harness import REPO  # noqa: E402

CLI = os.environ.get("LOONGFORGE_CLI", str(REPO / "build/cli/loongforge"))
EXIT_REQUEUE = 75
STEPS = 16
SHARDED = ("gcts.enable=true", "gcts.shard_optimizer=true", "checkpoint.interval_steps=4",
           "logging.interval_steps=1")


def seconds_text(s):
    """The trainer's seconds_text (src/trainer/trainer_close.cpp)."""
    return f"{s:.0f}" if s == int(s) else f"{s:.3f}" if s < 0.1 else f"{s:.2f}" if s < 10 else f"{s:.1f}"


def logs_of(out, n):
    return [(out / f"rank{r}.log").read_text() for r in range(n)]


def wait_for_steps(out, name, n, procs, timeout=180):
    metrics = out / name / "metrics.jsonl"
    t0 = time.time()
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        assert time.time() - t0 < timeout and all(p.poll() is None for p in procs), logs_of(out, len(procs))
        time.sleep(0.1)


def tensor_bytes(ckpt):
    return {str(p.relative_to(ckpt)): p.read_bytes() for p in sorted(ckpt.rglob("*.safetensors"))}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    wait_all(launch(out, 2, *SHARDED, name="s", steps=STEPS), out)
    return out / "s"


def test_sigusr1_saves_fast_refuses_a_short_lead_time_and_resumes_verified_and_bitwise(straight, tmp_path):
    procs = launch(tmp_path, 2, *SHARDED, name="p", steps=STEPS)
    wait_for_steps(tmp_path, "p", 6, procs)
    procs[1].send_signal(signal.SIGUSR1)
    codes = [p.wait(timeout=180) for p in procs]
    r0, r1 = logs_of(tmp_path, 2)
    assert codes == [EXIT_REQUEUE] * 2, (codes, r0[-3000:], r1[-3000:])
    run = tmp_path / "p"
    record = json.loads((run / "preemption.json").read_text())
    step = record["step"]
    # The stop applies two boundaries after the signal's: at 8 too, a periodic checkpoint's step, where the
    # periodic save gives way to the preemption save (a CI run met it).
    assert 6 <= step < STEPS, record
    ckpt = run / "checkpoints" / f"epoch_0_step_{step}"
    assert record["checkpoint"] == str(ckpt)
    assert record["timed_from"] == "rank 0 applying a stop signalled on another rank"  # rank 0 got no signal
    assert 0 < record["save_s"] <= record["signal_to_durable_s"] and record["preempt_lead_s"] == 120
    assert record["bytes"] > 60e6
    assert (f"preemption save {ckpt}: " in r0 and "within the lead time of 120 s (checkpoint.preempt_lead_s)" in r0), r0
    print(f"\npreemption save of {record['bytes'] / 1e6:.1f} MB on 2 CPU ranks: written in {record['save_s']:.2f} s, "
          f"durable {record['signal_to_durable_s']:.2f} s after the stop")

    m = json.loads((ckpt / "MANIFEST.json").read_text())
    assert m["format_version"] == 3 and m["verified"] is False
    for f in ("model.safetensors", "optimizer/rank_00000.safetensors", "optimizer/rank_00001.safetensors"):
        assert "chunk_crc32" in m["files"][f] and "chunk_sha256" not in m["files"][f], f
    previous = ((step - 1) // 4) * 4  # the newest periodic checkpoint before the save
    assert (run / "checkpoints" / f"epoch_0_step_{previous}").is_dir()  # kept: nothing was pruned
    v = subprocess.run([CLI, "validate-checkpoint", str(ckpt)], capture_output=True, text=True)
    assert v.returncode == 0 and "every CRC-32 matches the manifest" in v.stdout, v.stdout

    # A lead time shorter than the measured save: both ranks refuse before loading anything.
    refused = launch(tmp_path, 2, *SHARDED, "checkpoint.resume=latest", "checkpoint.preempt_lead_s=0.001",
                     name="p", steps=STEPS)
    assert [p.wait(timeout=120) for p in refused] == [1, 1], logs_of(tmp_path, 2)
    r0, r1 = logs_of(tmp_path, 2)
    took = f"was durable {seconds_text(record['signal_to_durable_s'])} s after the stop signal"
    for log in (r0, r1):
        assert f"{run}/preemption.json: the last preemption save (step {step}" in log, log[-2000:]
        assert took in log and "more than checkpoint.preempt_lead_s = 0.001 s" in log, log[-2000:]
    assert "rank 0: " in r1
    assert json.loads((ckpt / "MANIFEST.json").read_text())["verified"] is False  # nothing was loaded

    logs = wait_all(launch(tmp_path, 2, *SHARDED, "checkpoint.resume=latest", name="p", steps=STEPS), tmp_path)
    assert f"verified preemption save {ckpt}: the CRC-32 of each of its" in logs, logs[-3000:]
    assert f"resumed from {ckpt} at step {step}" in logs
    m = json.loads((ckpt / "MANIFEST.json").read_text())
    assert m["format_version"] == 2 and m["verified"] is True and "chunk_sha256" in m["files"]["model.safetensors"]
    assert losses(run) == losses(straight)  # bitwise, all steps
    final = f"checkpoints/epoch_0_step_{STEPS}"
    assert tensor_bytes(run / final) == tensor_bytes(straight / final)


def test_a_damaged_preemption_save_is_refused_and_latest_takes_the_previous_checkpoint(tmp_path):
    """One rank: plumbing of the refusal and the fallback (the multi-rank save is the test above)."""
    procs = launch(tmp_path, 1, "checkpoint.interval_steps=4", "logging.interval_steps=1", name="d", steps=STEPS)
    wait_for_steps(tmp_path, "d", 6, procs)
    procs[0].send_signal(signal.SIGUSR1)
    assert procs[0].wait(timeout=180) == EXIT_REQUEUE, logs_of(tmp_path, 1)[0][-3000:]
    run = tmp_path / "d"
    step = json.loads((run / "preemption.json").read_text())["step"]
    ckpt = run / "checkpoints" / f"epoch_0_step_{step}"
    f = ckpt / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x04
    f.write_bytes(bytes(data))

    named = launch(tmp_path, 1, f"checkpoint.resume={ckpt}", name="d", steps=STEPS)
    assert named[0].wait(timeout=120) == 1
    log = logs_of(tmp_path, 1)[0]
    assert f"cannot resume from '{ckpt}': it is damaged or incomplete (a preemption save, never verified):" in log
    assert f"{f}: CRC-32 differs from the manifest in chunk" in log
    assert "use --resume latest to take the newest intact one" in log
    v = subprocess.run([CLI, "validate-checkpoint", str(ckpt)], capture_output=True, text=True)
    assert v.returncode == 1 and "INVALID" in v.stdout and "CRC-32 differs" in v.stdout, v.stdout

    previous = ((step - 1) // 4) * 4  # the newest periodic checkpoint before the damaged save
    logs = wait_all(launch(tmp_path, 1, "checkpoint.resume=latest", name="d", steps=STEPS), tmp_path)
    assert f"skipping damaged checkpoint {ckpt}: {f}: CRC-32 differs" in logs, logs[-3000:]
    assert f"resumed from {run}/checkpoints/epoch_0_step_{previous} at step {previous}" in logs
