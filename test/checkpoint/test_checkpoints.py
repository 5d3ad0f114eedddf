"""Checkpoints never lose work (docs/checkpoints.md):
- a run stopped after 40 steps and resumed for 60 more matches 100 straight
  steps bit for bit (losses and final parameters; CPU, fp32, one rank);
- SIGKILL on observed progress (after a chosen step, or while a checkpoint
  write is in flight; LOONGFORGE_SIGKILL_KILLS times, 10 in the suite, 20
  under ctest -L long), each followed by --resume latest: writes go in 1 MiB
  chunks from 4 threads through 8 MiB of staging (smaller than the state), so
  kills land inside chunked parallel writes; every resume starts from the
  newest complete checkpoint (never a partial one), all but the first run
  resume from a checkpoint, several kills land inside a write and some while
  its chunks are being written, and the run ends with the uninterrupted
  parameters and losses;
- SIGKILL during a preemption save (SIGUSR1, then SIGKILL once its temporary
  directory appears, at different points of the write): the killed save is
  never taken for complete, every start resumes from the newest complete
  checkpoint, a preemption save that completes (exit 75) is verified at the
  next start, and the run ends bitwise equal to an uninterrupted one (30 steps);
- a checkpoint whose manifest is version 1 (one SHA-256 per file, as before
  chunked writes) validates and resumes bit for bit;
- a slow write shows its progress (bytes, rate, ETA) in the log and in
  `loongforge status`;
- a flipped byte, a truncated file, a missing file and a manifest from another
  run are each refused with a message naming the file; --resume latest skips
  them for the newest intact checkpoint;
- an incompatible checkpoint is refused with every difference listed;
- a full disk (a small tmpfs) fails the write, training continues, the
  failure is reported and earlier checkpoints stay intact;
- model.safetensors loads into the Python model of scripts/model by name.

Environment (ctest): LOONGFORGE_TRAIN, LOONGFORGE_CLI, LOONGFORGE_TEST_DATASET,
LOONGFORGE_TEST_MODELS, LOONGFORGE_SIGKILL_KILLS (default 10).
"""
import hashlib
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
CLI = os.environ.get("LOONGFORGE_CLI", str(REPO / "build/cli/loongforge"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"


def command(out, name, *sets):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml")]
    base = [f"model.path={MODEL}", f"data.path={DATA}", f"run.output_dir={out}", f"run.name={name}",
            "run.deterministic=true", "logging.progress=lines", "trainer.micro_batch_size=2", "data.shuffle=false",
            "checkpoint.interval_steps=5", "checkpoint.keep_last=3"]
    for s in base + list(sets):
        cmd += ["--set", s]
    return cmd


def train(out, name, *sets, check=True, env=None):
    r = subprocess.run(command(out, name, *sets), capture_output=True, text=True, env=env)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


def losses(run):
    return [json.loads(l)["loss"] for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]


def final_weights(run, step):
    return (run / f"checkpoints/epoch_0_step_{step}/model.safetensors").read_bytes()


def verified(path, entry):
    """A file against its manifest entry: its size, and the SHA-256 of each chunk (format 2) or of the whole,
    or a preemption save's CRC-32 of each chunk (format 3)."""
    data = path.read_bytes()
    if len(data) != entry["bytes"]:
        return False
    if "chunk_crc32" in entry:
        c = entry["chunk_bytes"]
        return [f"{zlib.crc32(data[i:i + c]):08x}" for i in range(0, len(data), c)] == entry["chunk_crc32"]
    if "chunk_sha256" in entry:
        c = entry["chunk_bytes"]
        return [hashlib.sha256(data[i:i + c]).hexdigest() for i in range(0, len(data), c)] == entry["chunk_sha256"]
    return hashlib.sha256(data).hexdigest() == entry["sha256"]


def newest_complete(ckpts):
    """Independent of the trainer: the newest directory whose manifest verifies."""
    best = None
    for d in ckpts.glob("epoch_*_step_*"):
        m = d / "MANIFEST.json"
        try:
            files = json.loads(m.read_text())["files"]
            ok = all(verified(d / f, e) for f, e in files.items())
        except (OSError, ValueError, KeyError):
            ok = False
        step = int(d.name.split("_")[-1])
        if ok and (best is None or step > best[0]):
            best = (step, d)
    return best


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    train(out, "s", "trainer.max_steps=100")
    return out / "s"


def test_40_steps_then_resume_for_60_equals_100_straight_steps_bit_for_bit(straight, tmp_path):
    first = train(tmp_path, "r", "trainer.max_steps=100", "trainer.steps_per_run=40")
    assert "step 40/100" in first.stdout
    steps = [int(p.name.split("_")[-1]) for p in (tmp_path / "r/checkpoints").iterdir()]
    assert max(steps) == 40
    second = train(tmp_path, "r", "trainer.max_steps=100", "checkpoint.resume=latest")
    assert "resumed from" in second.stderr and "at step 40" in second.stderr
    assert losses(tmp_path / "r") == losses(straight)  # exact float equality, all 100 steps
    assert final_weights(tmp_path / "r", 100) == final_weights(straight, 100)
    opt = "checkpoints/epoch_0_step_100/optimizer/rank_00000.safetensors"
    assert (tmp_path / "r" / opt).read_bytes() == (straight / opt).read_bytes()


class Watched:
    """A training run whose output is read as it happens (stdout lines into a
    queue, stderr kept whole), so a test can act on what the run has done."""

    def __init__(self, cmd, env):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.stdout = queue.Queue()
        self.stderr = []
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout.put)),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr.append))]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, put):
        for line in stream:
            put(line)

    def kill_when(self, target, ckpts, deadline_s, settle_s=0.0):
        """SIGKILLs the run once `target` is observed: ("step", N) after the
        progress line of step N or later with no write of this run in
        flight, ("write", None) while one of this
        run's checkpoint writes is in flight (its temporary directory
        .<name>.tmp-<pid> exists), `settle_s` later (so that the kill
        lands at different points of the write). Returns the last step seen."""
        kind, step = target
        in_flight = f".*.tmp-{self.proc.pid}"
        seen = 0
        deadline = time.monotonic() + deadline_s
        while True:
            writing = any(ckpts.glob(in_flight))
            if kind == "write" and writing:
                break
            # A step kill waits until no write of this run is in flight, so the
            # checkpoint the run passed is complete and the next run resumes
            # from it (on a fast machine the kill otherwise lands in that write).
            if kind == "step" and seen >= step and not writing:
                break
            try:
                m = re.match(r"step (\d+)/", self.stdout.get(timeout=0.002))
                seen = int(m.group(1)) if m else seen
            except queue.Empty:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended (exit {self.proc.returncode}) before its kill target {target}, "
                                     f"last step {seen}: {''.join(self.stderr)[-2000:]}")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"kill target {target} not reached in {deadline_s} s (last step {seen})")
        time.sleep(settle_s)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        for t in self._readers:
            t.join()
        return seen


