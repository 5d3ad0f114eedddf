"""The compiled step trains a GR00T head with dropout on (issue #43 item 1): a
gr00t-n1.7-tiny package with the head's default dropout 0.2 draws its masks
in the graph from the default generator, which every runner seeds per (run
seed, step, micro-batch, rank) before each call or CUDA-graph replay
(Note [Micro-step draws] in src/fusion/step_runner.cpp).

The masks are measured where the package draws them: loongforge-train runs
with test/fusion/mask_probe.cpp preloaded, which records each mask the
package's C-shim call fills (elements, kept, a hash). So this file proves,
on the CPU in fp32:
- over one step the masks keep 1 - p of their elements within 0.5% (and the
  plain runner's TorchScript forward draws none through the shim: the probe
  counts the package's masks only);
- a run stopped after step 3 and resumed draws the uninterrupted run's masks
  at steps 4-6 bit for bit (same hashes), and each step's masks differ from
  the other steps'; each step's masks are those torch's CPU bernoulli_ draws
  after manual_seed(draw_seed(42, step, 0, 0)), the seed written out here
  from docs/training-semantics.md s4 (so the runner reseeded before the call); its losses and gradient norms are the uninterrupted
  run's within 1e-6 relative (not bit for bit: the CPU package's backward
  adds with atomics, 15 sites in gr00t-n1.7-tiny's, so two uninterrupted
  runs differ in the last bits too: 8.5e-8 in one gradient norm, measured);
- the plain runner, seeded the same way, resumes to the same losses bit for
  bit (no package: the suite's form);
- the loss curve follows the plain runner's (masks of the same distribution,
  other values): over 300 steps the losses, smoothed over 20 steps, within
  2% (measured: 0.26%).
On a GPU (LOONGFORGE_TEST_DEVICE=cuda, label gpu) the package is compiled for
CUDA in the test and replayed as a CUDA graph: a run resumed at step 6 makes
package calls at steps 7-9 and replays 10-12, the uninterrupted run replays
all of them, and both give the same losses within 1e-5: a replay draws what
a call draws for its (seed, step) (test/fusion/test_compiled_draws.cpp shows
on one fixed batch that replays at other steps draw other masks).

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_DATASET,
LOONGFORGE_MASK_PROBE_LIBRARY, LOONGFORGE_TEST_DEVICE (cpu | cuda).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
PROBE = os.environ.get("LOONGFORGE_MASK_PROBE_LIBRARY", str(REPO / "build/test/fusion/libloongforge_mask_probe.so"))
DEVICE = os.environ.get("LOONGFORGE_TEST_DEVICE", "cpu")
PY = sys.executable
MICRO, P = 4, 0.2
NAME = "gr00t-n1.7-tiny"


def cpu_form():
    """The CPU forms (ctest e2e_compiled_dropout): the probe sees only a GPU package's uncaptured calls, and the
    GPU form is test_replays_draw_what_calls_draw_for_the_same_step; selected by -k, they fail on a GPU."""
    assert DEVICE == "cpu", "a CPU form: ctest entry e2e_compiled_dropout (LOONGFORGE_TEST_DEVICE=cpu)"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(model file with the head's default dropout 0.2, its fp32 package for DEVICE)."""
    root = tmp_path_factory.mktemp("dropout")
    model = root / "model.pt"
    subprocess.run([PY, str(REPO / "scripts/model/export.py"), "--config", NAME, "--out", str(model)],
                   check=True, capture_output=True, text=True)
    package = root / "step.pt2"
    compile_cmd = [PY, str(REPO / "scripts/compile_step.py"), str(model), "--batch-size", str(MICRO),
                   "--device", DEVICE, "--precision", "fp32"]
    if DEVICE == "cuda":
        subprocess.run(compile_cmd + ["--out", str(package)], check=True)
    else:  # the host library at -O1: about 2 of the 6-9 minutes of the full build on 2 cores
        cpp = root / "cpp-only.pt2"
        subprocess.run(compile_cmd + ["--out", str(cpp), "--cpp-only"], check=True)
        subprocess.run([PY, str(REPO / "scripts/dev/build_aoti_package.py"), str(cpp), str(package),
                        "--opt-level", "O1"], check=True)
    return model, package


