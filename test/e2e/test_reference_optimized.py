"""The reference trainer's optimized mode (torch.compile with CUDA graph trees, the strongest baseline
loongforge-train is measured against) trains with gradient accumulation as its eager baseline mode:
n16-tiny, bf16, 6 steps of 2 micro-batches on a GPU, every step's loss and gradient norm within 2%.
Without its kept gradients (scripts/reference/train_torch.py, Baseline.keep_grads) CUDA graph trees
install a backward graph's output as .grad and the next micro-batch's replay overwrites it: the run
stopped at its first step on gr00t-n1.6-3b (docs/benchmarks.md, session 42; pytorch/pytorch#169545).
The gradient norms also check that each step's gradient is the sum of its two micro-batches'.

Environment (set by ctest): LOONGFORGE_TEST_DATASET.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))  # ctest: the build's own
STEPS = 6


def reference_run(tmp_path: Path, model: Path, mode: str):
    out = tmp_path / mode
    cmd = [sys.executable, str(REPO / "scripts/reference/train_torch.py"), "--config", str(REPO / "configs/n16-tiny.yaml"),
           "--mode", mode, "--out", str(out), "--loongforge-train", TRAIN]
    for kv in (f"model.path={model}", f"data.path={DATA}", "run.device=cuda", "precision.mode=bf16",
               "trainer.micro_batch_size=4", "trainer.gradient_accumulation_steps=2", f"trainer.max_steps={STEPS}",
               "logging.interval_steps=1"):
        cmd += ["--set", kv]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"--mode {mode}:\n" + r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_optimized_mode_with_accumulation_trains_as_the_baseline_mode(tmp_path):
    model = tmp_path / "n16-tiny.pt"
    subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny", "--out", str(model)],
                   check=True, capture_output=True, text=True)
    eager = reference_run(tmp_path, model, "baseline")
    compiled = reference_run(tmp_path, model, "optimized")
    assert [r["step"] for r in compiled] == [r["step"] for r in eager] == list(range(1, STEPS + 1))
    worst = max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(eager, compiled) for k in ("loss", "grad_norm"))
    print(f"n16-tiny, bf16, {STEPS} steps of 2 micro-batches: optimized vs baseline, largest relative difference {worst:.3g}")
    assert worst <= 2e-2