KILLS = int(os.environ.get("LOONGFORGE_SIGKILL_KILLS", "10"))  # ctest: 10; 20 under the long label
MIN_KILLS_INSIDE_A_WRITE = max(4, KILLS // 4)
RUN_DEADLINE_S = 120  # one killed run: a target not reached by then fails the test instead of hanging it


def test_sigkill_on_observed_progress_always_resumes_from_the_newest_complete_checkpoint(straight, tmp_path):
    """KILLS runs of 100 steps are SIGKILLed, each followed by --resume latest;
    half of them after a chosen step, half while a checkpoint write is in
    flight. The targets are observed in the run's output and checkpoint
    folder, not guessed from the clock, so a slow machine only makes it slower."""
    rng = random.Random(1234)
    # Widen the write window: each file waits 60 ms before it is written, each 1 MiB chunk 10 ms.
    env = dict(os.environ, LOONGFORGE_TEST_CHECKPOINT_DELAY_MS="60", LOONGFORGE_TEST_CHECKPOINT_CHUNK_DELAY_MS="10")
    run = tmp_path / "k"
    ckpts = run / "checkpoints"
    # Chunked parallel writes through staging smaller than the state (about 65 MB): the step waits for the chunks.
    cmd = command(tmp_path, "k", "trainer.max_steps=100", "checkpoint.resume=latest", "logging.interval_steps=1",
                  "checkpoint.chunk_mb=1", "checkpoint.write_threads=4", "checkpoint.staging_mb=8")
    tally = {"kills": 0, "aimed_at_a_step": 0, "aimed_at_a_write": 0, "kills_inside_a_write": 0,
             "kills_while_chunks_were_written": 0, "fresh_starts": 0, "resumed_from_checkpoint": 0,
             "killed_at_steps": []}

    def started(err, expected):
        """Checks where a run started against the newest complete checkpoint
        found (independently) before it started."""
        m = re.search(r"resumed from (\S+) at step (\d+)", err)
        if expected is None:
            assert m is None, err[-2000:]
            tally["fresh_starts"] += 1
        else:
            assert m, f"no resume line although {expected[1]} is complete: {err[-2000:]}"
            assert Path(m.group(1)) == expected[1], (m.group(1), expected)
            tally["resumed_from_checkpoint"] += 1

    t0 = time.monotonic()
    for i in range(KILLS):
        expected = newest_complete(ckpts) if ckpts.exists() else None
        resume_step = expected[0] if expected else 0
        if i == 0:  # past the first checkpoint (step 5), so that the next run has one to resume from
            target = ("step", rng.randint(7, 9))
        elif i % 2:
            target = ("write", None)  # the next checkpoint this run writes (step 100 at the latest)
        else:
            # past the next checkpoint, so that each such kill moves the resume point on by 5 steps
            target = ("step", min(99, resume_step + 5 + rng.randint(1, 4)))
        tally["aimed_at_a_" + target[0]] += 1
        w = Watched(cmd, env)
        settle = rng.uniform(0.0, 0.2) if target[0] == "write" else 0.0
        tally["killed_at_steps"].append(w.kill_when(target, ckpts, RUN_DEADLINE_S, settle))
        tally["kills"] += 1
        left = list(ckpts.glob(f".*.tmp-{w.proc.pid}"))  # the temporary this kill left behind
        inside = len(left)
        tally["kills_inside_a_write"] += inside
        # Text files are written once every chunk is: without them the kill hit the chunked part.
        tally["kills_while_chunks_were_written"] += sum(
            1 for t in left if (t / "model.safetensors").exists() and not (t / "scheduler.json").exists())
        started("".join(w.stderr), expected)
        print(f"kill {i + 1}/{KILLS}: resumed at step {resume_step}, aimed at {target}, killed after step "
              f"{tally['killed_at_steps'][-1]}{', inside a write' if inside else ''} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    killing_s = time.monotonic() - t0

    expected = newest_complete(ckpts)
    last = train(tmp_path, "k", "trainer.max_steps=100", "checkpoint.resume=latest", env=env)
    started(last.stderr, expected)
    tally["seconds"] = round(killing_s, 1)
    print("crash tally:", json.dumps(tally))
    Path(os.environ.get("LOONGFORGE_TEST_MODELS", "/tmp")).joinpath("crash-tally.json").write_text(json.dumps(tally))
    assert not list(ckpts.glob(".*tmp*")), "stale temporaries are removed when a run starts"
    assert final_weights(run, 100) == final_weights(straight, 100)
    assert losses(run) == losses(straight)
    assert tally["fresh_starts"] <= 2, tally  # the first run, and at most one more (a kill inside the first write)
    assert tally["resumed_from_checkpoint"] >= KILLS - 1, tally  # most kills resume from a checkpoint
    assert tally["kills_inside_a_write"] >= MIN_KILLS_INSIDE_A_WRITE, tally
    assert tally["kills_while_chunks_were_written"] >= 2, tally


PREEMPT_KILLS = max(4, KILLS // 3)  # ctest: 4 (checkpoint_preempt_sigkill); 6 under the long label


def preempt_then_kill(w, step, ckpts, deadline_s, settle_s):
    """SIGUSR1 once the progress line of step `step` (or later) is seen with no write of this run in flight,
    then SIGKILL `settle_s` after a write's temporary appears (the preemption save's, unless a periodic write
    began before the signal took effect). Returns (the temporary's checkpoint name, or None if the run exited
    first; the step the run said it was saving)."""
    in_flight = f".*.tmp-{w.proc.pid}"
    seen = 0
    deadline = time.monotonic() + deadline_s
    while seen < step or any(ckpts.glob(in_flight)):
        try:
            m = re.match(r"step (\d+)/", w.stdout.get(timeout=0.002))
            seen = int(m.group(1)) if m else seen
        except queue.Empty:
            pass
        assert w.proc.poll() is None, f"the run ended (exit {w.proc.returncode}): {''.join(w.stderr)[-2000:]}"
        assert time.monotonic() < deadline, f"step {step} not reached in {deadline_s} s (last {seen})"
    w.proc.send_signal(signal.SIGUSR1)
    tmp = []
    while not tmp and w.proc.poll() is None:
        assert time.monotonic() < deadline, "no write after SIGUSR1"
        tmp = list(ckpts.glob(in_flight))
        time.sleep(0.002)
    time.sleep(settle_s)
    w.proc.send_signal(signal.SIGKILL)
    w.proc.wait()
    for t in w._readers:
        t.join()
    m = re.search(r"requeue requested \(SIGUSR1\): checkpointing at step (\d+)", "".join(w.stderr))
    return (tmp[0].name[1:].split(".tmp-")[0] if tmp else None), (int(m.group(1)) if m else None)


# Enough for the kills below (each aims at most 8 steps past the last complete checkpoint) and the completed
# save after them; fewer than `straight`'s 100 for time (30 ended the long form's sixth kill before its signal).
PREEMPT_STEPS = 8 * PREEMPT_KILLS + 12


@pytest.fixture(scope="module")
def straight40(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight40")
    train(out, "s", f"trainer.max_steps={PREEMPT_STEPS}")
    return out / "s"


def test_sigkill_during_a_preemption_save_never_leaves_it_taken_for_complete(straight40, tmp_path):
    """PREEMPT_KILLS runs get SIGUSR1 a few steps past their resume point and are SIGKILLed while the
    preemption save is being written (1 MiB chunks, each held 20 ms, from 4 threads through 8 MiB of
    staging); then one run whose preemption save completes (exit 75), and a last run to the end."""
    straight = straight40
    rng = random.Random(45)
    env = dict(os.environ, LOONGFORGE_TEST_CHECKPOINT_CHUNK_DELAY_MS="20")
    run = tmp_path / "q"
    ckpts = run / "checkpoints"
    cmd = command(tmp_path, "q", f"trainer.max_steps={PREEMPT_STEPS}", "checkpoint.resume=latest",
                  "logging.interval_steps=1", "checkpoint.chunk_mb=1", "checkpoint.write_threads=4",
                  "checkpoint.staging_mb=8")

    def resumed_from(err):
        m = re.search(r"resumed from (\S+) at step (\d+)", err)
        return (int(m.group(2)), Path(m.group(1))) if m else None

    killed_in_save = 0
    for i in range(PREEMPT_KILLS):
        expected = newest_complete(ckpts) if ckpts.exists() else None
        w = Watched(cmd, env)
        target = (expected[0] if expected else 0) + 6 + rng.randint(0, 2)
        name, saving = preempt_then_kill(w, target, ckpts, RUN_DEADLINE_S, rng.uniform(0.0, 0.25))
        err = "".join(w.stderr)
        assert resumed_from(err) == expected, (expected, err[-2000:])  # never a killed save
        left = ckpts / f".{name}.tmp-{w.proc.pid}"
        hit = saving is not None and name == f"epoch_0_step_{saving}" and left.exists()  # killed inside its save
        killed_in_save += hit
        complete = newest_complete(ckpts)
        if hit:  # the killed save is not complete; the newest complete one is older (or an earlier copy of it)
            assert complete is None or complete[0] < saving or (ckpts / name).is_dir(), (complete, name)
        print(f"preemption kill {i + 1}/{PREEMPT_KILLS}: resumed at {expected[0] if expected else 0}, SIGUSR1 "
              f"after step {target}, saving step {saving}, killed {'inside its save' if hit else 'elsewhere'} "
              f"(exit {w.proc.returncode})", flush=True)
    assert killed_in_save >= PREEMPT_KILLS - 1, killed_in_save

    # A preemption save that completes: exit 75, verified at the next start.
    expected = newest_complete(ckpts)
    w = Watched(cmd, env)
    seen = 0
    while seen < expected[0] + 4:
        m = re.match(r"step (\d+)/", w.stdout.get(timeout=RUN_DEADLINE_S))
        seen = int(m.group(1)) if m else seen
    w.proc.send_signal(signal.SIGUSR1)
    assert w.proc.wait(timeout=RUN_DEADLINE_S) == 75
    for t in w._readers:
        t.join()
    saved = json.loads((run / "preemption.json").read_text())
    assert saved["checkpoint"] and json.loads((Path(saved["checkpoint"]) / "MANIFEST.json").read_text())["verified"] is False
    assert saved["step"] < PREEMPT_STEPS, saved
    last = train(tmp_path, "q", f"trainer.max_steps={PREEMPT_STEPS}", "checkpoint.resume=latest", env=env)
    assert f"verified preemption save {saved['checkpoint']}" in last.stderr, last.stderr[-2000:]
    assert resumed_from(last.stderr) == (saved["step"], Path(saved["checkpoint"]))
    assert not list(ckpts.glob(".*tmp*")), "stale temporaries are removed when a run starts"
    assert final_weights(run, PREEMPT_STEPS) == final_weights(straight, PREEMPT_STEPS)
    assert losses(run) == losses(straight)


def as_version_1(ckpt):
    """Rewrites a checkpoint's manifest as the writer before chunked writes did: format_version 1, each file's
    size and the SHA-256 of the whole file (the files themselves are the same bytes)."""
    m = json.loads((ckpt / "MANIFEST.json").read_text())
    assert m["format_version"] == 2 and "chunk_sha256" in m["files"]["model.safetensors"]
    m["format_version"] = 1
    m["files"] = {f: {"bytes": e["bytes"], "sha256": hashlib.sha256((ckpt / f).read_bytes()).hexdigest()}
                  for f, e in m["files"].items()}
    (ckpt / "MANIFEST.json").write_text(json.dumps(m, indent=2) + "\n")


def test_a_version_1_checkpoint_validates_and_resumes_bit_for_bit(straight, tmp_path):
    ckpt = tmp_path / "old" / "epoch_0_step_90"
    shutil.copytree(straight / "checkpoints/epoch_0_step_90", ckpt)
    as_version_1(ckpt)
    v = subprocess.run([CLI, "validate-checkpoint", str(ckpt)], capture_output=True, text=True)
    assert v.returncode == 0 and "VALID" in v.stdout, v.stdout
    r = train(tmp_path, "v1", "trainer.max_steps=100", f"checkpoint.resume={ckpt}")
    assert "at step 90" in r.stderr
    assert final_weights(tmp_path / "v1", 100) == final_weights(straight, 100)
    assert losses(tmp_path / "v1")[-10:] == losses(straight)[-10:]
    # A flipped byte is still caught through the version 1 hash.
    f = ckpt / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 3] ^= 0x01
    f.write_bytes(bytes(data))
    v = subprocess.run([CLI, "validate-checkpoint", str(ckpt)], capture_output=True, text=True)
    assert v.returncode == 1 and f"{f}: SHA-256 differs from the manifest" in v.stdout


def test_a_slow_write_shows_its_progress_in_the_log_and_in_status(tmp_path):
    """The final checkpoint (about 65 MB) is written in 1 MiB chunks by one thread, each chunk held 100 ms:
    a write of about 7 s, longer than the writer's 5 s progress interval."""
    sock = tmp_path / "ctl.sock"
    env = dict(os.environ, LOONGFORGE_TEST_CHECKPOINT_CHUNK_DELAY_MS="100")
    w = Watched(command(tmp_path, "p", "trainer.max_steps=5", "checkpoint.interval_steps=1000",
                        "checkpoint.chunk_mb=1", "checkpoint.write_threads=1", f"control.socket={sock}"), env)
    seen, text = None, ""
    deadline = time.monotonic() + 90
    while seen is None and w.proc.poll() is None and time.monotonic() < deadline:
        r = subprocess.run([CLI, "status", "--socket", str(sock), "--json"], capture_output=True, text=True)
        write = json.loads(r.stdout).get("checkpoint_write", {}) if r.returncode == 0 else {}
        if write.get("active") and 0 < write["bytes_written"] < write["bytes"]:
            seen = write
            text = subprocess.run([CLI, "status", "--socket", str(sock)], capture_output=True, text=True).stdout
        time.sleep(0.2)
    w.proc.wait(timeout=120)
    for t in w._readers:
        t.join()
    log = "".join(w.stderr)
    assert w.proc.returncode == 0, log[-2000:]
    assert seen is not None, "status never showed the write in flight"
    assert seen["name"] == "epoch_0_step_5" and seen["eta_s"] > 0 and seen["bytes"] > 60e6, seen
    assert re.search(r"writing +epoch_0_step_5: [\d.]+ of [\d.]+ GB \(\d+%\), [\d.]+ GB/s, ETA \d+:\d\d:\d\d", text), text
    lines = re.findall(r"checkpoint epoch_0_step_5: [\d.]+ of [\d.]+ MB written \(\d+%\), \d+ MB/s, ETA \d+ s", log)
    assert lines, log[-3000:]
    assert "checkpoint " + str(tmp_path / "p/checkpoints/epoch_0_step_5") in log  # and it completed


@pytest.fixture
def damaged(straight, tmp_path):
    """A copy of the straight run whose newest checkpoint we damage."""
    shutil.copytree(straight, tmp_path / "s")
    return tmp_path / "s" / "checkpoints" / "epoch_0_step_100"


def refused(tmp_path, ckpt, needle):
    r = train(tmp_path, "s", "trainer.max_steps=100", f"checkpoint.resume={ckpt}", check=False)
    assert r.returncode == 1, r.stdout[-500:]
    assert needle in r.stderr, r.stderr[-2000:]
    v = subprocess.run([CLI, "validate-checkpoint", str(ckpt)], capture_output=True, text=True)
    assert v.returncode == 1 and "INVALID" in v.stdout and needle in v.stdout
    latest = train(tmp_path, "s", "trainer.max_steps=100", "checkpoint.resume=latest")
    assert "epoch_0_step_95 at step 95" in latest.stderr  # the newest intact one


def test_a_flipped_byte_is_refused_naming_the_file(damaged, tmp_path):
    f = damaged / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    refused(tmp_path, damaged, f"{f}: SHA-256 differs from the manifest")


def test_a_truncated_file_is_refused_naming_the_file(damaged, tmp_path):
    f = damaged / "optimizer/rank_00000.safetensors"
    size = f.stat().st_size
    os.truncate(f, size // 3)
    refused(tmp_path, damaged, f"{f}: {size // 3} bytes, the manifest says {size}")


def test_a_missing_file_is_refused_naming_the_file(damaged, tmp_path):
    (damaged / "scheduler.json").unlink()
    refused(tmp_path, damaged, f"{damaged / 'scheduler.json'}: missing")


def test_a_manifest_from_another_run_is_refused(damaged, tmp_path):
    other = train(tmp_path, "other", "trainer.max_steps=5", "optimizer.lr=0.001")
    shutil.copy(tmp_path / "other/checkpoints/epoch_0_step_5/MANIFEST.json", damaged / "MANIFEST.json")
    refused(tmp_path, damaged, f"{damaged / 'model.safetensors'}: SHA-256 differs from the manifest")


def test_an_incompatible_checkpoint_is_refused_listing_every_difference(straight, tmp_path):
    ckpt = straight / "checkpoints/epoch_0_step_90"
    r = train(tmp_path, "x", "trainer.max_steps=100", f"checkpoint.resume={ckpt}", "optimizer.lr=0.001",
              "trainer.micro_batch_size=4", check=False)
    assert r.returncode == 1
    assert "does not match this run" in r.stderr
    assert "config optimizer.lr: checkpoint 3.0e-04, now 0.001" in r.stderr
    assert "config trainer.micro_batch_size: checkpoint 2, now 4" in r.stderr
    assert "global batch: checkpoint 2, now 4" in r.stderr


def test_a_checkpoint_from_before_the_sampler_keys_resumes_as_the_uniform_order(straight, tmp_path):
    """Checkpoints written before data.sampler / open_episodes / shuffle_buffer were recorded trained
    with the uniform order: they resume under the defaults and are refused under another order."""
    shutil.copytree(straight, tmp_path / "old")
    ckpt = tmp_path / "old/checkpoints/epoch_0_step_90"
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    for key in ("data.sampler", "data.open_episodes", "data.shuffle_buffer"):
        del manifest["config"][key]
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))
    r = train(tmp_path, "x", "trainer.max_steps=100", f"checkpoint.resume={ckpt}", "data.shuffle=true",
              "data.sampler=episode", check=False)
    assert r.returncode == 1
    assert "config data.sampler: checkpoint uniform (written before the key existed), now episode" in r.stderr
    train(tmp_path, "y", "trainer.max_steps=100", f"checkpoint.resume={ckpt}")


def test_a_full_disk_fails_the_write_but_not_the_training(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the disk-full case was not exercised")
    try:
        # One checkpoint is 65 MB: the first fits, the next ones do not.
        r = train(tmp_path, "d", "trainer.max_steps=12", f"checkpoint.dir={mnt}/ckpt", check=False)
        assert r.returncode == 4, r.stderr[-2000:]
        assert len(losses(tmp_path / "d")) == 12  # every step trained
        assert "FAILED" in r.stderr and "No space left on device" in r.stderr
        assert [p.name for p in (mnt / "ckpt").iterdir()] == ["epoch_0_step_5"]  # no partial leftovers
        v = subprocess.run([CLI, "validate-checkpoint", str(mnt / "ckpt/epoch_0_step_5")], capture_output=True,
                           text=True)
        assert v.returncode == 0 and "VALID" in v.stdout
    finally:
        subprocess.run(["umount", str(mnt)])


def test_model_safetensors_loads_into_the_python_model_by_name(straight):
    sys.path.insert(0, str(REPO / "scripts"))
    import torch
    from safetensors.torch import load_file
    from model.config import ModelConfig
    from model.n16 import N16Model
    extra = {"loongforge/config.json": ""}
    torch.jit.load(str(MODEL), _extra_files=extra)
    cfg = ModelConfig.from_json(extra["loongforge/config.json"])
    model = N16Model(cfg)
    weights = load_file(str(straight / "checkpoints/epoch_0_step_100/model.safetensors"))
    result = model.load_state_dict(weights, strict=False)
    assert not result.unexpected_keys
    assert set(result.missing_keys) <= set(dict(model.named_buffers()))  # buffers are rebuilt, not saved
    assert set(weights) == set(dict(model.named_parameters()))
    assert all(torch.equal(p.detach(), weights[n]) for n, p in model.named_parameters())
