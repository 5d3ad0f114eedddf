"""Losing a rank and training on (fault.enable; docs/fault-tolerance.md), four CPU ranks over Gloo
driving the real binaries:
- a rank SIGKILLed at a random step: the three others regroup within 30 s, train to the end, and end
  bitwise equal (weights, AdamW state, every loss after the loss) to a run that stopped at that step and
  was restarted on three ranks from its checkpoint;
- a rank SIGSTOPped: detected and isolated within fault.comm_timeout_s + fault.heartbeat_timeout_s (plus
  5 s for the regroup itself); once continued, it learns that it was left out and exits with that message;
  started again and never taken back, it is told that the job ended and exits 0;
- the killed rank started again is taken back (`loongforge hot-rejoin --rank 2`, checked first: a rank
  that trains or has not registered is refused): four ranks again, the same state on every rank
  (SHA-256 of weights and AdamW state, logged by each), no step lost or repeated;
- kill/restart cycles with fault.auto_rejoin (5; 2 in the suite's form, with GCTS and the sharded optimizer):
  every one taken back, the same state on every rank after each change, rank 0's file descriptors, threads and memory bounded;
- with a sharded optimizer, a lost rank's share of the AdamW moments comes from the newest checkpoint: the
  run then equals, bitwise, a restart on three ranks from the agreed step's checkpoint with that share swapped in.
"""
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "control"))
from trainer_harness import CLI, DATA, MODEL, REPO, TRAIN, free_port  # noqa: E402

# micro-batch 2 x accumulation 3 x 4 ranks = 24 samples; on 3 ranks the accumulation becomes 4.
COMMON = ["trainer.micro_batch_size=2", "trainer.gradient_accumulation_steps=3", "run.threads=1",
          "run.deterministic=true", "logging.progress=lines", "logging.interval_steps=1",
          "checkpoint.interval_steps=1000000", "control.enable=false"]
# The drill on GPU ranks (NCCL, one GPU per rank: LOCAL_RANK), for a host with 4 GPUs; not run yet (no
# multi-GPU machine is lent to the project). The suite runs CPU ranks over Gloo.
if os.environ.get("LOONGFORGE_TEST_FAULT_DEVICE") == "cuda":
    COMMON += ["run.device=cuda", "trainer.compiled_step=off"]
# The timeouts of these tests (small, so that each finishes in seconds).
COMM_TIMEOUT_S, HEARTBEAT_S, HEARTBEAT_TIMEOUT_S = 8, 0.2, 3
FAULT = ["fault.enable=true", f"fault.comm_timeout_s={COMM_TIMEOUT_S}", f"fault.heartbeat_s={HEARTBEAT_S}",
         f"fault.heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S}"]
STEPS = 24


def launch(out, world, name, *sets, steps=STEPS, port=None, ranks=None, env=None):
    """Starts ranks `ranks` (all of `world` by default) of one job; a rank started again (same port, same
    arguments) is a restarted process of that job. Logs append to out/<name>-rank<r>.log. `env`: more
    environment variables for these ranks."""
    Path(out).mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    procs = {}
    for r in ranks if ranks is not None else range(world):
        rank_env = dict(os.environ, WORLD_SIZE=str(world), RANK=str(r), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port), **(env or {}))
        cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
               "--set", f"data.path={DATA}", "--set", f"run.output_dir={out}", "--set", f"run.name={name}",
               "--set", f"trainer.max_steps={steps}"]
        for s in COMMON + list(sets):
            cmd += ["--set", s]
        log = open(Path(out) / f"{name}-rank{r}.log", "a")
        procs[r] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=rank_env)
    launch.port = port
    return procs


def log_of(out, name, r):
    return (Path(out) / f"{name}-rank{r}.log").read_text()


def stacks_of(pid):
    """Every thread's stack of process `pid` (gdb, where the machine has it): what a hung rank waits on."""
    try:
        return subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt 30"], capture_output=True,
                              text=True, timeout=90).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no stacks: {e})"


def wait_ok(procs, out, name, ranks, timeout=240):
    """Waits for `ranks` to exit 0. A rank still running after `timeout` s fails the test with every rank's log
    and the hung ranks' thread stacks (then they are killed), so an intermittent hang can be read afterwards."""
    t_end, codes = time.time() + timeout, {}
    for r in ranks:
        try:
            codes[r] = procs[r].wait(timeout=max(1.0, t_end - time.time()))
        except subprocess.TimeoutExpired:
            codes[r] = None
    hung = [r for r in ranks if codes[r] is None]
    stacks = {r: stacks_of(procs[r].pid) for r in hung}
    for r in hung:
        procs[r].kill()
        procs[r].wait()
    report = "\n".join(f"==== {name} rank {r} (exit {codes[r]}) ====\n" + log_of(out, name, r)[-6000:] +
                        (f"\n==== its stacks ====\n{stacks[r]}" if r in stacks else "") for r in ranks)
    assert not hung, f"rank(s) {hung} still running {timeout} s later\n{report}"
    assert all(c == 0 for c in codes.values()), (codes, report)


