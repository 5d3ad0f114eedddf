"""scripts/slurm/single-node.sbatch on a real Slurm (a private one on this
machine: slurm_cluster.py), 2 CPU tasks through Gloo, n16-tiny:

- submitted with sbatch, it trains to the end (the job COMPLETES, srun's tasks
  read SLURM_PROCID/SLURM_NTASKS, the rendezvous is the first host of
  `scontrol show hostnames`);
- preempted: SIGUSR1 to the batch shell (`scancel --signal=USR1 --batch`, what
  `#SBATCH --signal=B:USR1@120` sends before the time limit) makes every rank
  write a preemption save (CRC-32 chunks, timed from the signal against
  checkpoint.preempt_lead_s, recorded in preemption.json) and exit 75, the
  script requeues the job, the requeued job verifies the save before it
  trains (its manifest then lists SHA-256s), resumes with `--resume latest`
  and finishes with the losses, weights and optimizer state of the
  uninterrupted job, bitwise;
- fault-tolerant (fault.enable=true): task 1's trainer SIGKILLed after step
  5; rank 0 trains on alone, the task starts the trainer again
  (scripts/slurm/task.sh), it is taken back (fault.auto_rejoin) with rank 0's
  state, and the job COMPLETES with every step logged once.

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_DATASET,
LOONGFORGE_TEST_MODELS. Skips only when this machine cannot run Slurm at all
(not root, or the packages cannot be installed); CI=true makes that a failure.
"""
import json
import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "comm"))
sys.path.insert(0, str(HERE.parent / "control"))
from slurm_cluster import SlurmCluster, unavailable_reason  # noqa: E402
from test_multi_rank import final_checkpoint, losses, max_rel_diff  # noqa: E402
from trainer_harness import DATA, MODEL, REPO, TRAIN  # noqa: E402

STEPS = int(os.environ.get("LOONGFORGE_SLURM_STEPS", "30"))
STOP_AFTER = STEPS // 3  # the preempted job gets SIGUSR1 once this many steps are logged


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"this machine cannot run Slurm: {reason}")
    t0 = time.time()
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        print(f"\nprivate Slurm up in {time.time() - t0:.1f} s (node {cluster.node_name})")
        yield cluster


def submit(slurm, out, name, *extra_sbatch, sets=()):
    """single-node.sbatch with 2 CPU tasks training n16-tiny (and `sets`: more --set key=value); returns
    (job id, log path)."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"{name}.out"
    args = ["--job-name", name, "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1",
            "--time=10", f"--output={log}", f"--chdir={out}", *extra_sbatch,
            str(REPO / "scripts/slurm/single-node.sbatch"), *trainer_args(out, name)]
    for kv in sets:
        args += ["--set", kv]
    return slurm.sbatch(args, job_env()), log


def job_env(train=TRAIN):
    """The submitting environment: the repository and the trainer; no torchrun-style rank variables."""
    env = dict(os.environ, LOONGFORGE_HOME=str(REPO), LOONGFORGE_TRAIN=str(train))
    for v in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(v, None)
    return env


def trainer_args(out, name):
    """loongforge-train's arguments: n16-tiny for STEPS steps into out/name (test_multi_rank.launch's settings)."""
    return ["--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
            "--set", f"data.path={DATA}", "--set", f"run.output_dir={out}", "--set", f"run.name={name}",
            "--set", f"trainer.max_steps={STEPS}", "--set", "trainer.micro_batch_size=4",
            "--set", "run.threads=1", "--set", "run.deterministic=true", "--set", "logging.progress=lines",
            "--set", "checkpoint.interval_steps=1000000"]  # control socket: the per-process default


def completed(j):
    return j["JobState"] == "COMPLETED"


@pytest.fixture(scope="module")
def straight(slurm, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    t0 = time.time()
    job, log = submit(slurm, out, "straight")
    j = slurm.wait(job, completed, timeout=240, log=log)
    print(f"uninterrupted job: {time.time() - t0:.1f} s")
    return out / "straight", log, j


def test_the_single_node_script_trains_two_tasks_to_the_end(straight):
    run, log, j = straight
    text = log.read_text()
    assert j["ExitCode"] == "0:0" and j["Restarts"] == "0", j
    assert "2 task(s) on 1 node(s)" in text and "rendezvous 127.0.0.1:" in text, text
    assert "rank 1 of 2 joined (Slurm environment" in text, text
    assert "training ended with exit status 0" in text, text
    assert len(losses(run)) == STEPS
    ckpt, _, _ = final_checkpoint(run)
    assert ckpt.name.endswith(f"_step_{STEPS}")
    assert json.loads((ckpt / "MANIFEST.json").read_text())["world_size"] == 2


def test_usr1_before_the_time_limit_checkpoints_requeues_and_resumes_to_the_same_parameters(
        slurm, straight, tmp_path):
    t0 = time.time()
    job, log = submit(slurm, tmp_path, "preempted")
    run = tmp_path / "preempted"
    metrics = run / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= STOP_AFTER):
        assert time.time() - t0 < 180, f"no step {STOP_AFTER} after 180 s:\n{log.read_text() if log.exists() else ''}"
        assert slurm.job(job)["JobState"] in ("PENDING", "RUNNING"), slurm.job(job)
        time.sleep(0.5)
    slurm.scancel("--signal=USR1", "--batch", job)  # what #SBATCH --signal=B:USR1@120 delivers
    j = slurm.wait(job, lambda j: completed(j) and j["Restarts"] != "0", timeout=240, log=log)
    print(f"preempted + requeued job: {time.time() - t0:.1f} s")
    text = log.read_text()
    assert j["Restarts"] == "1" and j["ExitCode"] == "0:0", j
    assert "SIGUSR1 (time limit near, or scancel --signal=USR1)" in text, text
    assert "checkpointed for a requeue (exit 75): scontrol requeue" in text, text
    assert "(restart 1)" in text, text
    stopped = [int(l.split("at step ")[1].split(",")[0]) for l in text.splitlines()
               if "requeue requested (SIGUSR1): checkpointing at step" in l]
    assert len(stopped) == 2 and stopped[0] == stopped[1] and STOP_AFTER <= stopped[0] < STEPS, stopped  # both ranks
    assert f"resumed from {run}/checkpoints/epoch_0_step_{stopped[0]} at step {stopped[0]}" in text, text
    # The preemption save (Note [Preemption saves]): timed from the signal, verified by the requeued job.
    ckpt = run / "checkpoints" / f"epoch_0_step_{stopped[0]}"
    record = json.loads((run / "preemption.json").read_text())
    assert record["step"] == stopped[0] and record["checkpoint"] == str(ckpt), record
    assert record["timed_from"] == "the signal on rank 0" and 0 < record["save_s"] <= record["signal_to_durable_s"]
    print(f"preemption save under Slurm: {record['bytes'] / 1e6:.1f} MB written in {record['save_s']:.2f} s, "
          f"durable {record['signal_to_durable_s']:.2f} s after SIGUSR1")
    assert f"preemption save {ckpt}: " in text and "(checkpoint.preempt_lead_s)" in text, text
    assert f"verified preemption save {ckpt}: the CRC-32 of each of its" in text, text
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    assert manifest["verified"] is True and "chunk_sha256" in manifest["files"]["model.safetensors"]

    sl, pl = losses(straight[0]), losses(run)
    assert len(pl) == STEPS
    print(f"preempted at step {stopped[0]} of {STEPS}; max relative loss difference to the uninterrupted job "
          f"{max_rel_diff(sl, pl):.2e}")
    assert pl == sl  # bitwise: a resume on the same world size continues exactly
    ca, wa, oa = final_checkpoint(straight[0])
    cb, wb, ob = final_checkpoint(run)
    assert ca.name == cb.name
    assert list(wa) == list(wb) and all(wa[k].equal(wb[k]) for k in wa)
    assert list(oa) == list(ob) and all(oa[k].equal(ob[k]) for k in oa)


def trainer_pid(job, procid):
    """The pid of the loongforge-train process of Slurm task `procid` of `job` (read from /proc)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if not os.readlink(d / "exe").endswith("/loongforge-train"):
                continue
            env = dict(v.split("=", 1) for v in (d / "environ").read_bytes().decode(errors="replace").split("\0") if "=" in v)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == str(job) and env.get("SLURM_PROCID") == str(procid):
            return int(d.name)
    return None


