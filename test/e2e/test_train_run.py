"""A training run as a user sees it: loongforge-train on n16-tiny and the
bundled dataset prints progress lines with an ETA, writes metrics.jsonl (one
record per step, every documented field), a checkpoint whose model.safetensors
loads in Python with the model's own parameter names, and ends with a summary;
bad inputs stop it with a message naming the file; a run whose first step
is made slow on purpose (3 s of data wait) reports the same kind of steady
figures: the median and data-wait share of the steps after warm-up, with
the slow step only in the time to the first step and the labelled
whole-run mean.

Environment as in test_parity.py (set by ctest).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"
FIELDS = {"step", "loss", "lr", "grad_norm", "num_valid", "samples_per_s", "tokens_per_s", "mfu",
          "data_wait_ms", "step_ms", "peak_mem_mb"}


def train(tmp_path, *sets, check=True, env=None):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={tmp_path}", "--set", "logging.interval_steps=5"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, env=env)


def test_a_slow_first_step_leaves_the_steady_figures_to_the_steps_after_warm_up(tmp_path):
    env = dict(os.environ, LOONGFORGE_TEST_FIRST_STEP_DELAY_MS="3000")
    r = train(tmp_path, "trainer.max_steps=20", "checkpoint.interval_steps=1000", "logging.progress=lines", env=env)
    run = tmp_path / "n16-tiny-demo"
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    steady = summary["steady_state"]
    assert records[0]["data_wait_ms"] >= 3000 and records[0]["step_ms"] >= 3000  # the slow step is recorded
    # The steady figures come from steps 3-20 alone (Note [Steady state]), whatever step 1 took.
    window = records[2:]
    sps = sorted(x["samples_per_s"] for x in window)
    assert steady["from_step"] == 3 and steady["steps"] == 18
    assert abs(steady["samples_per_s_median"] - (sps[8] + sps[9]) / 2) <= 1e-6 * sps[9]
    wait = sum(x["data_wait_ms"] for x in window) / sum(x["step_ms"] for x in window)
    assert abs(steady["data_wait_fraction"] - wait) <= 1e-9 + 1e-6 * wait
    assert records[0]["samples_per_s"] < 0.5 * steady["samples_per_s_median"]  # step 1 would have dragged it down
    # The slow step shows where it belongs: the time to the first step and the labelled whole-run mean.
    assert summary["time_to_first_step_s"] >= 3.0
    whole = summary["whole_run_mean"]
    all_wait = sum(x["data_wait_ms"] for x in records) / sum(x["step_ms"] for x in records)
    assert abs(whole["data_wait_fraction"] - all_wait) <= 1e-6 * all_wait
    assert whole["data_wait_fraction"] > steady["data_wait_fraction"] + 0.1
    assert whole["samples_per_s"] < steady["samples_per_s_median"]
    assert f"data wait {100 * steady['data_wait_fraction']:.1f}% of step time (median of steps 3-20" in r.stdout
    assert "(mean over all 20 steps, warm-up included)" in r.stdout
    # The progress lines give the steady median and its data-wait share beside the step's own figures.
    assert re.search(r"samples/s \(median [\d.]+, data wait [\d.]+%\)", r.stdout), r.stdout


def test_a_short_run_shows_progress_writes_metrics_a_checkpoint_and_a_summary(tmp_path):
    r = train(tmp_path, "trainer.max_steps=20", "checkpoint.interval_steps=10")
    assert "step 5/20" in r.stdout and "ETA" in r.stdout
    assert "== LoongForge run summary ==" in r.stdout
    run = tmp_path / "n16-tiny-demo"
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == list(range(1, 21))
    assert FIELDS <= set(records[0])
    assert all(x["num_valid"] > 0 and x["samples_per_s"] > 0 for x in records)
    assert records[0]["lr"] == 0.0  # HF warmup: step 0 has learning rate 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 20
    # The speed is the steady state's (Note [Steady state]): the median of steps 3-20 (2 warm-up steps),
    # the first step's time separately, the whole-run mean labelled as such.
    steady = summary["steady_state"]
    assert steady["from_step"] == 3 and steady["steps"] == 18 and steady["warmup_steps"] == 2
    window = sorted(x["samples_per_s"] for x in records[2:])
    assert abs(steady["samples_per_s_median"] - (window[8] + window[9]) / 2) <= 1e-6 * window[9]
    assert summary["samples_per_s"] == steady["samples_per_s_median"]
    assert summary["time_to_first_step_s"] > 0 and summary["whole_run_mean"]["samples_per_s"] > 0
    assert "(median of steps 3-20, after 2 warm-up steps)" in r.stdout
    assert "first step " in r.stdout and "(mean over all 20 steps, warm-up included)" in r.stdout
    # The time to the first step, attributed: the phases in order, none negative, summing to the total.
    first = summary["time_to_first_step"]
    assert [p["phase"] for p in first["phases"]] == ["start", "model", "data", "step runner", "optimizer",
                                                     "resume", "first batch", "first forward+backward",
                                                     "first update", "first record"]
    assert all(p["s"] >= 0 for p in first["phases"])
    # What the trainer thread spent in each phase: CPU time within the phase's wall time (a little over for the
    # clocks' resolution), page faults served from storage, and the process's storage reads (null: not counted).
    assert all(0 <= p["cpu_s"] <= p["s"] + 0.05 and p["major_faults"] >= 0 for p in first["phases"])
    assert all(p["storage_read_mb"] is None or p["storage_read_mb"] >= 0 for p in first["phases"])
    assert abs(sum(p["s"] for p in first["phases"]) - first["total_s"]) <= 1e-6 * first["total_s"] + 1e-9
    assert first["total_s"] == summary["time_to_first_step_s"]
    assert "first step done " in r.stdout + r.stderr and " s after launch: " in r.stdout
    # The vision-language tokens and their padding (the text slot's unused tokens), per step and in the summary.
    import zipfile
    with zipfile.ZipFile(MODEL) as z:
        shape = json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/loongforge/flops.json"))))["batch_shape"]
    samples = 8  # configs/n16-tiny.yaml: micro-batch 8, no accumulation
    assert all(x["vl_tokens"] == samples * shape["S_vl"] for x in records)
    assert all(0 < x["vl_padding_tokens"] < samples * shape["L"] for x in records)  # the bundled tasks are shorter
    pad = summary["vl_padding"]
    assert pad["vl_tokens"] == sum(x["vl_tokens"] for x in records) and pad["text_slot"] == shape["L"]
    assert pad["padding_tokens"] == sum(x["vl_padding_tokens"] for x in records)
    assert abs(pad["share"] - pad["padding_tokens"] / pad["vl_tokens"]) <= 1e-12
    assert f"padding      {100 * pad['share']:.1f}% of the vision-language tokens" in r.stdout
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["epoch_0_step_10", "epoch_0_step_20"]
    state = json.loads((run / "checkpoints/epoch_0_step_20/trainer_state.json").read_text())
    assert state["step"] == 20
    assert state["data"]["step_in_epoch"] == 20 % state["data"]["steps_per_epoch"]

    from safetensors.torch import load_file
    import torch
    weights = load_file(str(run / "checkpoints/epoch_0_step_20/model.safetensors"))
    scripted = torch.jit.load(str(MODEL))
    names = [n for n, _ in scripted.named_parameters()]
    assert list(weights) == names
    params = dict(scripted.named_parameters())
    changed = sum(1 for n in names if not torch.equal(weights[n], params[n].detach()))
    assert changed > 0  # training moved the trainable weights


def test_a_second_run_with_the_same_name_gets_a_fresh_directory(tmp_path):
    train(tmp_path, "trainer.max_steps=2")
    train(tmp_path, "trainer.max_steps=2")
    assert (tmp_path / "n16-tiny-demo").is_dir() and (tmp_path / "n16-tiny-demo-2").is_dir()


def test_a_missing_dataset_stops_with_a_message_naming_the_key_and_what_makes_it(tmp_path):
    r = train(tmp_path, "data.path=/nonexistent/ds", check=False)
    assert r.returncode == 1
    assert "config_error: invalid configuration:" in r.stderr
    assert ("--set: data.path: '/nonexistent/ds' does not exist: write it with "
            "`python3 scripts/convert_lerobot.py <lerobot dataset> /nonexistent/ds`") in r.stderr


def test_a_dataset_folder_without_a_dataset_stops_with_a_message_naming_it(tmp_path):
    r = train(tmp_path, f"data.path={tmp_path}", check=False)
    assert r.returncode == 1
    assert f"data_error: cannot read '{tmp_path}/loongforge_dataset.json'" in r.stderr


def test_a_missing_model_file_names_the_key_and_the_config_line(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model:\n  path: {tmp_path}/nope.pt\ndata:\n  path: {DATA}\n")
    r = subprocess.run([TRAIN, "--config", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 1
    assert f"{cfg}:2: model.path: '{tmp_path}/nope.pt' does not exist" in r.stderr


def test_a_model_whose_views_do_not_match_the_dataset_is_refused(tmp_path):
    two_views = tmp_path / "two-views.pt"
    subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny", "--out",
                    str(two_views), "--set", "num_views=2"], check=True, stdout=subprocess.DEVNULL,
                   env=dict(os.environ, PYTHONPATH=str(REPO / "scripts")))
    r = train(tmp_path, f"model.path={two_views}", check=False)
    assert r.returncode == 1
    assert "model expects num_views = 2" in r.stderr


def test_the_readme_demo_script_exports_converts_and_trains(tmp_path):
    # scripts/demo.sh is the README's main job after setup; here for 3 steps.
    build = Path(TRAIN).resolve().parents[2]
    r = subprocess.run(["bash", str(REPO / "scripts/demo.sh"), "--set", "trainer.max_steps=3", "--set",
                        f"run.output_dir={tmp_path}", "--set", "logging.progress=lines"],
                       capture_output=True, text=True, env=dict(os.environ, LOONGFORGE_BUILD=str(build)))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "== LoongForge run summary ==" in r.stdout
    assert (tmp_path / "n16-tiny-demo" / "checkpoints" / "epoch_0_step_3" / "MANIFEST.json").exists()
