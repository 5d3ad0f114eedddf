"""trainer.compiled_step (auto, the default, on GPUs; on, on any device) and `loongforge-train --compile-only`
(issue #43 item 3): the compiled step's package is compiled once on a machine into the package cache
(trainer.compile_cache) and reused by later runs.

Proved on the CPU with a shallower export of n16-tiny (trainer.compiled_step=on: auto, the default, is off on the CPU). The suite form
compiles once (the module fixture `first`) and every assertion reuses it:
- a first run with on compiles the package: `status` shows phase "compiling" with the compiler's stage line
  and the elapsed time; a `--compile-only` started meanwhile waits on the entry's lock and then finds the
  finished package instead of compiling it again; the run trains with the package and names it, "compiled"
  and the compile time, in its run line, `status` and summary.json;
- a second run hits the cache (no compile);
- `--compile-only` on a prepared cache says the package is there and exits 0 (idempotent);
- a package named by path for another micro-batch, action horizon or text slot (DMF's width) is refused at
  start with the settings that fix it;
- a model exported by other model code than this checkout's (a changed model-code hash) is another entry,
  whose compile scripts/compile_step.py refuses: `--compile-only` exits 1 with the log's tail and path; a run
  trains on the TorchScript step after a warning that names the log and the fix.
The long form (label `long`: one compile each) proves that a corrupted entry is compiled again, and that
another micro-batch and another trainable set are other entries, each compiled once and then hit.

The GPU form (LOONGFORGE_TEST_DEVICE=cuda, `ctest -L gpu`) proves the default on CUDA (no compiled_step key): the
first run compiles an entry for the GPU's architecture (sm_XX), bf16 and the bf16 working copies the run keeps,
the second hits it, keeps the copies and replays the package as CUDA graphs.

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_DATASET, LOONGFORGE_TEST_MODELS,
LOONGFORGE_TEST_DEVICE (cpu | cuda).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "test/control"))
from trainer_harness import model_with_other_code, status  # noqa: E402

TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
MODELS = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models")))
SHALLOW = MODELS / "n16-tiny-shallow.pt"  # n16-tiny with fewer layers (ctest fixture tiny_model): a faster CPU compile
MICRO = 2
STEPS = 4


def command(cache, run_root, *sets, model=SHALLOW, micro=MICRO, compile_only=False):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={model}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={run_root}", "--set", "run.device=cpu",
           "--set", "trainer.compiled_step=on", "--set", f"trainer.compile_cache={cache}",
           "--set", f"trainer.micro_batch_size={micro}", "--set", f"trainer.max_steps={STEPS}",
           "--set", "logging.interval_steps=1", "--set", "checkpoint.interval_steps=1000",
           "--set", f"control.socket={run_root}/ctl/trainer.sock"]
    for s in sets:
        cmd += ["--set", s]
    return cmd + (["--compile-only"] if compile_only else [])


def run(cache, run_root, *sets, check=True, **kw):
    Path(run_root).mkdir(parents=True, exist_ok=True)  # the control socket's folder is made below it
    r = subprocess.run(command(cache, run_root, *sets, **kw), capture_output=True, text=True, timeout=1200)
    if check:
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def summary(run_root):
    return json.loads((Path(run_root) / "n16-tiny-demo" / "summary.json").read_text())


def manifest(entry):
    """The LoongForge manifest inside a package (scripts/compile_step.py writes it into the package's metadata)."""
    import zipfile
    with zipfile.ZipFile(entry) as z:
        name = next(n for n in z.namelist() if n.endswith(".json") and "metadata" in n)
        return json.loads(json.loads(z.read(name))["loongforge"])


def entries(cache):
    return sorted(p.name for p in Path(cache).glob("*.pt2"))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """The one compile of the suite form: a training run that compiles while a --compile-only waits."""
    cache = tmp_path_factory.mktemp("cache")
    root = tmp_path_factory.mktemp("first")
    log = open(root / "trainer.log", "w")
    trainer = subprocess.Popen(command(cache, root), stdout=log, stderr=subprocess.STDOUT, text=True)
    sock = root / "ctl" / "trainer.sock"
    seen, waiter, t0 = [], None, time.time()
    while trainer.poll() is None and time.time() - t0 < 1200:
        st = status(str(sock)) if sock.exists() else {}
        if st.get("phase") == "compiling":
            seen.append(st["compile"])
            if waiter is None and st["compile"]["state"] == "compiling":  # the trainer holds the entry's lock now
                waiter = subprocess.Popen(command(cache, tmp_path_factory.mktemp("waiter"), compile_only=True),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(0.5)
    trainer.wait(timeout=60)
    log.close()
    assert waiter is not None, (root / "trainer.log").read_text()[-3000:]
    waited = waiter.communicate(timeout=300)[0]
    return {"cache": cache, "root": root, "rc": trainer.returncode, "log": (root / "trainer.log").read_text(),
            "seen": seen, "waiter_rc": waiter.returncode, "waiter": waited}


def test_a_first_auto_run_compiles_reports_progress_and_trains_with_the_package(first):
    assert first["rc"] == 0, first["log"][-4000:]
    log = first["log"]
    assert "compiled step: compiling " in log and "compile_step: traced: " in log, log[-4000:]
    assert "no earlier compile of this model here to estimate from" in log
    # status while compiling: the compiler's stage lines and the elapsed time, which grows
    compiling = [c for c in first["seen"] if c["state"] == "compiling"]
    assert len(compiling) >= 2
    assert compiling[-1]["elapsed_s"] > compiling[0]["elapsed_s"]
    assert any(c["stage"].startswith("traced: ") for c in compiling), compiling[-1]
    assert all(c["package"].startswith(str(first["cache"])) for c in compiling)
    [entry] = entries(first["cache"])
    assert entry.startswith(f"n16-tiny-b{MICRO}-cpu-fp32-")
    s = summary(first["root"])
    package = s["compiled_step"]
    assert package["source"] == "compiled" and package["path"] == str(first["cache"] / entry)
    assert package["compile_s"] > 1 and s["steps"] == STEPS
    assert f"compiled step {first['cache'] / entry} (compiled in " in log  # the run line
    assert "compiled step: " + str(first["cache"] / entry) + " (n16-tiny, micro-batch 2, fp32)" in log  # loaded
    print(f"the first run compiled {entry} in {package['compile_s']:.0f} s")
    # the history the next compile of this model estimates from
    times = [json.loads(x) for x in (first["cache"] / "compile_times.jsonl").read_text().splitlines()]
    assert [t["package"] for t in times] == [entry]


def test_a_compile_only_started_during_the_compile_waits_and_uses_the_finished_package(first):
    assert first["waiter_rc"] == 0, first["waiter"]
    assert "another process is preparing" in first["waiter"], first["waiter"]
    assert "already prepared: " in first["waiter"] and "compile_step:" not in first["waiter"], first["waiter"]
    assert any(c["state"] == "compiling" for c in first["seen"])
    assert len(entries(first["cache"])) == 1


def test_a_second_run_hits_the_cache_and_does_not_compile(first, tmp_path):
    r = run(first["cache"], tmp_path)
    log = r.stdout + r.stderr
    assert "compiled step: cache hit " in log and "compiled step: compiling" not in log, log[-3000:]
    s = summary(tmp_path)
    assert s["compiled_step"]["source"] == "cache hit" and s["compiled_step"]["compile_s"] == 0
    assert "(cache hit)" in log and "compiled     " in r.stdout  # the run line and the printed summary
    assert s["steps"] == STEPS


def test_auto_the_default_trains_the_torchscript_step_on_the_cpu_and_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    r = run(cache, tmp_path / "auto", "trainer.compiled_step=auto")
    assert "compiled step off" in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
    assert "compiled_step" not in summary(tmp_path / "auto") or summary(tmp_path / "auto")["compiled_step"] is None
    assert not cache.exists() or entries(cache) == []


def test_compile_only_on_a_prepared_cache_says_it_is_there(first, tmp_path):
    r = run(first["cache"], tmp_path, compile_only=True)
    [entry] = entries(first["cache"])
    assert r.stdout.strip() == f"already prepared: {first['cache'] / entry}", r.stdout
    assert "compile_step:" not in r.stdout + r.stderr
    assert not (tmp_path / "n16-tiny-demo").exists()  # nothing trained


def test_a_named_package_for_another_micro_batch_is_refused_with_the_fix(first, tmp_path):
    [entry] = entries(first["cache"])
    r = run(first["cache"], tmp_path, f"trainer.compiled_step={first['cache'] / entry}", micro=MICRO + 1,
            check=False)
    assert r.returncode == 1
    assert f"was compiled for micro-batch {MICRO}, this run's trainer.micro_batch_size is {MICRO + 1}" in r.stderr
    assert "trainer.compiled_step=auto" in r.stderr and f"--batch-size {MICRO + 1}" in r.stderr, r.stderr


@pytest.mark.parametrize("setting, refusal, fix", [
    # the GR00T models' own horizon is not the data's: gr00t-n1.7-3b's 40 against the bundled dataset's 16
    ("data.action_horizon=8", "was compiled for 16 actions per sample, this run's data.action_horizon is 8",
     "--action-horizon 8"),
    # with DMF the batches' text slot is its one width (the bundled texts' 14 tokens), not the model's 32
    ("dmf.enable=true", "was compiled for a text slot of 32 tokens, this run's batches have 14 (DMF's width)",
     "--text-width 14"),
])
def test_a_named_package_for_another_batch_shape_is_refused_with_the_fix(first, tmp_path, setting, refusal, fix):
    """A package takes the batch shape it was compiled for: the action horizon and the text slot's width too."""
    [entry] = entries(first["cache"])
    r = run(first["cache"], tmp_path, f"trainer.compiled_step={first['cache'] / entry}", setting, check=False)
    assert r.returncode == 1
    assert refusal in r.stderr, r.stderr
    assert fix in r.stderr and "trainer.compiled_step=auto" in r.stderr, r.stderr


def other_code_model(tmp_path):
    """n16-tiny with another model-code record, as if scripts/model/ had changed since its export."""
    return model_with_other_code(tmp_path / "other-code.pt")


def test_a_model_from_changed_model_code_is_another_entry_whose_compile_is_refused(first, tmp_path):
    model = other_code_model(tmp_path)
    r = run(first["cache"], tmp_path, model=model, compile_only=True, check=False)
    assert r.returncode == 1
    assert "compiling " in r.stderr and "failed (exit status 2" in r.stderr, r.stderr
    assert "was exported by other model code than this checkout's scripts/model/" in r.stderr  # the log's tail
    assert "its log is " + str(first["cache"]) in r.stderr
    assert len(entries(first["cache"])) == 1  # nothing left for the refused entry
    # A training run: the TorchScript step, after a warning naming the log and the fix.
    t = run(first["cache"], tmp_path, model=model)
    log = t.stdout + t.stderr
    assert "compiled step: NOT USED, this run trains on the slower TorchScript step" in log
    assert "--compile-only" in log and "trainer.compiled_step=off" in log
    s = summary(tmp_path)
    assert s["compiled_step"]["source"] == "compile failed" and s["steps"] == STEPS
    assert "compiled step not used (its compile failed" in log  # the run line


# ---------------------------------------------------------------------------- long: one compile each


@pytest.mark.long
def test_a_corrupted_cache_entry_is_compiled_again(first, tmp_path):
    import shutil
    cache = tmp_path / "cache"
    shutil.copytree(first["cache"], cache)
    [entry] = entries(cache)
    (cache / entry).write_bytes((cache / entry).read_bytes()[:4096])  # a truncated file
    r = run(cache, tmp_path)
    log = r.stdout + r.stderr
    assert f"the cached package {cache / entry} cannot serve this run: it cannot be read" in log, log[-3000:]
    assert "compiled step: compiling" in log
    assert "the last compile of this model here took" in log  # the estimate from the copied history
    assert summary(tmp_path)["compiled_step"]["source"] == "compiled"
    assert entries(cache) == [entry]


@pytest.mark.long
def test_another_micro_batch_and_another_trainable_set_are_other_entries(first, tmp_path):
    import shutil
    cache = tmp_path / "cache"
    shutil.copytree(first["cache"], cache)
    [entry] = entries(cache)
    r = run(cache, tmp_path / "b3", micro=MICRO + 1, compile_only=True)
    assert r.stdout.startswith("compiled "), r.stdout
    tuned = tmp_path / "tuned-llm.pt"
    subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny",
                    "--set", "tune_llm=true", "--out", str(tuned)], check=True, capture_output=True)
    run(cache, tmp_path / "tuned", model=tuned)
    assert summary(tmp_path / "tuned")["compiled_step"]["source"] == "compiled"
    names = entries(cache)
    assert len(names) == 3 and entry in names
    assert any(n.startswith(f"n16-tiny-b{MICRO + 1}-cpu-fp32-") for n in names)
    again = run(cache, tmp_path / "b3-run", micro=MICRO + 1)
    assert summary(tmp_path / "b3-run")["compiled_step"]["source"] == "cache hit", again.stdout[-2000:]


