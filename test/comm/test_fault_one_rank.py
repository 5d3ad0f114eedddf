"""A failed step's recovery run by one rank (fault.enable; Note [Training on after a lost rank] in
src/trainer/trainer_fault.cpp), where the job's world is one rank (LOONGFORGE_TEST_ONE_RANK_WORLD=1) and
LOONGFORGE_TEST_STALL_AT_STEP fails one step's communication:
- on the CPU (Gloo) the step raises the CommError a failed collective raises;
- on a GPU (NCCL) the device is kept busy past fault.comm_timeout_s, so the settling before the update
  (Note [Settling a step on NCCL] in comm/world.hpp) times out and aborts the communicator, as for a hung
  peer; the reduction captured into the step's CUDA graph is dropped and captured again on the new
  communicator.
Either way the run regroups (generation 1, no rank lost), takes the failed step again and ends equal to a
run without the failure: bitwise on the CPU; on the GPU every loss within 1e-6 relative (the steps after
the regroup run eagerly until their graphs are captured again). On the CPU also with GCTS's sharded AdamW,
whose moments are re-sharded over the new group.
One rank proves the plumbing of recovery (detection, abort, a new communicator, graphs made again, the
step taken again), not its arithmetic over several ranks: that is test_fault_tolerance.py on four CPU
ranks; several GPUs have not run it.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "control"))
from trainer_harness import DATA, MODEL, REPO, TRAIN, free_port  # noqa: E402

DEVICE = os.environ.get("LOONGFORGE_TEST_DEVICE", "cpu")
STEPS, STALL_AT, COMM_TIMEOUT_S = 8, 4, 3
SETS = ["trainer.micro_batch_size=2", "trainer.gradient_accumulation_steps=2", "run.threads=1",
        "run.deterministic=true", "logging.progress=lines", "logging.interval_steps=1",
        "checkpoint.interval_steps=1000000", "control.enable=false", f"trainer.max_steps={STEPS}"]
if DEVICE == "cuda":  # the TorchScript step as CUDA graphs, GCTS's reduction captured into them
    SETS += ["run.device=cuda", "trainer.compiled_step=off", "trainer.cuda_graphs=on", "gcts.enable=true",
             "gcts.overlap=true"]
FAULT = ["fault.enable=true", f"fault.comm_timeout_s={COMM_TIMEOUT_S}", "fault.heartbeat_s=0.2",
         "fault.heartbeat_timeout_s=2"]


def train(out, name, *sets, stall=None):
    env = dict(os.environ, LOONGFORGE_TEST_ONE_RANK_WORLD="1", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.pop("LOONGFORGE_TEST_STALL_AT_STEP", None)
    if stall:
        env["LOONGFORGE_TEST_STALL_AT_STEP"] = str(stall)
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={out}", "--set", f"run.name={name}"]
    for s in SETS + list(sets):
        cmd += ["--set", s]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-6000:]
    recs = [json.loads(l) for l in (Path(out) / name / "metrics.jsonl").read_text().splitlines()]
    return recs, log, time.time() - t0


# The sharded form runs on the CPU only: on a GPU it has not run yet.
@pytest.mark.parametrize("gradients", ["plain", "sharded"] if DEVICE == "cpu" else ["plain"])
def test_a_failed_step_is_taken_again_on_a_new_group_and_the_run_ends_as_without_the_failure(tmp_path, gradients):
    """plain: the trainer's default gradient path; sharded: GCTS with the sharded AdamW (its moments re-sharded
    over the new group from the members' shards, Note [Re-sharding after a lost rank])."""
    extra = ["gcts.enable=true", "gcts.shard_optimizer=true"] if gradients == "sharded" else []
    plain, _, plain_s = train(tmp_path, "plain", *FAULT, *extra)
    failed, log, failed_s = train(tmp_path, "failed", *FAULT, *extra, stall=STALL_AT)
    events = [r for r in failed if "event" in r]
    assert len(events) == 1, log[-4000:]
    e = events[0]
    assert e["event"] == "regrouped" and e["generation"] == 1 and e["lost"] == [] and e["members"] == [0]
    assert e["failed_step"] == STALL_AT and e["step"] == STALL_AT - 1  # nothing of the failed step was applied
    print(f"{DEVICE}, {gradients}: step {STALL_AT} failed {e['failed_after_s']:.2f} s into the step, regrouped in "
          f"{e['regroup_s']:.2f} s; runs {plain_s:.1f} s without, {failed_s:.1f} s with the failure")
    if DEVICE == "cuda":
        assert "did not complete" in e["error"] and "NCCL group was aborted" in e["error"], e["error"]
        assert "collective timeout" in e["error"]
        # not before the collective timeout; the abort then waits out the stall's spin (3 x the timeout),
        # which NCCL's abort does not end (Note [Settling a step on NCCL])
        assert COMM_TIMEOUT_S - 0.5 <= e["failed_after_s"] <= 3 * COMM_TIMEOUT_S + 4
    else:
        assert "injected by LOONGFORGE_TEST_STALL_AT_STEP" in e["error"]
    a = {r["step"]: r["loss"] for r in plain if "loss" in r}
    b = {r["step"]: r["loss"] for r in failed if "loss" in r}
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))  # no step lost or repeated
    if DEVICE == "cuda":
        worst = max(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in a)
        print(f"largest relative loss difference: {worst:.3g}")
        assert worst <= 1e-6, (a, b)
    else:
        assert a == b  # bitwise
