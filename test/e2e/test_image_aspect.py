"""data.image_aspect through both trainers, on a real 4:3 camera (the bundled dataset's episode 0
re-encoded at 320x240 by test/data/make_aspect_dataset.py, the ctest fixture aspect_dataset):

- the reference trainer's images (scripts/reference/lf_dataset.py) are, with crop, the box resize
  of the frame's center 240x240 square and, with pad, 8 black rows (-1), the frame's own 5x5 block
  means, then 8 black rows (a 320x320 square in 64x64);
- with crop and with pad, loongforge-train and the reference trainer give the same losses, gradient
  norms, learning rates and valid counts bit for bit (one intra-op thread, as test_reference.py's
  bit_identical_runs), losses that are not squash's, and loongforge-train's start line says the
  camera is cropped to 240x240 or padded to 320x320;
- a model imported from an upstream GR00T checkpoint (an n16-tiny exported with an N1.6 processor
  record, as the import writes it for a box-resize N1.6 checkpoint) keeps upstream's preprocessing:
  its start line says so (squashed), loongforge-train refuses data.image_aspect=crop at start naming
  the key, the model, why and the fix, and so does the reference.

Environment (set by ctest): LOONGFORGE_TRAIN, LOONGFORGE_TEST_ASPECT_DATASET, LOONGFORGE_TEST_MODELS
(n16-tiny.pt, the tiny_model fixture).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
DATA = Path(os.environ.get("LOONGFORGE_TEST_ASPECT_DATASET", str(REPO / "build/test-data/picknplace-4x3.lf")))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"
for p in (REPO / "scripts", REPO / "scripts/reference"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
import lf_dataset as lfd  # noqa: E402
import train_torch  # noqa: E402
from model.config import get_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings(r"ignore:.*torch\.jit\.\w+` is deprecated:DeprecationWarning")
CAMERA_LINE = {"crop": "'observation.images.ego_view' 320x240 (4:3 = 1.333) cropped to 240x240 (80 columns cut, "
                       "25.0% of the width), 416 frames in 1 episode(s)",
               "pad": "'observation.images.ego_view' 320x240 (4:3 = 1.333) padded to 320x320 (80 zero rows, "
                      "25.0% of the square), 416 frames in 1 episode(s)"}


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()  # train_torch.main(--threads 1) changes it process-wide
    yield
    torch.set_num_threads(n)


def builder(aspect, processor=None):
    cfg = {"run": {"seed": 42}, "trainer": {"micro_batch_size": 8, "gradient_accumulation_steps": 1},
           "data": {"action_horizon": 16, "max_text_len": 32, "embodiment_id": 0, "normalization": "min_max",
                    "shuffle": True, "image_aspect": aspect}}
    return lfd.SampleBuilder(lfd.LFDataset(DATA), get_config("n16-tiny"), cfg, processor=processor)


def normalised(pooled):
    return ((pooled / 255) - 0.5) / 0.5


def test_the_reference_crops_the_4_by_3_camera_to_its_center_square_or_pads_it_with_black_rows():
    crop, pad = builder("crop"), builder("pad")
    for row in (0, 207, 415):
        frame = torch.from_numpy(crop.rgb_frame(0, crop.cameras[0], row).astype(np.float32)).permute(2, 0, 1)
        assert frame.shape == (3, 240, 320)
        square = F.adaptive_avg_pool2d(frame[:, :, 40:280].contiguous(), (64, 64))        # columns 40..279
        assert torch.equal(crop.sample(row)["images"][0], normalised(square))
        padded = pad.sample(row)["images"][0]                                             # (3, 64, 64)
        assert torch.equal(padded[:, :8], torch.full((3, 8, 64), -1.0))
        assert torch.equal(padded[:, 56:], torch.full((3, 8, 64), -1.0))
        assert torch.equal(padded[:, 8:56], normalised(F.adaptive_avg_pool2d(frame.contiguous(), (48, 64))))


def train_cpp(out, sets):
    """loongforge-train (n16-tiny.yaml, the 4:3 dataset, + sets) writing under out. -> the finished process."""
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"data.path={DATA}",
           "--set", f"run.output_dir={out}", "--set", "logging.progress=off", "--set", "logging.tensorboard=false",
           "--set", "checkpoint.interval_steps=1000"]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def bit_identical_runs(tmp_path, sets):
    """loongforge-train and the parity reference on one thread (as test_reference.py's bit_identical_runs):
    every step's loss, grad_norm, lr and num_valid equal bit for bit. -> (the C++ metrics records, its stderr)."""
    sets = sets + [f"model.path={MODEL}", f"data.path={DATA}", "logging.interval_steps=100"]
    p = train_cpp(tmp_path / "cpp", sets)
    assert p.returncode == 0, p.stderr[-2000:]
    cpp = [json.loads(line) for line in next((tmp_path / "cpp").glob("*/metrics.jsonl")).read_text().splitlines()]
    args = ["--config", str(REPO / "configs/n16-tiny.yaml"), "--threads", "1", "--out", str(tmp_path / "py")]
    for s in sets:
        args += ["--set", s]
    assert train_torch.main(args) == 0
    py = [json.loads(line) for line in (tmp_path / "py" / "metrics.jsonl").read_text().splitlines()]
    for key in ("step", "loss", "grad_norm", "lr", "num_valid"):
        assert [r[key] for r in cpp] == [r[key] for r in py], key
    return cpp, p.stderr


@pytest.fixture(scope="module")
def squash_first_loss(tmp_path_factory):
    """The first step's loss with data.image_aspect left at squash (the start line checked on the way)."""
    out = tmp_path_factory.mktemp("squash")
    r = train_cpp(out, [f"model.path={MODEL}", "trainer.max_steps=1"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("cameras (image_resample box, 64x64 input): 'observation.images.ego_view' 320x240 (4:3 = 1.333) "
            "squashed (width x0.750 relative to height), 416 frames in 1 episode(s)") in r.stderr, r.stderr[-2000:]
    return json.loads(next(out.glob("*/metrics.jsonl")).read_text().splitlines()[0])["loss"]


@pytest.mark.parametrize("aspect", ["crop", "pad"])
def test_both_trainers_give_bit_identical_losses_with_the_camera_cropped_or_padded(aspect, tmp_path,
                                                                                  squash_first_loss):
    got, log = bit_identical_runs(tmp_path / aspect, ["trainer.max_steps=2", f"data.image_aspect={aspect}"])
    assert f"cameras (image_resample box, image_aspect {aspect}, 64x64 input): {CAMERA_LINE[aspect]}" in log, log
    assert got[0]["loss"] != squash_first_loss  # the model sees other images than the squashed ones


def test_a_model_imported_from_an_upstream_checkpoint_refuses_another_image_aspect_at_start(tmp_path):
    # an N1.6 processor record on the dataset's statistics, as the import of an N1.6 checkpoint whose
    # processor_config.json names no image_target_size writes it (box resize: convert_gr00t_checkpoint.py)
    record = {"form": "gr00t_n16", "clip": True, "stats": "dataset", "stats_source": "the dataset's min / max",
              "embodiment_id": 0, "embodiment_tag": "new_embodiment"}
    (tmp_path / "processor.json").write_text(json.dumps(record))
    model = tmp_path / "imported.pt"
    subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny", "--out", str(model),
                    "--processor", str(tmp_path / "processor.json")], check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=str(REPO / "scripts")))
    r = train_cpp(tmp_path / "run", [f"model.path={model}", "trainer.max_steps=1", "data.image_aspect=crop"])
    assert r.returncode != 0
    assert (f"data.image_aspect=crop: the model {model} was imported from an upstream GR00T N1.6 checkpoint "
            "(batch_spec.json processor) and keeps upstream's image preprocessing (image_resample box: a frame "
            "that is not square is squashed), as its weights were trained; remove data.image_aspect (or set it to "
            "squash)") in r.stderr, r.stderr[-2000:]
    # the start line, said before the refusal, names upstream's preprocessing and what it does with the camera
    assert ("cameras (image_resample box, 64x64 input; upstream GR00T N1.6's preprocessing): "
            "'observation.images.ego_view' 320x240 (4:3 = 1.333) squashed (width x0.750 relative to height)") \
        in r.stderr, r.stderr[-2000:]
    assert not list((tmp_path / "run").glob("*/metrics.jsonl"))  # no step was taken
    with pytest.raises(ValueError, match=r"data.image_aspect=crop: the model was imported from an upstream GR00T "
                                         r"checkpoint \(batch_spec.json processor gr00t_n16\)"):
        builder("crop", processor=record)
    assert builder("squash", processor=record).aspect == "squash"  # the default is upstream's own