def train(out: Path, run: str, model: Path, *sets: str, probe: Path = None) -> str:
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={model}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={out}", "--set", f"run.name={run}",
           "--set", f"run.device={DEVICE}", "--set", "precision.mode=fp32", "--set", "run.threads=1",
           # CPU: the TorchScript backward's per-embodiment gather adds in a fixed order (on a GPU cuBLAS would
           # refuse it without CUBLAS_WORKSPACE_CONFIG)
           "--set", f"run.deterministic={'true' if DEVICE == 'cpu' else 'false'}",
           "--set", f"trainer.micro_batch_size={MICRO}",
           "--set", "trainer.cuda_graphs=off", "--set", "logging.interval_steps=1",
           "--set", "checkpoint.interval_steps=1000",
           "--set", "trainer.compiled_step=off"]  # the plain runs (the default on CUDA compiles); tests name a package
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ)
    if probe is not None:
        env.update(LD_PRELOAD=PROBE, LOONGFORGE_MASK_PROBE=str(probe))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def records(run: Path):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def masks(probe: Path):
    """The probe's lines: (elements, kept, hash) per mask the package drew, in order."""
    if not probe.exists():
        return []
    return [(int(n), int(k), h) for n, k, h in (line.split() for line in probe.read_text().splitlines())]


def manifest(package: Path) -> dict:
    import zipfile
    with zipfile.ZipFile(package) as z:
        meta = [n for n in z.namelist() if n.endswith("_metadata.json")]
        return json.loads(json.loads(z.read(meta[0]))["loongforge"])


def draw_seed(seed: int, step: int, micro: int, rank: int) -> int:
    """docs/training-semantics.md s4's seed of a micro-batch's draws, written out from that text."""
    full, golden = (1 << 64) - 1, 0x9E3779B97F4A7C15
    z = ((seed ^ 0x4452415753454544) + ((step * 65536 + micro) * 65536 + rank) * golden + golden) & full
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & full
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & full
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def regenerated(step: int, sizes, batch) -> list:
    """The probe's hashes of masks drawn by torch's CPU bernoulli_(1 - p), one per size, after the default
    generator was set to the seed of micro-batch 0 of `step` (run.seed 42, rank 0) and the runner drew the
    head's state draws the package takes (`batch`: the manifest's; compiled_runner.cpp inputs())."""
    import torch
    torch.manual_seed(draw_seed(42, step, 0, 0))
    for key, _, shape in batch:
        if key == "state_drop":
            torch.rand(shape)
        elif key == "state_noise":
            torch.randn(shape)
    out = []
    for n in sizes:
        h = 1469598103934665603
        for b in torch.empty(n).bernoulli_(1 - P).to(torch.uint8).tolist():
            h = ((h ^ b) * 1099511628211) & ((1 << 64) - 1)
        out.append(f"{h:016x}")
    return out


