"""trainer.compiled_step (issue #11 item 6): loongforge-train running each
micro-batch as an AOTInductor package built by scripts/compile_step.py gives
the plain runner's losses and gradient norms (fp32 on the CPU: within 1e-5
relative; bf16 on a GPU: within 1%), refuses a package compiled for another
micro-batch (never running around it eagerly), and refuses a package built for
another model, precision, device or model code with the command that rebuilds
it. (trainer.compiled_step=auto, the package cache: test_compile_cache.py.)

The package is compiled once per test session (minutes: 6-9 on the 2-core CPU
machine, so the CPU form is labelled long; the GPU form runs with `ctest -L gpu`).
Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_DATASET,
LOONGFORGE_TEST_MODELS, LOONGFORGE_TEST_DEVICE (cpu | cuda).
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
MODELS = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models")))
sys.path.insert(0, str(REPO / "test/control"))
from trainer_harness import model_with_other_code  # noqa: E402
DEVICE = os.environ.get("LOONGFORGE_TEST_DEVICE", "cpu")
PRECISION = "bf16" if DEVICE == "cuda" else "fp32"
TOLERANCE = 1e-2 if PRECISION == "bf16" else 1e-5
MICRO = 4


@pytest.fixture(scope="session")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("pkg") / f"n16-tiny-b{MICRO}-{DEVICE}.pt2"
    subprocess.run([sys.executable, str(REPO / "scripts/compile_step.py"), str(MODELS / "n16-tiny.pt"),
                    "--batch-size", str(MICRO), "--device", DEVICE, "--precision", PRECISION, "--out", str(out)],
                   check=True)
    return out


def train(tmp_path, name, *sets, check=True):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODELS / 'n16-tiny.pt'}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={tmp_path}", "--set", f"run.name={name}",
           "--set", f"run.device={DEVICE}", "--set", f"precision.mode={PRECISION}",
           "--set", f"trainer.micro_batch_size={MICRO}", "--set", "trainer.max_steps=8",
           "--set", "logging.interval_steps=1", "--set", "checkpoint.interval_steps=1000",
           "--set", "trainer.compiled_step=off"]  # the plain runs (the default on CUDA compiles); tests name a package
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# (trainer.cuda_graphs, gradient_accumulation_steps); on: after 3 uncaptured calls the package call is captured as
# CUDA graphs and replayed (the first micro-batch's, and with 2 micro-batches the accumulating one's too).
GRAPH_MODES = [("off", 1), ("on", 1), ("on", 2)] if DEVICE == "cuda" else [("off", 1)]


@pytest.mark.parametrize("graphs,accumulation", GRAPH_MODES)
def test_the_compiled_step_gives_the_plain_runners_losses_and_gradient_norms(tmp_path, package, graphs, accumulation):
    k = f"trainer.gradient_accumulation_steps={accumulation}"
    train(tmp_path, "plain", "trainer.cuda_graphs=off", k)
    r = train(tmp_path, "compiled", f"trainer.compiled_step={package}", f"trainer.cuda_graphs={graphs}", k)
    log = r.stdout + r.stderr
    assert "compiled step: " in log
    assert "cannot tell whether" not in log, log  # the package and the model file name the same model code
    assert ("captured the compiled step as a CUDA graph (first micro-batch)" in log) == (graphs == "on"), log
    assert ("(accumulating micro-batches)" in log) == (graphs == "on" and accumulation > 1), log
    plain, compiled = records(tmp_path / "plain"), records(tmp_path / "compiled")
    assert [x["step"] for x in compiled] == list(range(1, 9))
    worst = 0.0
    for a, b in zip(plain, compiled):
        for key in ("loss", "grad_norm"):
            worst = max(worst, abs(a[key] - b[key]) / abs(a[key]))
    print(f"compiled (graphs {graphs}, {accumulation} micro-batches) vs plain ({DEVICE}, {PRECISION}, 8 steps): "
          f"largest relative difference {worst:.3g}")
    assert worst <= TOLERANCE


if DEVICE == "cpu":  # on a GPU the same setting captures (above)
    def test_cuda_graphs_on_with_a_compiled_step_on_the_cpu_is_refused(tmp_path, package):
        r = train(tmp_path, "cpu-graphs", f"trainer.compiled_step={package}", "trainer.cuda_graphs=on", check=False)
        assert r.returncode != 0
        assert "trainer.cuda_graphs=on with trainer.compiled_step needs" in r.stderr, r.stderr


def test_a_package_for_another_micro_batch_is_refused_with_the_fix_never_run_around(tmp_path, package):
    r = train(tmp_path, "other", f"trainer.compiled_step={package}", f"trainer.micro_batch_size={MICRO + 1}",
              "trainer.max_steps=2", check=False)
    assert r.returncode == 1
    assert f"was compiled for micro-batch {MICRO}, this run's trainer.micro_batch_size is {MICRO + 1}" in r.stderr
    assert "trainer.compiled_step=auto" in r.stderr and f"--batch-size {MICRO + 1}" in r.stderr, r.stderr
    assert not (tmp_path / "other" / "metrics.jsonl").exists()


def test_a_package_for_another_precision_or_model_is_refused_with_the_rebuild_command(tmp_path, package):
    other = "fp32" if PRECISION == "bf16" else "bf16"
    if other == "bf16" and DEVICE == "cpu":
        # bf16 is CUDA-only: the same architecture with other freezing stands in.
        model = tmp_path / "tuned-llm.pt"
        subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny",
                        "--set", "tune_llm=true", "--out", str(model)], check=True, capture_output=True)
        r = train(tmp_path, "bad", f"trainer.compiled_step={package}", f"model.path={model}", check=False)
        what = "with another architecture or freezing"
    else:
        r = train(tmp_path, "bad", f"trainer.compiled_step={package}", f"precision.mode={other}", check=False)
        what = f"was compiled for precision {PRECISION}"
    assert r.returncode != 0
    assert what in r.stderr and "scripts/compile_step.py" in r.stderr, r.stderr


def test_a_package_compiled_from_other_model_code_is_refused(tmp_path, package):
    # The same module with another model-code record, as if scripts/model/ had changed between export and compile.
    other = model_with_other_code(tmp_path / "other-code.pt")
    r = train(tmp_path, "other-code", f"trainer.compiled_step={package}", f"model.path={other}", check=False)
    assert r.returncode != 0
    assert "was compiled from other model code" in r.stderr and "scripts/compile_step.py" in r.stderr, r.stderr


def test_a_file_that_is_no_package_is_refused(tmp_path):
    bogus = tmp_path / "bogus.pt2"
    bogus.write_bytes(b"not a zip")
    r = train(tmp_path, "bogus", f"trainer.compiled_step={bogus}", check=False)
    assert r.returncode != 0
    assert f"trainer.compiled_step: cannot read {bogus}" in r.stderr, r.stderr


def foreign_paths(package, out):
    """`package` as if generated on another machine: its recorded include and library folders of torch
    and Python moved under /elsewhere (scripts/dev/build_aoti_package.py maps them to this machine's)."""
    import re
    import zipfile
    with zipfile.ZipFile(package) as src, zipfile.ZipFile(out, "w") as dst:
        for n in src.namelist():
            data = src.read(n)
            if n.endswith(("_compile_flags.json", "_linker_flags.json")):
                flags = json.loads(data)
                for key in ("include_dirs", "libraries_dirs"):
                    flags[key] = [re.sub(r"^.*(/lib/python3\.\d+/site-packages/torch)", r"/elsewhere\1", p)
                                  for p in flags.get(key, [])]
                    flags[key] = [re.sub(r"^.*(/include/python3\.\d+)$", r"/elsewhere\1", p) for p in flags[key]]
                data = json.dumps(flags).encode()
            dst.writestr(n, data)
    return out


if DEVICE == "cpu":  # the GPU form needs the package's kernels built on the GPU machine: not run yet
    def test_a_cpp_only_package_built_elsewhere_by_build_aoti_package_gives_the_plain_runners_losses(tmp_path):
        cpp = tmp_path / "cpp-only.pt2"
        subprocess.run([sys.executable, str(REPO / "scripts/compile_step.py"), str(MODELS / "n16-tiny.pt"),
                        "--batch-size", str(MICRO), "--device", DEVICE, "--precision", PRECISION, "--out", str(cpp),
                        "--cpp-only"], check=True)
        import zipfile
        # No host library yet (libtorch's loader would build one itself at load time, from the recorded flags).
        assert not any(n.endswith(".so") for n in zipfile.ZipFile(cpp).namelist())
        moved = foreign_paths(cpp, tmp_path / "moved.pt2")
        assert "/elsewhere/" in json.dumps([json.loads(zipfile.ZipFile(moved).read(n)) for n in
                                            zipfile.ZipFile(moved).namelist() if n.endswith("_compile_flags.json")])
        built = tmp_path / "built.pt2"
        b = subprocess.run([sys.executable, str(REPO / "scripts/dev/build_aoti_package.py"), str(moved), str(built),
                            "--opt-level", "O1"], capture_output=True, text=True)
        assert b.returncode == 0, b.stderr[-3000:]
        assert "built " in b.stdout and any(n.endswith(".so") for n in zipfile.ZipFile(built).namelist())
        again = subprocess.run([sys.executable, str(REPO / "scripts/dev/build_aoti_package.py"), str(built),
                                str(tmp_path / "x.pt2")], capture_output=True, text=True)
        assert again.returncode == 2 and "already holds a built library" in again.stderr
        train(tmp_path, "plain", "trainer.cuda_graphs=off")
        r = train(tmp_path, "built", f"trainer.compiled_step={built}", "trainer.cuda_graphs=off")
        assert "compiled step: " in r.stdout + r.stderr
        plain, compiled = records(tmp_path / "plain"), records(tmp_path / "built")
        worst = max(abs(a[k] - b[k]) / abs(a[k]) for a, b in zip(plain, compiled) for k in ("loss", "grad_norm"))
        print(f"cpp-only package built by build_aoti_package.py vs plain (cpu, fp32, 8 steps): largest relative "
              f"difference {worst:.3g}")
        assert len(compiled) == 8 and worst <= TOLERANCE