def records(run):
    return [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]


def wait_for_steps(run, n, procs, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if (run / "metrics.jsonl").exists() and sum("loss" in r for r in records(run)) >= n:
            return
        assert all(p.poll() is None for p in procs.values()), "a rank exited early"
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} steps after {timeout} s")


def wait_for_line(path, text, timeout, count=1):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if Path(path).read_text().count(text) >= count:
            return time.time()
        time.sleep(0.05)
    raise AssertionError(f"'{text}' not in {path} after {timeout} s:\n" + Path(path).read_text()[-3000:])


def final_checkpoint(run):
    from safetensors.torch import load_file
    ckpt = max((run / "checkpoints").iterdir(), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    return ckpt, load_file(str(ckpt / "model.safetensors")), load_file(str(ckpt / "optimizer/rank_00000.safetensors"))


def test_a_killed_rank_is_isolated_and_the_survivors_end_equal_to_a_restart_from_that_step(tmp_path):
    kill_after = random.Random().randint(3, 10)  # a random step; printed, so a failure can be replayed
    victim = 2
    print(f"SIGKILL rank {victim} once {kill_after} steps are logged")
    procs = launch(tmp_path, 4, "fault", *FAULT)
    run = tmp_path / "fault"
    wait_for_steps(run, kill_after, procs)
    t_kill = time.time()
    procs[victim].send_signal(signal.SIGKILL)
    t_back = wait_for_line(tmp_path / "fault-rank0.log", "lost rank(s) 2", timeout=60)
    print(f"the three survivors regrouped {t_back - t_kill:.1f} s after the kill")
    assert t_back - t_kill <= 30
    wait_ok(procs, tmp_path, "fault", [0, 1, 3])
    recs = records(run)
    events = [r for r in recs if "event" in r]
    assert len(events) == 1 and events[0]["event"] == "regrouped" and events[0]["lost"] == [victim]
    assert events[0]["members"] == [0, 1, 3] and events[0]["world"] == 3 and events[0]["accumulation"] == 4
    S = events[0]["step"]  # steps every survivor had applied: the run continues with step S + 1
    losses = {r["step"]: r["loss"] for r in recs if "loss" in r}
    assert sorted(losses) == list(range(1, STEPS + 1))  # no step lost or repeated
    assert all(math.isfinite(v) for v in losses.values())
    for r in (1, 3):
        assert "is now rank" in log_of(tmp_path, "fault", r)

    # The same job stopped after step S, restarted on three ranks from its checkpoint.
    wait_ok(launch(tmp_path, 4, "restart", f"trainer.steps_per_run={S}"), tmp_path, "restart", range(4))
    wait_ok(launch(tmp_path, 3, "restart", "checkpoint.resume=latest"), tmp_path, "restart", range(3))
    again = {r["step"]: r["loss"] for r in records(tmp_path / "restart") if "loss" in r}
    assert [losses[s] for s in range(S + 1, STEPS + 1)] == [again[s] for s in range(S + 1, STEPS + 1)]
    ca, wa, oa = final_checkpoint(run)
    cb, wb, ob = final_checkpoint(tmp_path / "restart")
    assert ca.name == cb.name and ca.name.endswith(f"_step_{STEPS}")
    assert list(wa) == list(wb) and all(wa[k].equal(wb[k]) for k in wa)
    assert list(oa) == list(ob) and all(oa[k].equal(ob[k]) for k in oa)


def test_a_stopped_rank_is_detected_and_isolated_within_the_timeouts_and_told_it_was_left_out(tmp_path):
    procs = launch(tmp_path, 4, "stop", *FAULT, "fault.auto_rejoin=false", steps=2000)  # ended by SIGTERM
    port = launch.port
    wait_for_steps(tmp_path / "stop", 4, procs)
    t_stop = time.time()
    procs[3].send_signal(signal.SIGSTOP)
    bound = COMM_TIMEOUT_S + HEARTBEAT_TIMEOUT_S + 5
    t_back = wait_for_line(tmp_path / "stop-rank0.log", "lost rank(s) 3", timeout=bound + 30)
    print(f"a stopped rank was isolated {t_back - t_stop:.1f} s after SIGSTOP (bound {bound} s)")
    assert t_back - t_stop <= bound
    assert "its heartbeat stood still" in log_of(tmp_path, "stop", 0)
    procs[3].send_signal(signal.SIGCONT)
    assert procs[3].wait(timeout=120) != 0
    assert "was left out of the job" in log_of(tmp_path, "stop", 3)
    # Started again, it registers to rejoin; nobody takes it back (fault.auto_rejoin=false, no hot-rejoin),
    # and when the job ends it is told so and ends with status 0 instead of failing on the lost store.
    procs.update(launch(tmp_path, 4, "stop", *FAULT, "fault.auto_rejoin=false", steps=2000, port=port, ranks=[3]))
    wait_for_line(tmp_path / "stop-rank3.log", "registered to rejoin", timeout=60)
    for r in (0, 1, 2):
        procs[r].send_signal(signal.SIGTERM)
    wait_ok(procs, tmp_path, "stop", range(4), timeout=120)
    assert "before this rank was taken back: nothing to rejoin" in log_of(tmp_path, "stop", 3)


def digests(text, marker):
    """The 'state sha256 X' of every line of `text` containing `marker`."""
    return [l.rsplit("state sha256 ", 1)[1].split()[0] for l in text.splitlines() if marker in l and "state sha256" in l]


def test_a_killed_rank_started_again_is_taken_back_by_hot_rejoin_with_the_state_of_its_peers(tmp_path):
    sock = f"control.socket={tmp_path}/ctl{{rank}}/s.sock"
    procs = launch(tmp_path, 4, "back", *FAULT, "fault.auto_rejoin=false", "control.enable=true", sock, steps=40)
    port, run = launch.port, tmp_path / "back"
    wait_for_steps(run, 4, procs)
    procs[2].send_signal(signal.SIGKILL)
    procs[2].wait()
    wait_for_line(tmp_path / "back-rank0.log", "lost rank(s) 2", timeout=60)
    via_rank1 = ["--socket", f"{tmp_path}/ctl1/s.sock"]
    r = subprocess.run([CLI, "hot-rejoin", "--rank", "1", *via_rank1], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "rank 1 is not lost: it trains (lost: 2)" in r.stderr, r.stderr
    r = subprocess.run([CLI, "hot-rejoin", "--rank", "2", *via_rank1], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "rank 2 has not registered to rejoin" in r.stderr, r.stderr
    procs.update(launch(tmp_path, 4, "back", *FAULT, "fault.auto_rejoin=false", "control.enable=true", sock,
                        steps=40, port=port, ranks=[2]))
    wait_for_line(tmp_path / "back-rank2.log", "registered to rejoin", timeout=60)
    r = subprocess.run([CLI, "hot-rejoin", "--rank", "2", *via_rank1], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and '"admitting": 2' in r.stdout, r.stdout + r.stderr
    wait_ok(procs, tmp_path, "back", range(4))
    recs = records(run)
    events = [e for e in recs if "event" in e]
    assert [e["event"] for e in events] == ["regrouped", "rejoined"]
    assert events[1]["rejoined"] == [2] and events[1]["world"] == 4 and events[1]["accumulation"] == 3
    losses = {e["step"]: e["loss"] for e in recs if "loss" in e}
    assert sorted(losses) == list(range(1, 41)) and all(math.isfinite(v) for v in losses.values())
    # Every rank holds the same weights and AdamW state after the rejoin (SHA-256 logged by each).
    after = [digests(log_of(tmp_path, "back", r), "took back rank(s) 2") for r in (0, 1, 3)]
    after.append(digests(log_of(tmp_path, "back", 2), "rejoined at step"))
    assert all(len(d) == 1 for d in after) and len({d[0] for d in after}) == 1, after
    print(f"rejoined at step {events[1]['step']} in {events[1]['rejoin_s']:.2f} s; state sha256 {after[0][0]}")


def fds_threads_rss(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    field = dict(l.split(":", 1) for l in status.splitlines() if ":" in l)
    return len(os.listdir(f"/proc/{pid}/fd")), int(field["Threads"]), int(field["VmRSS"].split()[0]) // 1024


CYCLES = int(os.environ.get("LOONGFORGE_TEST_FAULT_CYCLES", "5"))  # the suite runs 2 (time), the long form 5
GCTS = os.environ.get("LOONGFORGE_TEST_FAULT_GCTS") == "1"  # the suite's form: gcts.enable, shard_optimizer


def test_kill_and_restart_cycles_are_taken_back_with_bounded_descriptors_threads_and_memory(tmp_path):
    sets = ["fault.enable=true", "fault.comm_timeout_s=5", f"fault.heartbeat_s={HEARTBEAT_S}",
            "fault.heartbeat_timeout_s=2", "fault.auto_rejoin=true"]
    if GCTS:  # the suite's form: GCTS's reducer (its plan made again at every change) and the sharded optimizer
        sets += ["gcts.enable=true", "gcts.shard_optimizer=true"]  # (no checkpoint: a lost share starts from zeros)
    procs = launch(tmp_path, 4, "cycles", *sets, steps=2000)
    port, run = launch.port, tmp_path / "cycles"
    wait_for_steps(run, 3, procs)
    seen = []
    for cycle in range(1, CYCLES + 1):
        victim = 1 + cycle % 3  # ranks 2, 3, 1, 2, 3: never rank 0, which serves the store
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
        wait_for_line(tmp_path / "cycles-rank0.log", f"lost rank(s) {victim} at step", timeout=60,
                      count=sum(1 + c % 3 == victim for c in range(1, cycle + 1)))
        procs.update(launch(tmp_path, 4, "cycles", *sets, steps=2000, port=port, ranks=[victim]))
        wait_for_line(tmp_path / "cycles-rank0.log", "took back rank(s)", timeout=90, count=cycle)
        seen.append(fds_threads_rss(procs[0].pid))
        print(f"cycle {cycle}: rank {victim} killed and taken back; rank 0 fds/threads/RSS MB {seen[-1]}")
    for p in procs.values():
        p.send_signal(signal.SIGTERM)
    for r, p in procs.items():
        assert p.wait(timeout=120) == 0, log_of(tmp_path, "cycles", r)[-3000:]
    # Bounded: the cycles after the first add at most 4 descriptors, 4 threads and 64 MB in all (measured
    # with 5 cycles: 30 descriptors and 15 threads after each, RSS 668 -> 683 MB). The sharded optimizer
    # assembles the full fp32 moments and weights at every change (3 x 4.9 M elements of n16-tiny, 59 MB, with
    # copies beside them) and the allocator keeps such peaks without growing from cycle to cycle: 200 MB there
    # (measured with 5 cycles: RSS 664, 664, 806, 806, 715 MB; with 2: +68 MB once in CI, -45 and +31 MB here).
    (f1, t1, m1), (fn, tn, mn) = seen[0], seen[-1]
    assert fn - f1 <= 4 and tn - t1 <= 4 and mn - m1 <= (200 if GCTS else 64), seen
    events = [e for e in records(run) if "event" in e]
    assert [e["event"] for e in events] == ["regrouped", "rejoined"] * CYCLES
    # After every change every rank holds the same weights and AdamW state (the SHA-256 each logs): three
    # survivors after a regroup (odd generations), four ranks after a rejoin (even ones). A killed process's
    # last lines can be lost with it (its output is buffered): the last rejoin's four are all there.
    by_generation = {}
    for r in range(4):
        for line in log_of(tmp_path, "cycles", r).splitlines():
            if "state sha256" in line and "(generation " in line:
                g = int(line.split("(generation ", 1)[1].split(")")[0])
                by_generation.setdefault(g, []).append(line.rsplit("state sha256 ", 1)[1].split()[0])
    assert sorted(by_generation) == list(range(1, 2 * CYCLES + 1)), sorted(by_generation)
    assert all(len(set(v)) == 1 for v in by_generation.values()), by_generation
    assert len(by_generation[2 * CYCLES]) == 4, by_generation


def replace_in_checkpoint(ckpt, rel, source):
    """ckpt/rel <- source's bytes, its MANIFEST.json entry made to match (size and chunk SHA-256s)."""
    import hashlib
    data = Path(source).read_bytes()
    (ckpt / rel).write_bytes(data)
    m = json.loads((ckpt / "MANIFEST.json").read_text())
    e = m["files"][rel]
    e["bytes"] = len(data)
    if "chunk_sha256" in e:
        c = e["chunk_bytes"]
        e["chunk_sha256"] = [hashlib.sha256(data[i:i + c]).hexdigest() for i in range(0, len(data), c)]
    else:
        e["sha256"] = hashlib.sha256(data).hexdigest()
    (ckpt / "MANIFEST.json").write_text(json.dumps(m))


def checkpoint_files(ckpt):
    from safetensors.torch import load_file
    return {f.relative_to(ckpt).as_posix(): load_file(str(f)) for f in sorted(ckpt.rglob("*.safetensors"))}


def test_with_a_sharded_optimizer_the_lost_ranks_moments_come_from_the_newest_checkpoint(tmp_path):
    """gcts.shard_optimizer: each rank holds a quarter of the AdamW moments. After rank 2 is lost, the survivors
    keep their own quarters and take rank 2's from the newest checkpoint: the run then equals, bitwise, the
    same job stopped at the agreed step, its checkpoint's rank-2 shard swapped for that older checkpoint's,
    and resumed on three ranks."""
    sharded = ["gcts.enable=true", "gcts.shard_optimizer=true", "checkpoint.interval_steps=3", "checkpoint.keep_last=20"]
    # Rank 2 ends at the start of its backward of step K (the hook LOONGFORGE_TEST_FAULT=exit:...): the others
    # fail in that step's reduce-scatter, before any rank updated anything (a random SIGKILL, as in the cycles
    # test, may land after an update, where the lost range misses that update and no restart equals it).
    K = random.Random().randint(8, 12)
    print(f"sharded optimizer: rank 2 ends in the backward of step {K}")
    procs = launch(tmp_path, 4, "shard", *FAULT, "fault.auto_rejoin=false", *sharded, ranks=[0, 1, 3])
    # Rank 2's checkpoint writes are slowed (4 s per file), so it ends with the shard of the last checkpoint before
    # K unwritten: rank 0's write of that checkpoint, waiting for it, must fail at the regroup, not hold rank 0
    # (which once hung the survivors: they timed out on rank 0 in their next step and ended).
    procs.update(launch(tmp_path, 4, "shard", *FAULT, "fault.auto_rejoin=false", *sharded, port=launch.port,
                        ranks=[2], env={"LOONGFORGE_TEST_FAULT": f"exit:backward@{K}",
                                        "LOONGFORGE_TEST_CHECKPOINT_DELAY_MS": "4000"}))
    run = tmp_path / "shard"
    assert procs[2].wait(timeout=120) == 137, log_of(tmp_path, "shard", 2)[-2000:]
    wait_ok(procs, tmp_path, "shard", [0, 1, 3])
    events = [r for r in records(run) if "event" in r]
    assert len(events) == 1 and events[0]["lost"] == [2] and events[0]["world"] == 3, events
    assert events[0]["step"] == K - 1 and events[0]["abandoned_gathers"] == 0, events
    S, moments = events[0]["step"], events[0]["optimizer_moments"]
    C = moments["lost_from_step"]
    assert 3 <= C <= S and C % 3 == 0 and moments["lost_from"].endswith(f"epoch_0_step_{C}"), moments
    print(f"regrouped at step {S}; rank 2's moments from the checkpoint of step {C}; {moments}")
    assert "come from" in log_of(tmp_path, "shard", 0)
    assert f"checkpoint at step {C + 3} abandoned" in log_of(tmp_path, "shard", 0), "the write waiting for rank 2"
    assert "will not arrive: rank(s) 2 were lost" in log_of(tmp_path, "shard", 0)
    losses = {r["step"]: r["loss"] for r in records(run) if "loss" in r}
    assert sorted(losses) == list(range(1, STEPS + 1)) and all(math.isfinite(v) for v in losses.values())

    # The same job stopped at step S on four ranks; its rank-2 shard swapped for the one of step C; resumed on three.
    wait_ok(launch(tmp_path, 4, "swap", *sharded, f"trainer.steps_per_run={S}"), tmp_path, "swap", range(4))
    ckpt = tmp_path / "swap" / "checkpoints" / f"epoch_0_step_{S}"
    replace_in_checkpoint(ckpt, "optimizer/rank_00002.safetensors",
                          run / "checkpoints" / f"epoch_0_step_{C}" / "optimizer" / "rank_00002.safetensors")
    wait_ok(launch(tmp_path, 3, "swap", *sharded, "checkpoint.resume=latest"), tmp_path, "swap", range(3))
    again = {r["step"]: r["loss"] for r in records(tmp_path / "swap") if "loss" in r}
    assert [losses[s] for s in range(S + 1, STEPS + 1)] == [again[s] for s in range(S + 1, STEPS + 1)]
    a = checkpoint_files(run / "checkpoints" / f"epoch_0_step_{STEPS}")
    b = checkpoint_files(tmp_path / "swap" / "checkpoints" / f"epoch_0_step_{STEPS}")
    assert list(a) == list(b) and len(a) == 4, list(a)  # the weights and three optimizer shards
    assert all(list(a[f]) == list(b[f]) and all(a[f][k].equal(b[f][k]) for k in a[f]) for f in a)