def smoothed(xs, window=20):
    return [sum(xs[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def test_the_plain_runner_with_dropout_resumes_to_the_same_losses_bit_for_bit(tmp_path):
    model = tmp_path / "model.pt"
    subprocess.run([PY, str(REPO / "scripts/model/export.py"), "--config", NAME, "--out", str(model)],
                   check=True, capture_output=True, text=True)
    train(tmp_path, "whole", model, "trainer.max_steps=4")
    train(tmp_path, "cut", model, "trainer.max_steps=4", "trainer.steps_per_run=2")
    train(tmp_path, "cut", model, "trainer.max_steps=4", "checkpoint.resume=latest")
    whole, cut = records(tmp_path / "whole"), records(tmp_path / "cut")
    assert [x["step"] for x in cut] == [1, 2, 3, 4]
    assert [(x["loss"], x["grad_norm"]) for x in whole] == [(x["loss"], x["grad_norm"]) for x in cut]


def test_the_package_keeps_one_minus_p_of_each_steps_mask_elements(tmp_path, built):
    cpu_form()
    model, package = built
    assert manifest(package)["dropout"] == {"rates": {"gr00t_dropout": P},
                                            "masks": "drawn in the graph from the default generator (ATen's ops)"}
    probe = tmp_path / "masks.txt"
    log = train(tmp_path, "compiled", model, f"trainer.compiled_step={package}", "trainer.max_steps=1", probe=probe)
    assert f"compiled step: {package} ({NAME}, micro-batch {MICRO}, fp32)" in log, log[-3000:]
    drawn = masks(probe)
    elements, kept = sum(n for n, _, _ in drawn), sum(k for _, k, _ in drawn)
    rate = kept / elements
    print(f"one compiled step (micro-batch {MICRO}): {len(drawn)} masks, {elements} elements, keep rate {rate:.5f} "
          f"(1 - p = {1 - P})")
    # 0.5% of 0.8 is 0.004; the keep rate's standard deviation is sqrt(0.16 / elements).
    assert elements >= 250_000, "too few mask elements for a 5-sigma bound"
    assert abs(rate - (1 - P)) <= 0.005 * (1 - P)

    plain_probe = tmp_path / "plain-masks.txt"
    train(tmp_path, "plain", model, "trainer.max_steps=1", probe=plain_probe)
    assert masks(plain_probe) == [], "the probe counts the package's masks only"


def test_a_resumed_run_draws_the_same_masks_bit_for_bit_and_gives_the_same_losses(tmp_path, built):
    cpu_form()
    model, package = built
    step_file = f"trainer.compiled_step={package}"
    whole, cut = tmp_path / "whole.txt", tmp_path / "cut.txt"
    train(tmp_path, "whole", model, step_file, "trainer.max_steps=6", probe=whole)
    train(tmp_path, "cut", model, step_file, "trainer.max_steps=6", "trainer.steps_per_run=3", probe=cut)
    before = len(masks(cut))
    train(tmp_path, "cut", model, step_file, "trainer.max_steps=6", "checkpoint.resume=latest", probe=cut)
    a, b = masks(whole), masks(cut)
    per_step = len(a) // 6
    assert per_step > 0 and len(a) == 6 * per_step and len(b) == len(a) and before == 3 * per_step
    assert b == a, "steps 1-3 and, after the resume, 4-6 draw the uninterrupted run's masks"
    steps = [tuple(h for _, _, h in a[i * per_step:(i + 1) * per_step]) for i in range(6)]
    assert len(set(steps)) == 6, "each step draws other masks"
    # The masks are a function of the step's seed: torch's own draws after manual_seed(draw_seed) give them.
    batch = manifest(package)["batch"]
    for i in range(6):
        assert list(steps[i]) == regenerated(i, [n for n, _, _ in a[i * per_step:(i + 1) * per_step]], batch), i + 1
    ra, rb = records(tmp_path / "whole"), records(tmp_path / "cut")
    assert [x["step"] for x in rb] == list(range(1, 7))
    drift = max(abs(x[k] - y[k]) / abs(x[k]) for x, y in zip(ra, rb) for k in ("loss", "grad_norm"))
    print(f"resumed after step 3: {per_step} masks per step, all equal; largest relative loss/grad-norm "
          f"difference {drift:.3g}")
    assert drift <= 1e-6


def test_the_compiled_loss_curve_follows_the_plain_runners(tmp_path, built):
    cpu_form()
    model, package = built
    steps, bound = 300, 0.02
    sets = (f"trainer.max_steps={steps}", "optimizer.lr=3e-4")
    train(tmp_path, "plain", model, *sets)
    train(tmp_path, "compiled", model, f"trainer.compiled_step={package}", *sets)
    plain = smoothed([x["loss"] for x in records(tmp_path / "plain")])
    compiled = smoothed([x["loss"] for x in records(tmp_path / "compiled")])
    assert len(plain) == len(compiled) == steps
    worst = max(abs(c - p) / p for p, c in zip(plain, compiled))
    print(f"{steps} steps, losses smoothed over 20 steps: compiled within {worst:.4f} of plain (bound {bound}); "
          f"first {plain[0]:.4f}/{compiled[0]:.4f}, last {plain[-1]:.4f}/{compiled[-1]:.4f}")
    assert worst <= bound


def test_replays_draw_what_calls_draw_for_the_same_step(tmp_path, built):
    assert DEVICE == "cuda", "the GPU form: ctest entry e2e_compiled_dropout_gpu (LOONGFORGE_TEST_DEVICE=cuda)"
    model, package = built
    sets = (f"trainer.compiled_step={package}", "trainer.max_steps=12", "trainer.cuda_graphs=on")
    log = train(tmp_path, "whole", model, *sets)
    assert "captured the compiled step as a CUDA graph" in log, log[-3000:]
    train(tmp_path, "cut", model, *sets, "trainer.steps_per_run=6")
    log = train(tmp_path, "cut", model, *sets, "checkpoint.resume=latest")
    assert "step 10: captured the compiled step" in log, log[-3000:]  # steps 7-9 are calls, 10-12 replays
    whole, cut = records(tmp_path / "whole"), records(tmp_path / "cut")
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(whole[6:], cut[6:]))
    print(f"cuda: steps 7-12 resumed (calls 7-9, replays 10-12) vs replayed throughout: largest relative loss "
          f"difference {worst:.3g}")
    assert worst <= 1e-5  # other masks: 1e-3 apart per step (median; CPU, the plain runner's against the package's)
