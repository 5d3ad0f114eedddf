"""trainer.micro_batch_size: auto on a GPU, through the real binaries (label
gpu; run on an H100 on 2026-12-07, where the step-down case ran out of
memory; the data source's terms sized as ADFE stages its micro-batches since
then are not yet run on a GPU: docs/mla.md's feature table says so).

- n16-tiny with a global batch of 256 and auto: the chosen micro-batch
  divides the global batch, the accumulation makes up the rest, the run
  trains, and the log line, summary.json and `loongforge status` (JSON and
  text) say the same choice.
- The same GPU made to look smaller (LOONGFORGE_TEST_CUDA_MEMORY_FRACTION,
  Note [Test memory fraction] in src/trainer/trainer_micro_batch.cpp): a
  budget between the predictions of the first run's choice and the next
  smaller candidate makes auto step down, and the smaller choice trains
  under that cap.

One rank: several ranks agreeing on the smallest choice share this code, but
only the plumbing is exercised here (the exchange itself is
World::all_gather_on_hosts, tested in test/comm).

Environment as in test/control/trainer_harness.py (set by ctest).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "control"))

from trainer_harness import DATA, MODEL, REPO, TRAIN, Trainer, cli  # noqa: E402

G = 256  # 2096 samples in the bundled dataset: 8 steps per epoch
GPU = ["run.device=cuda", "trainer.compiled_step=off",  # the TorchScript step the probes measure (no package compile)
       "trainer.micro_batch_size=auto", f"trainer.global_batch_size={G}"]
LINE = re.compile(r"trainer\.micro_batch_size auto: (\d+) of candidates [^;]*?\(global batch (\d+) = (\d+) x "
                  r"accumulation (\d+) x 1 rank\); predicted peak ([\d.]+ [MG]B), measured ([\d.]+ [MG]B) of "
                  r"([\d.]+ [MG]B)")


def train(out, *sets, env=None, steps=3):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={out}", "--set", "logging.progress=off",
           "--set", f"trainer.max_steps={steps}", "--set", "checkpoint.interval_steps=1000"]
    for s in [*GPU, *sets]:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def gb(text):
    value, unit = text.split()
    return float(value) / (1024.0 if unit == "MB" else 1.0)


def predicted_gb(auto, b):
    """The prediction at a micro-batch of b: the probes' line plus every term at b (a fixed part and a part
    per sample: the data source's micro-batches, Note [The data's device memory])."""
    return auto["intercept_gb"] + auto["per_sample_gb"] * b + sum(t["fixed_gb"] + t["per_sample_gb"] * b
                                                                  for t in auto["later"])


def test_auto_chooses_a_divisor_of_the_global_batch_trains_and_the_log_summary_and_status_agree(tmp_path):
    t = Trainer(tmp_path, *GPU, "logging.progress=off")
    try:
        t.wait_for_socket(timeout=300)
        during = t.wait_for_step(3, timeout=300)
        text = cli("status", "--socket", t.socket).stdout
        cli("stop", "--socket", t.socket)
        assert t.proc.wait(timeout=300) == 0, t.output()[-3000:]
    finally:
        t.kill()
    out = t.output()
    m = LINE.search(out)
    assert m, out[-5000:]
    print("the whole GPU:", m.group(0))  # kept in the GPU scripts' logs (ctest -V; PYTEST_ARGS -s)
    b, global_batch, b_again, k = (int(m.group(i)) for i in (1, 2, 3, 4))
    assert global_batch == G and b_again == b and G % b == 0 and b * k == G

    summary = json.loads((t.run_dir / "summary.json").read_text())
    mb = summary["micro_batch"]
    assert (mb["size"], mb["accumulation"]) == (b, k)
    auto = mb["auto"]
    assert auto["source"] == "probed" and auto["micro_batch"] == b and auto["rank_choices"] == [b]
    assert auto["candidates"] == sorted(auto["candidates"], reverse=True)
    assert all(G % c == 0 for c in auto["candidates"]) and b in auto["candidates"]
    assert any(p["micro_batch"] == b and not p["out_of_memory"] for p in auto["probes"])  # measured at its size
    assert auto["measured_gb"] <= auto["budget_gb"] < auto["capacity_gb"]
    assert abs(gb(m.group(7)) - auto["budget_gb"]) <= 0.06  # the log's budget, as rounded there
    assert any(term["name"] == "optimizer moments" and term["gb"] > 0 for term in auto["later"])
    # The data source's terms as ADFE (on by default on a GPU) stages them: its queue grows with the micro-batch.
    names = [term["name"] for term in auto["later"]]
    assert "the step's micro-batches" in names and "ADFE's ready micro-batches (prefetch_factor 4 + 1)" in names
    for term in auto["later"]:  # each term as logged, at the chosen micro-batch
        assert abs(term["gb"] - (term["fixed_gb"] + term["per_sample_gb"] * b)) < 1e-9
    assert abs(predicted_gb(auto, b) - auto["predicted_gb"]) < 1e-6
    # `status` said the same while it trained, in JSON and in its text.
    assert during["micro_batch"] == mb
    assert f"micro-batch {b} x accumulation {k} (auto: predicted" in text
    records = [json.loads(line) for line in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) >= 3 and all(r["num_valid"] > 0 for r in records)
    assert f"global batch {G} ({b} x {k} x 1 ranks, micro-batch chosen by auto)" in out


def test_a_gpu_made_smaller_makes_auto_step_down_and_the_smaller_choice_trains_under_the_cap(tmp_path):
    import torch  # the GPU machine's torch: the device's total memory, as c10's memory fraction counts it

    first = train(tmp_path / "first", steps=1)
    assert first.returncode == 0, first.stderr[-3000:]
    auto = json.loads((tmp_path / "first/n16-tiny-demo/summary.json").read_text())["micro_batch"]["auto"]
    top = auto["micro_batch"]
    smaller = [c for c in auto["candidates"] if c < top]
    assert smaller, f"the first run chose the smallest candidate, {top}: nothing to step down to"
    # A budget halfway between the predictions of the first choice and the next smaller candidate.
    budget_gb = (predicted_gb(auto, top) + predicted_gb(auto, smaller[0])) / 2
    total_gb = torch.cuda.mem_get_info()[1] / 2**30
    fraction = budget_gb / (1 - auto["headroom"]) / total_gb
    assert 0 < fraction < 1

    env = dict(os.environ, LOONGFORGE_TEST_CUDA_MEMORY_FRACTION=f"{fraction:.6f}")
    second = train(tmp_path / "second", env=env, steps=3)
    assert second.returncode == 0, second.stderr[-5000:]  # the smaller choice trains under the cap
    out = second.stdout + second.stderr
    m = LINE.search(out)
    assert m, out[-5000:]
    print(f"under a cap of {budget_gb / (1 - auto['headroom']):.3f} GB (fraction {fraction:.6f}):", m.group(0))
    small = json.loads((tmp_path / "second/n16-tiny-demo/summary.json").read_text())["micro_batch"]
    b = small["size"]
    assert int(m.group(1)) == b < top and G % b == 0
    assert small["auto"]["test_memory_fraction"] > 0
    assert small["auto"]["budget_gb"] < auto["budget_gb"]
    assert "LOONGFORGE_TEST_CUDA_MEMORY_FRACTION=" in out
    # The larger candidate it did not take is named with why (a prediction, or its probe).
    assert re.search(rf"; {small['auto']['larger']['micro_batch']} (predicted|measured|ran out of memory)", out), out
    records = [json.loads(line) for line in (tmp_path / "second/n16-tiny-demo/metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
