"""Loss parity: loongforge-train (C++) and the reference PyTorch trainer
(scripts/reference/train_torch.py --mode parity) train n16-tiny for 200 steps
on the bundled PickNPlace dataset on the CPU in fp32, from the same model
file, data order and flow-matching draws (docs/training-semantics.md). Their
per-step losses agree to a relative 1e-4 -- with the whole model trainable,
with gradient accumulation 4, with GR00T's default frozen backbone, with
mean/std normalization, and with the episode-aware sample order. The GR00T head (gr00t-tiny, dropouts off, upstream's flow-matching
time) gives the same losses in both trainers too, bit for bit over 10 steps, also
with an upstream N1.7 processor record (scripts/gr00t_processor.py: the
checkpoint's q01/q99 statistics, clipping, relative action groups, 12 counted
rows, state dropout 0.3, embodiment slot 7), which loongforge-train refuses to
combine with another data.embodiment_id, and with an Isaac-GR00T N1.6 record
(numpy's float64 / float32 min-max, q01/q99, relative groups with 12 counted
rows and statistics rows, slot 7).

Environment (set by ctest): LOONGFORGE_TRAIN (the binary), LOONGFORGE_TEST_DATASET
(converted dataset), LOONGFORGE_TEST_MODELS (scratch folder), LOONGFORGE_PARITY_STEPS
(default 200; ctest's e2e_parity runs 60 to stay in the suite's budget, e2e_parity_long
the full 200 under the long label). Each case's numbers are written to <scratch>/parity-<case>.json.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = os.environ.get("LOONGFORGE_TEST_DATASET", str(REPO / "build/test-data/robot_sim.PickNPlace.lf"))
SCRATCH = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models")))
STEPS = int(os.environ.get("LOONGFORGE_PARITY_STEPS", "200"))
TOLERANCE = 1e-4

CASES = {
    # name: (export --set overrides, trainer --set overrides)
    "full": (["tune_visual=true", "tune_llm=true"], []),
    "accumulation4": (["tune_visual=true", "tune_llm=true"], ["trainer.gradient_accumulation_steps=4",
                                                              "trainer.micro_batch_size=4"]),
    "frozen_backbone": ([], []),
    "mean_std_normalization": ([], ["data.normalization=mean_std"]),
    "episode_sampler": ([], ["data.sampler=episode", "data.open_episodes=2", "data.shuffle_buffer=64"]),
    # GR00T N1.7's image transform (training-semantics s3): 256 -> 72 bicubic, crop 65, -> 48 (the
    # target), then -> 64 as upstream's processor resizes a target below its minimum again
    "bicubic_resample": (["image_resample=bicubic_aa", "image_crop_fraction=0.9", "image_resize_edge=72",
                          "image_target_size=48"], []),
    # the transform of N1.7 checkpoints saved with use_albumentations: 256 -> 72 by OpenCV's
    # INTER_AREA (area weights), crop int(72 * 0.9) = 64, back up to 72 (INTER_AREA's linear
    # coefficients), then -> 64 by the processor's bicubic
    "cv2_area_resample": (["image_resample=cv2_area", "image_crop_fraction=0.9", "image_target_size=72"], []),
    # Isaac-GR00T N1.6's torchvision transform: 256 -> 72 antialiased bilinear, torchvision's center
    # crop round(72 * 0.9) = 65 from round(3.5) = 4, back to 72, then -> 64
    "bilinear_resample": (["image_resample=bilinear_aa", "image_crop_fraction=0.9", "image_target_size=72"], []),
    # the same with upstream's train-time window: each sample's crop where its drawn position says
    "cv2_area_random_crop": (["image_resample=cv2_area", "image_crop_fraction=0.9", "image_target_size=72",
                              "image_random_crop=true"], []),
    # Isaac-GR00T N1.6's train-time transform: torchvision's RandomCrop, a window per view at offsets
    # floor(8 * pos) of the 8 a 65-pixel crop of 72 has
    "bilinear_random_crop": (["image_resample=bilinear_aa", "image_crop_fraction=0.9", "image_target_size=72",
                              "image_random_crop=true"], []),
}


def export(name, sets, config="n16-tiny", processor=None):
    """The model file of a case, exported once into the scratch folder; written under a name of its own
    and renamed, so that parity tests running side by side never read a half-written file."""
    out = SCRATCH / f"parity-{name}.pt"
    if not out.exists():
        part = out.with_name(f"{out.stem}.{os.getpid()}.part.pt")
        cmd = [sys.executable, str(REPO / "scripts/model/export.py"), "--config", config, "--out", str(part)]
        for s in sets:
            cmd += ["--set", s]
        if processor:
            cmd += ["--processor", str(processor)]
        subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=str(REPO / "scripts")),
                       stdout=subprocess.DEVNULL)
        os.replace(part, out)
    return out


def losses(metrics_path):
    with open(metrics_path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def cpp_args(tmp_path, model, steps, train_sets):
    """loongforge-train's arguments for one model file (the reference trainer reads the same)."""
    sets = [f"model.path={model}", f"data.path={DATA}", f"trainer.max_steps={steps}", "run.device=cpu",
            "precision.mode=fp32", "logging.progress=off", "checkpoint.interval_steps=100000", "run.deterministic=true",
            f"run.output_dir={tmp_path}", "run.name=cpp"] + train_sets
    cpp = ["--config", str(REPO / "configs/n16-tiny.yaml")]
    for s in sets:
        cpp += ["--set", s]
    return cpp


