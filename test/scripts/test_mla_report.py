"""What this file proves: scripts/bench/mla_report.py, the half of issue #47's allocator comparison
(scripts/bench/mla_compare.sh) that runs no GPU, reads fake runs as it must read real ones:
- a run that finished its steps is ok, and its samples/s is the median of the steps after the warm-up,
  its peaks the largest nvidia-smi sample and the trainer's peak_mem_mb;
- an exit with the trainer's out-of-memory message is an out of memory, quoted; any other end (a config
  error, a signal from outside, a failure checkpoint the script stopped, an "out of memory" far above a
  different final error) is a failure and never an out of memory; a run past its own time limit is a
  timeout, one stopped by the call's limit is no result ("cut") and is run again;
- MLA's metrics.jsonl fields become cudaMalloc calls after step 1 (the last record's), the largest
  fragmentation after the warm-up and the allocation time's p50 / p99 by nearest rank;
- the ladder takes the first micro-batch from the top that trained, once every larger one has a final
  outcome, and marks a row whose larger micro-batch failed otherwise than out of memory;
- the bitwise check compares losses exactly and names the first step that differs;
- the report has one row per model and allocator, prints "not measured" for what did not run and
  sentences on the targets from measured figures only.
Fake runs are written the way mla_compare.sh leaves them: DIR/train.log, DIR/run/metrics.jsonl, DIR/smi.csv.
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
import mla_report  # noqa: E402

OOM_LOG = """[09:00:01.000] [loongforge.trainer] [info] run /tmp/x: gr00t-n1.7-3b on cuda:0 (bf16) ...
step 1/12  loss 1.2  lr 0  50.0 samples/s  data 3.0 ms  elapsed 0:30  ETA 0:10
[09:00:40.000] [loongforge.trainer] [error] step 2, phase backward (micro-batch 0) on rank 0 (cuda:0): out of memory: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free.
Memory: 76012 MB in use, 78100 MB reserved, 77000 MB peak on the device (PyTorch CUDA caching allocator); 30000 MB peak on the host.
To fit: lower trainer.micro_batch_size (now 32) and raise trainer.gradient_accumulation_steps (now 1) to keep the global batch, or use a smaller model.
loongforge-train: training_error: step 2, phase backward ...: out of memory: CUDA out of memory.
"""
CONFIG_ERROR_LOG = "loongforge-train: config_error: trainer.cuda_graphs=on needs run.device=cuda (the run is on cpu)\n"


def record(step, sps=100.0, peak_mb=50_000.0, **extra):
    r = {"step": step, "loss": 1.0 + step / 100, "grad_norm": 0.5, "samples_per_s": sps, "step_ms": 3200.0 / sps,
         "peak_mem_mb": peak_mb}
    r.update(extra)
    return r


def fake_run(d: Path, records, log="", smi=(1000, 50_000, 60_000, 55_000)):
    (d / "run").mkdir(parents=True, exist_ok=True)
    (d / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (d / "train.log").write_text(log)
    (d / "smi.csv").write_text("".join(f"{v}\n" for v in smi))
    return d


def finished(d: Path, steps=12, **kw):
    """A run of `steps` steps whose samples/s rises through the warm-up and then varies."""
    speeds = [10, 40, 80, 90, 95, 120, 118, 125, 119, 121, 200, 117][:steps]
    return fake_run(d, [record(i + 1, s, peak_mb=40_000 + i, **kw) for i, s in enumerate(speeds)])


def test_a_run_that_finished_its_steps_is_ok_with_the_median_after_warm_up_and_both_peaks(tmp_path):
    d = finished(tmp_path / "caching-mb32")
    res = mla_report.result_of_run(d, steps=12, warmup=5, limit_s=180, rc=None, stopped="after_last_step")
    assert res["outcome"] == "ok" and res["reason"] is None
    assert res["window"] == [6, 12] and res["window_steps"] == 7
    assert res["samples_per_s"] == statistics.median([120, 118, 125, 119, 121, 200, 117]) == 120
    assert res["peak_used_gib"] == 60_000 / 1024 and res["idle_used_gib"] == 1000 / 1024
    assert res["peak_allocated_gib"] == 40_011 / 1024
    assert res["mla"] is None  # the caching allocator writes no mla_* field


def test_too_few_steps_after_the_warm_up_give_no_samples_per_s_rather_than_a_guess(tmp_path):
    d = finished(tmp_path / "short", steps=7)
    res = mla_report.result_of_run(d, steps=7, warmup=5, limit_s=180, rc=None, stopped="after_last_step")
    assert res["outcome"] == "ok" and res["window_steps"] == 2 and res["samples_per_s"] is None


def test_an_exit_with_the_trainers_out_of_memory_message_is_an_out_of_memory_quoting_it(tmp_path):
    d = fake_run(tmp_path / "mla-mb32", [record(1)], log=OOM_LOG)
    res = mla_report.result_of_run(d, steps=12, warmup=5, limit_s=180, rc=1, stopped="")
    assert res["outcome"] == "oom"
    assert "step 2, phase backward" in res["reason"] and "Tried to allocate 2.00 GiB" in res["reason"]
    assert "Memory: 76012 MB in use, 78100 MB reserved" in res["reason"]
    assert res["steps"] == 1 and res["samples_per_s"] is None


def test_mlas_own_out_of_memory_and_a_cublas_allocation_failure_count_as_out_of_memory():
    mla = "MLA: out of memory: a request of 1.50 GiB (activation) does not fit in the other pool\n"
    assert mla_report.classify(0, 12, 1, "", mla, 180)[0] == "oom"
    assert mla_report.classify(3, 12, 1, "", "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate\n", 180)[0] == "oom"


def test_a_failure_that_is_not_out_of_memory_is_reported_as_such_and_never_counted_as_one():
    outcome, reason = mla_report.classify(0, 12, 1, "", CONFIG_ERROR_LOG, 180)
    assert outcome == "failed" and "config_error: trainer.cuda_graphs=on needs run.device=cuda" in reason
    # SIGKILL from outside (the host's OOM killer, say) is no device out-of-memory
    outcome, reason = mla_report.classify(4, 12, 137, "", "step 4/12 ...\n", 180)
    assert outcome == "failed" and "signal 9" in reason
    # a failure checkpoint the script stopped: the cause is not logged yet, so it is not guessed
    outcome, reason = mla_report.classify(3, 12, None, "failure_checkpoint", OOM_LOG, 180)
    assert outcome == "failed" and "not counted as out of memory" in reason
    # "out of memory" far above the end (a warning long before) does not make another error an OOM
    log = "warning: an earlier out of memory, recovered\n" + "step ...\n" * 100 + CONFIG_ERROR_LOG
    assert mla_report.classify(5, 12, 1, "", log, 180)[0] == "failed"
    # an OOM message with exit 0 (no failure) is not an out-of-memory end either
    assert mla_report.classify(5, 12, 0, "", OOM_LOG, 180) == ("failed", "exit 0 after 5 of 12 steps")


def test_a_run_past_its_own_limit_is_a_timeout_and_one_stopped_by_the_calls_limit_is_cut():
    assert mla_report.classify(4, 12, None, "time_limit", "", 180) == ("timeout", "4 of 12 steps within its 180 s")
    outcome, reason = mla_report.classify(4, 12, None, "call_limit", "", 60)
    assert outcome == "cut" and "run it again" in reason
    assert "cut" not in mla_report.FINAL_OUTCOMES  # so mla_compare.sh runs it again


def test_mlas_fields_give_cudamalloc_after_step_1_the_largest_fragmentation_and_alloc_ms_percentiles(tmp_path):
    alloc_ms = [5.0, 0.9, 0.5, 0.4, 0.3, 0.02, 0.01, 0.03, 0.04, 0.02, 0.06, 0.01]
    frag = [0.5, 0.2, 0.1, 0.1, 0.1, 0.01, 0.02, 0.015, 0.01, 0.01, 0.01, 0.005]
    recs = [record(i + 1, 100 + i, mla_cuda_malloc_after_step_1=0.0 if i < 11 else 2.0, mla_fragmentation=frag[i],
                   mla_alloc_ms=alloc_ms[i], mla_reserved_mb=70_000.0 + i, mla_persistent_mb=48_000.0,
                   mla_activation_mb=9_000.0, mla_other_mb=1_000.0) for i in range(12)]
    d = fake_run(tmp_path / "mla-mb32", recs)
    m = mla_report.result_of_run(d, steps=12, warmup=5, limit_s=180, rc=None, stopped="after_last_step")["mla"]
    assert m["cuda_malloc_after_step_1"] == 2.0  # cumulative: the last record's
    assert m["fragmentation_max"] == 0.02 and m["fragmentation_last"] == 0.005  # steps 6-12 only
    # steps 6-12: 0.02 0.01 0.03 0.04 0.02 0.06 0.01 -> sorted 0.01 0.01 0.02 0.02 0.03 0.04 0.06
    assert m["alloc_ms_p50"] == 0.02 and m["alloc_ms_p99"] == 0.06
    assert m["reserved_gib_max"] == 70_011 / 1024
    assert (m["persistent_mb"], m["activation_mb"], m["other_mb"]) == (48_000.0, 9_000.0, 1_000.0)


def res(outcome):
    return {"outcome": outcome}


def test_the_ladder_takes_the_first_micro_batch_from_the_top_that_trained():
    d = mla_report.ladder_decision([16, 32, 24], {32: res("oom"), 24: res("ok")})
    assert d["largest"] == 24 and d["settled"] and d["note"] is None
    assert d["rungs"] == [(32, "oom"), (24, "ok"), (16, "not needed")]


def test_a_larger_micro_batch_that_failed_otherwise_than_out_of_memory_marks_the_row():
    d = mla_report.ladder_decision([32, 24, 16], {32: res("failed"), 24: res("timeout"), 16: res("ok")})
    assert d["largest"] == 16 and "failed otherwise than out of memory" in d["note"]


def test_the_ladder_is_not_settled_while_a_larger_micro_batch_has_not_run_or_was_cut():
    d = mla_report.ladder_decision([32, 24], {32: res("cut"), 24: res("ok")})
    assert d["largest"] is None and not d["settled"] and "micro-batch 32 has no result yet" in d["note"]


def test_a_ladder_where_nothing_trained_is_settled_with_no_largest():
    d = mla_report.ladder_decision([32, 24], {32: res("oom"), 24: res("oom")})
    assert d["largest"] is None and d["settled"] and "add smaller ones" in d["note"]
    d = mla_report.ladder_decision([32, 24], {32: res("oom"), 24: res("failed")})
    assert d["largest"] is None and d["settled"] and "not all for lack of memory" in d["note"]


def test_the_bitwise_check_compares_losses_exactly_and_names_the_first_step_that_differs():
    base = [record(i) for i in range(1, 51)]
    assert mla_report.bitwise_verdict(base, [dict(r) for r in base], 50)["verdict"] == "equal"
    other = [dict(r) for r in base]
    other[29]["loss"] = base[29]["loss"] + 1e-12  # one ulp-sized change is a difference
    v = mla_report.bitwise_verdict(base, other, 50)
    assert v["verdict"] == "differ" and v["losses_equal"] == 49 and v["first_difference"]["step"] == 30
    assert "DIFFER" in mla_report.bitwise_text(v)
    assert mla_report.bitwise_verdict(base, other[:20], 50)["verdict"] == "incomplete"


def run_cli(d: Path, steps=12, rc="", stopped="after_last_step"):
    mla_report.main(["run", str(d), "--steps", str(steps), "--warmup", "5", "--limit-s", "180", "--rc", rc,
                     "--stopped", stopped])
    return json.loads((d / "result.json").read_text())


def test_the_report_has_one_row_per_model_and_allocator_and_prints_only_measured_figures(tmp_path, capsys):
    state, out = tmp_path / "state", tmp_path / "out"
    runs = state / "runs" / "gr00t-n1.7-3b"
    mla_fields = dict(mla_cuda_malloc_after_step_1=0.0, mla_fragmentation=0.01, mla_alloc_ms=0.02,
                      mla_reserved_mb=75_000.0, mla_persistent_mb=48_000.0, mla_activation_mb=20_000.0,
                      mla_other_mb=500.0)
    for alloc in ("caching", "expandable"):
        fake_run(runs / f"{alloc}-mb32", [record(1)], log=OOM_LOG)
        assert run_cli(runs / f"{alloc}-mb32", rc="1", stopped="")["outcome"] == "oom"
        finished(runs / f"{alloc}-mb24")
        run_cli(runs / f"{alloc}-mb24")
    finished(runs / "mla-mb32", **mla_fields)
    run_cli(runs / "mla-mb32")
    for alloc in ("caching", "mla"):  # the bitwise pair: equal losses
        fake_run(state / "bitwise" / alloc, [record(i) for i in range(1, 51)])
        run_cli(state / "bitwise" / alloc, steps=50)
    mla_report.main(["outcome", str(runs / "mla-mb32")])
    assert capsys.readouterr().out.splitlines()[-1] == "ok"

    mla_report.main(["report", str(state), "--ladder", "gr00t-n1.7-3b=32,24,16", "--ladder", "n16-3b=56,48",
                     "--out", str(out), "--meta", "GPU=NVIDIA H100 80GB HBM3"])
    md = (out / "mla_compare.md").read_text()
    assert md == capsys.readouterr().out  # printed as written
    rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    assert len(rows) == 6  # 2 models x 3 allocators
    cells = {tuple(r.split(" | ")[:2]): r.split(" | ") for r in rows}
    assert all(len(r.split(" | ")) == len(mla_report.HEADER) for r in rows)
    caching, mla = cells[("| gr00t-n1.7-3b", "caching")], cells[("| gr00t-n1.7-3b", "mla")]
    assert caching[2:5] == ["24", "120.0", "58.6"] and caching[7:10] == ["n/a"] * 3
    assert mla[2:5] == ["32", "120.0", "58.6"] and mla[7:10] == ["0", "0.0100", "0.0200 / 0.0200"]
    assert mla[10].startswith("equal: 50 of 50 losses") and caching[10] == "baseline"
    assert caching[-1] == "32 oom, 24 ok, 16 not needed |"
    n16 = cells[("| n16-3b", "mla")]
    assert "has no result yet" in n16[2] and n16[3:10] == ["not measured"] * 7
    assert "gr00t-n1.7-3b: MLA's largest micro-batch 32 is larger than the best of the other two (24)." in md
    assert "1.000x (matches or beats the best)" in md
    assert "cudaMalloc after step 1 0 (target 0: met); fragmentation at most 0.0100 (target <= 0.03: met)" in md
    assert "n16-3b: the comparison is not complete" in md
    assert "gr00t-n1.7-3b, caching, micro-batch 32: oom: [" in md and "Tried to allocate 2.00 GiB" in md
    rep = json.loads((out / "mla_compare.json").read_text())
    assert rep["meta"]["GPU"] == "NVIDIA H100 80GB HBM3" and rep["bitwise"]["verdict"] == "equal"
    assert rep["models"]["gr00t-n1.7-3b"]["allocators"]["expandable"]["decision"]["largest"] == 24
    assert rep["models"]["n16-3b"]["allocators"]["caching"]["best"] is None
