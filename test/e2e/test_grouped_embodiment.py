"""A model file exported with category_linear=grouped (its per-embodiment linears call
loongforge::category_linear, include/loongforge/ops/ops.hpp) trains in loongforge-train, which
registers the operator itself, with the losses and gradient norms of the same model exported with
upstream's gather + bmm: within 1e-6 relative on the CPU in float32 (the operator's CPU kernel
is that composition; the gather model's own weight gradients vary by about 1e-7 between two
backward passes on this CPU), within 1% over the steps in bf16 on a GPU (segment GEMMs).
Compiled by scripts/compile_step.py, the package calls the operator and gives the plain
runner's losses (1e-5 / 1%; about a minute of compiling on the 2-core CPU machine, so the CPU
form is labelled long).

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_DATASET, LOONGFORGE_TEST_MODELS,
LOONGFORGE_TEST_DEVICE (cpu | cuda), LOONGFORGE_OPS_LIBRARY.
"""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
MODELS = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models")))
DEVICE = os.environ.get("LOONGFORGE_TEST_DEVICE", "cpu")
PRECISION = "bf16" if DEVICE == "cuda" else "fp32"
STEPS = 6


def archive_bytes(path: Path, suffix: str = "") -> bytes:
    """The members of a zip archive (a TorchScript file, an AOTInductor package) whose names end with
    suffix, concatenated (Python's zipfile: the GPU machine has no unzip)."""
    with zipfile.ZipFile(path) as z:
        return b"".join(z.read(n) for n in z.namelist() if n.endswith(suffix))


def export(path: Path, *sets: str) -> None:
    cmd = [sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny", "--out", str(path)]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def train(tmp_path: Path, name: str, model: Path, *sets: str):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={model}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={tmp_path}", "--set", f"run.name={name}",
           "--set", f"run.device={DEVICE}", "--set", f"precision.mode={PRECISION}",
           "--set", "trainer.micro_batch_size=8", "--set", f"trainer.max_steps={STEPS}",
           "--set", "logging.interval_steps=1", "--set", "checkpoint.interval_steps=1000",
           "--set", "trainer.compiled_step=off"]  # the TorchScript step unless a test names a package
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_a_grouped_model_file_trains_with_the_gather_models_losses(tmp_path):
    grouped = tmp_path / "n16-tiny-grouped.pt"
    export(grouped, "category_linear=grouped")
    assert b"loongforge.category_linear" in archive_bytes(grouped)
    gather = train(tmp_path, "gather", MODELS / "n16-tiny.pt")
    ours = train(tmp_path, "grouped", grouped)
    assert [r["step"] for r in ours] == list(range(1, STEPS + 1))
    worst = max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(gather, ours) for k in ("loss", "grad_norm"))
    print(f"grouped vs gather ({DEVICE}, {PRECISION}, {STEPS} steps): largest relative difference {worst:.3g}")
    assert worst <= (1e-6 if PRECISION == "fp32" else 1e-2)


def test_a_compiled_step_of_a_grouped_model_calls_the_operator_and_gives_the_plain_losses(tmp_path):
    """AOTInductor keeps loongforge::category_linear (and its backward) as calls through the package's
    proxy executor; loongforge-train, which registers the operators, runs the package."""
    grouped = tmp_path / "n16-tiny-grouped.pt"
    export(grouped, "category_linear=grouped")
    package = tmp_path / "grouped.pt2"
    subprocess.run([sys.executable, str(REPO / "scripts/compile_step.py"), str(grouped), "--batch-size", "8",
                    "--device", DEVICE, "--precision", PRECISION, "--out", str(package)], check=True)
    calls = archive_bytes(package, ".json")
    assert calls.count(b"loongforge::category_linear_backward") >= 7    # 7 per-embodiment layers
    plain = train(tmp_path, "plain", grouped)
    compiled = train(tmp_path, "compiled", grouped, f"trainer.compiled_step={package}")
    worst = max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(plain, compiled) for k in ("loss", "grad_norm"))
    print(f"compiled grouped vs plain grouped ({DEVICE}, {PRECISION}, {STEPS} steps): largest relative difference "
          f"{worst:.3g}")
    assert worst <= (1e-5 if PRECISION == "fp32" else 1e-2)