def run_cpp(tmp_path, model, steps, train_sets):
    """loongforge-train on one model file -> its losses."""
    subprocess.run([TRAIN] + cpp_args(tmp_path, model, steps, train_sets), check=True, stdout=subprocess.DEVNULL)
    return losses(tmp_path / "cpp" / "metrics.jsonl")


def run_both(tmp_path, model, steps, train_sets):
    """loongforge-train and the reference trainer on one model file, side by side on one thread each
    (run.threads=1: two processes sharing nothing but their inputs; with two threads each on the 2-core
    machine their OpenMP workers spun against each other and a part of this file took 185 s instead of
    117 s one after the other) -> (C++ losses, reference losses)."""
    cpp = cpp_args(tmp_path, model, steps, train_sets + ["run.threads=1"])
    ref = [sys.executable, str(REPO / "scripts/reference/train_torch.py"), "--mode", "parity",
           "--loongforge-train", TRAIN, "--out", str(tmp_path / "torch")] + cpp
    procs = [subprocess.Popen([TRAIN] + cpp, stdout=subprocess.DEVNULL),
             subprocess.Popen(ref, stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(REPO / "scripts")))]
    codes = [p.wait() for p in procs]
    assert codes == [0, 0], f"exit codes (loongforge-train, reference): {codes}"
    return losses(tmp_path / "cpp" / "metrics.jsonl"), losses(tmp_path / "torch" / "metrics.jsonl")