def test_a_killed_task_of_a_fault_tolerant_job_is_started_again_taken_back_and_the_job_completes(slurm, tmp_path):
    steps = 2 * STEPS
    fault = ["fault.enable=true", "fault.comm_timeout_s=5", "fault.heartbeat_s=0.2", "fault.heartbeat_timeout_s=2",
             f"trainer.max_steps={steps}"]
    t0 = time.time()
    job, log = submit(slurm, tmp_path, "drill", sets=fault)
    run = tmp_path / "drill"
    metrics = run / "metrics.jsonl"
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
        assert time.time() - t0 < 180, f"no step 5 after 180 s:\n{log.read_text() if log.exists() else ''}"
        assert slurm.job(job)["JobState"] in ("PENDING", "RUNNING"), slurm.job(job)
        time.sleep(0.2)
    pid = trainer_pid(job, 1)
    assert pid, "no loongforge-train process of task 1 found in /proc"
    os.kill(pid, 9)  # one task's trainer killed: a crash, an OOM kill
    j = slurm.wait(job, completed, timeout=240, log=log)
    print(f"fault-tolerant job with task 1 killed: {time.time() - t0:.1f} s")
    text = log.read_text()
    assert j["ExitCode"] == "0:0" and j["Restarts"] == "0", j
    assert "fault.enable=true: a failed task does not end the job" in text, text
    assert "rank 1: the trainer was killed by signal 9; the other ranks go on without it: starting it again" in text, text
    recs = [json.loads(l) for l in metrics.read_text().splitlines()]
    events = [e for e in recs if "event" in e]
    assert [e["event"] for e in events] == ["regrouped", "rejoined"], events
    assert events[0]["lost"] == [1] and events[0]["world"] == 1 and events[1]["world"] == 2, events
    loss = {e["step"]: e["loss"] for e in recs if "loss" in e}
    assert sorted(loss) == list(range(1, steps + 1)), sorted(loss)  # no step lost or repeated
    # Both ranks hold the same weights and AdamW state after the rejoin (SHA-256 logged by each).
    sha = [l.rsplit("state sha256 ", 1)[1].split()[0] for l in text.splitlines()
           if "state sha256" in l and ("took back rank(s) 1" in l or "rejoined at step" in l)]
    assert len(sha) == 2 and sha[0] == sha[1], sha
    ckpt, _, _ = final_checkpoint(run)
    assert ckpt.name.endswith(f"_step_{steps}")
    assert json.loads((ckpt / "MANIFEST.json").read_text())["world_size"] == 2
    print(f"regrouped at step {events[0]['step']}, rank 1 taken back at step {events[1]['step']} "
          f"({events[1]['rejoin_s']:.2f} s)")