# ---------------------------------------------------------------------------- gpu: auto on CUDA


if os.environ.get("LOONGFORGE_TEST_DEVICE") == "cuda":  # the GPU form (ctest -L gpu); defined only there
    def test_on_a_gpu_auto_compiles_for_its_architecture_once_then_hits(tmp_path):
        config = REPO / "configs/n16-tiny.yaml"
        cache = tmp_path / "cache"

        def gpu_run(name):
            root = tmp_path / name
            root.mkdir()
            r = subprocess.run([TRAIN, "--config", str(config), "--set", f"model.path={MODELS / 'n16-tiny.pt'}",
                                "--set", f"data.path={DATA}", "--set", f"run.output_dir={root}", "--set", "run.device=cuda",
                                "--set", f"trainer.compile_cache={cache}", "--set", f"trainer.micro_batch_size={MICRO}",
                                "--set", f"trainer.max_steps={STEPS}", "--set", "checkpoint.interval_steps=1000",
                                "--set", f"control.socket={root}/ctl/trainer.sock"],
                               capture_output=True, text=True, timeout=1200)
            assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            return summary(root)["compiled_step"], r.stdout + r.stderr

        first_run, log = gpu_run("first")
        [entry] = entries(cache)
        assert entry.startswith(f"n16-tiny-b{MICRO}-cuda-sm_") and "-bf16-" in entry, entry
        assert first_run["source"] == "compiled", log[-3000:]
        kept = json.loads((tmp_path / "first" / "n16-tiny-demo" / "bf16_weights.json").read_text())
        assert kept and sorted(manifest(cache / entry)["bf16_weights"]) == sorted(kept)  # it takes the run's copies
        print(f"GPU: compiled {entry} ({len(kept)} bf16 working copies) in {first_run['compile_s']:.0f} s")
        second, log = gpu_run("second")
        assert second["source"] == "cache hit" and "compiled step: compiling" not in log, log[-3000:]
        assert "replayed as a CUDA graph" in log
        assert json.loads((tmp_path / "second" / "n16-tiny-demo" / "bf16_weights.json").read_text()) == kept


