"""An engine that is off takes the plain path, so a key of its section set to
a non-default value would do nothing: loongforge-train says so, naming the
key, where it was set, and the fix. All four engines are built and warn
(the run goes on: a config that tunes an engine and a --set that turns it off
for one run is a normal comparison); a binary without an engine refuses its
keys before anything loads (test/config/test_config.cpp). With the engine on,
the same key gives no warning;
mla.enable=true on a CPU run is refused (MLA manages CUDA memory).

Environment as in test/e2e/test_train_run.py (set by ctest).
"""
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"


def train(tmp_path, *sets):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={tmp_path}", "--set", "trainer.max_steps=1",
           "--set", "checkpoint.interval_steps=1000", "--set", "logging.progress=off"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("engine, key, value, effect", [
    ("gcts", "gcts.shard_optimizer", "true", "the plain all-reduce and AdamW run"),
    ("adfe", "adfe.prefetch_factor", "8", "the plain source decodes on the trainer thread"),
    ("mla", "mla.segment_mb", "128", "PyTorch's caching allocator serves the device"),
    ("dmf", "dmf.text_buckets", "2", "every micro-batch keeps the whole text slot"),
])
def test_a_key_of_a_built_engine_that_is_off_is_named_in_a_warning_and_the_run_goes_on(tmp_path, engine, key,
                                                                                        value, effect):
    r = train(tmp_path, f"{engine}.enable=false", f"{key}={value}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (f"[warning] --set: {key}={value} has no effect: {engine}.enable is false ({effect}); "
            f"set {engine}.enable=true or remove the key") in r.stderr


@pytest.mark.parametrize("engine, key, value", [("gcts", "gcts.comm_strategy", "simple"),
                                                ("adfe", "adfe.prefetch_factor", "8")])
def test_the_same_key_with_the_engine_on_gives_no_warning(tmp_path, engine, key, value):
    r = train(tmp_path, f"{engine}.enable=true", f"{key}={value}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "has no effect" not in r.stderr


def test_mla_on_a_cpu_run_is_refused_naming_the_key(tmp_path):
    r = train(tmp_path, "run.device=cpu", "mla.enable=true")
    assert r.returncode == 1
    assert "mla.enable=true: MLA manages CUDA memory and this run is on the CPU (run.device=cpu)" in r.stderr