@pytest.mark.parametrize("case", list(CASES))
def test_cpp_and_reference_losses_agree_step_by_step(case, tmp_path):
    export_sets, train_sets = CASES[case]
    a, b = run_both(tmp_path, export(case, export_sets), STEPS, train_sets)
    assert len(a) == len(b) == STEPS
    rel = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)]
    worst = max(range(STEPS), key=lambda i: rel[i])
    report = {"case": case, "steps": STEPS, "max_rel_diff": rel[worst], "at_step": worst + 1,
              "cpp_loss": a[worst], "torch_loss": b[worst], "first_loss": a[0], "last_loss": a[-1],
              "bitwise_equal_steps": sum(1 for x, y in zip(a, b) if x == y)}
    (SCRATCH / f"parity-{case}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    assert rel[worst] <= TOLERANCE, report
    if case != "episode_sampler":  # its first and last steps read other episodes: their losses do not compare
        assert a[-1] < a[0], "training should lower the loss over the run"


def test_the_gr00t_head_with_upstreams_flow_matching_time_gives_the_same_losses_in_both_trainers(tmp_path):
    """gr00t-tiny draws t = (1 - Beta(1.5, 1)) * 0.999 (fm_time upstream) in both trainers; with the
    head's dropouts off (their masks are drawn inside the model) the losses are equal bit for bit."""
    model = export("gr00t-tiny", ["gr00t_dropout=0", "gr00t_state_dropout=0"], config="gr00t-tiny")
    a, b = run_both(tmp_path, model, 10, [])
    print(f"gr00t-tiny, 10 steps: C++ {a[0]:.6f} -> {a[-1]:.6f}, reference {b[0]:.6f} -> {b[-1]:.6f}")
    assert len(a) == len(b) == 10 and a == b


def processor_model(tmp_path, form="n17"):
    """gr00t-tiny (dropouts off) exported with an N1.7 (or N1.6) processor record of a checkpoint whose
    sidecars test/gr00t_sidecars.py writes from the dataset itself."""
    sys.path.insert(0, str(REPO / "scripts")), sys.path.insert(0, str(REPO / "scripts/reference"))
    sys.path.insert(0, str(REPO / "test"))
    import lf_dataset
    from gr00t_processor import n16_processor_record, n17_processor_record
    from gr00t_sidecars import write_checkpoint
    settings = (dict(rows=20, delta=12, use_percentiles=True, state_dropout_prob=0.3) if form == "n17" else
                dict(rows=12, delta=12, use_percentiles=True, use_relative_action=True))
    folder = write_checkpoint(tmp_path / "ck", lf_dataset.LFDataset(DATA), "robot", relative=("left_arm", "neck"),
                              **settings)
    (folder / "embodiment_id.json").write_text(json.dumps({"robot": 7}))
    kw = json.loads((folder / "processor_config.json").read_text())["processor_kwargs"]
    record = tmp_path / "processor.json"
    make = n17_processor_record if form == "n17" else n16_processor_record
    record.write_text(json.dumps(make(folder, kw, "robot")))
    return export(f"gr00t-tiny-{form}-processor", ["gr00t_dropout=0", "gr00t_state_dropout=0"], config="gr00t-tiny",
                  processor=record)


def test_an_isaac_gr00t_n16_processor_record_gives_the_same_losses_in_both_trainers(tmp_path):
    model = processor_model(tmp_path, "n16")
    a, b = run_both(tmp_path, model, 10, [])
    print(f"gr00t-tiny with an N1.6 processor record, 10 steps: C++ {a[0]:.6f} -> {a[-1]:.6f}, "
          f"reference {b[0]:.6f} -> {b[-1]:.6f}")
    assert len(a) == len(b) == 10 and a == b


def test_an_upstream_n17_processor_record_gives_the_same_losses_in_both_trainers(tmp_path):
    model = processor_model(tmp_path)
    a, b = run_both(tmp_path, model, 10, [])
    print(f"gr00t-tiny with an N1.7 processor record, 10 steps: C++ {a[0]:.6f} -> {a[-1]:.6f}, "
          f"reference {b[0]:.6f} -> {b[-1]:.6f}")
    assert len(a) == len(b) == 10 and a == b
    # the same model without the record trains on other inputs: the record is what both read
    plain = export("gr00t-tiny", ["gr00t_dropout=0", "gr00t_state_dropout=0"], config="gr00t-tiny")
    c = run_cpp(tmp_path / "plain", plain, 1, [])
    assert c[0] != a[0]
    bad = subprocess.run([TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={model}",
                          "--set", f"data.path={DATA}", "--set", "run.device=cpu", "--set", "data.embodiment_id=3",
                          "--set", f"run.output_dir={tmp_path / 'bad'}", "--set", "trainer.max_steps=1"],
                         capture_output=True, text=True)
    assert bad.returncode != 0
    assert "data.embodiment_id=3 (set at --set): the model" in bad.stderr and "slot 7" in bad.stderr, bad.stderr


def float64_dataset():
    """The bundled dataset converted with --keep-float64, once into the scratch folder (into a folder of
    its own and renamed, as export() does, so that the float64 cases running side by side share it)."""
    out = SCRATCH / "picknplace64.lf"
    if not out.exists():
        source = Path(os.environ.get("LOONGFORGE_PICKNPLACE", REPO.parent / "shared/datasets/robot_sim.PickNPlace"))
        part = out.with_name(f"{out.name}.{os.getpid()}.part")
        subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), "--overwrite", str(source), str(part),
                        "--keep-float64", "--quiet"], check=True, env=dict(os.environ, PYTHONPATH=str(REPO / "scripts")))
        try:
            part.rename(out)
        except OSError:  # another case renamed its copy first: the same conversion
            shutil.rmtree(part)
    return out


FLOAT64_FORMS = {"dataset_form": None, "n17_record": "n17", "n16_record": "n16"}


@pytest.mark.parametrize("form", list(FLOAT64_FORMS))
def test_float64_data_gives_the_same_losses_in_both_trainers_with_and_without_a_processor_record(form, tmp_path):
    """A dataset converted with --keep-float64 (its float64 state and actions kept, as upstream reads
    them): the dataset form, an N1.7 record and an N1.6 record each give the same losses in both
    trainers over 10 steps, and other losses than the float32 shards give (at some of the 10 steps)."""
    data64 = float64_dataset()
    record = FLOAT64_FORMS[form]
    model = (processor_model(tmp_path / record, record) if record else
             export("gr00t-tiny", ["gr00t_dropout=0", "gr00t_state_dropout=0"], config="gr00t-tiny"))
    a, b = run_both(tmp_path / "f64", model, 10, [f"data.path={data64}"])
    c = run_cpp(tmp_path / "f32", model, 10, [])
    differ = sum(x != y for x, y in zip(a, c))
    print(f"float64 data, {form}: C++ {a[0]:.9f} -> {a[-1]:.9f}, reference {b[0]:.9f} -> {b[-1]:.9f}; "
          f"the float32 shards' losses differ at {differ} of 10 steps")
    assert len(a) == len(b) == 10 and a == b
    assert differ > 0