def test_a_package_records_that_it_takes_fp32_weights(first):
    """Without --bf16-weights the manifest lists no working copies, so a run with it keeps none (the optimizer's
    log line names the flag that would make the package take them: src/optim/factory.cpp)."""
    assert manifest(Path(first["cache"]) / entries(first["cache"])[0])["bf16_weights"] == []


@pytest.mark.parametrize("case", ["unknown name", "not a list", "fp32 run"])
def test_bf16_weights_that_do_not_fit_the_model_are_refused_before_any_compile(tmp_path, case):
    f = tmp_path / "bf16_weights.json"
    f.write_text({"unknown name": '["no.such.weight"]', "not a list": '{"a": 1}',
                  "fp32 run": '["connector.fc1.weight"]'}[case])
    t0 = time.time()
    r = subprocess.run([sys.executable, str(REPO / "scripts/compile_step.py"), str(MODELS / "n16-tiny.pt"),
                        "--batch-size", "2", "--device", "cpu", "--precision", "fp32", "--bf16-weights", str(f),
                        "--out", str(tmp_path / "x.pt2")], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "scripts")))
    assert r.returncode != 0 and not (tmp_path / "x.pt2").exists()
    want = {"unknown name": "no trainable parameter of this model, e.g. 'no.such.weight'",
            "not a list": "expected a JSON list of parameter names",
            "fp32 run": "--bf16-weights needs --precision bf16"}[case]
    assert want in r.stderr + r.stdout, r.stderr[-2000:]
    assert time.time() - t0 < 120  # refused before tracing or compiling
