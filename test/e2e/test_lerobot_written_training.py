"""loongforge-train on datasets written by LeRobot's own writers (run from the wheels:
test/lerobot_oracle.py write_lerobot_dataset) and converted by
scripts/convert_lerobot.py: LeRobot 0.6.1's v3.0 with one camera and every episode
in one shared video file trains with n16-tiny; its v3.0 with two cameras (one 4:3,
64x48) and episodes spread over chunked data and video files, and LeRobot 0.3.3's
v2.1 with the same two cameras, train with an n16-tiny exported for two views;
3 steps each, every loss finite, and `loongforge validate-dataset` passes each
converted dataset first (its AV1 videos decoded with --full).
(That their samples equal LeRobot's own reader's: test/data/test_lerobot_reader_oracle.py.)

Environment as in test_train_run.py (set by ctest), and LOONGFORGE_CLI.
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
CLI = os.environ.get("LOONGFORGE_CLI", str(REPO / "build/cli/loongforge"))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"
for p in (REPO / "test", REPO / "test/data"):
    sys.path.insert(0, str(p))
import lerobot_oracle  # noqa: E402
from test_lerobot_datasets import ONE_CAMERA, TWO_CAMERAS, V21  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))


def convert(src, dst):
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(src), str(dst), "--quiet"],
                   check=True, env=ENV)


def losses(tmp_path, data, model, name):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={model}",
           "--set", f"data.path={data}", "--set", f"run.output_dir={tmp_path / name}", "--set", "trainer.max_steps=3",
           "--set", "logging.interval_steps=1", "--set", "trainer.micro_batch_size=4"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = (tmp_path / name / "n16-tiny-demo/metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines], r.stderr


@pytest.fixture(scope="module")
def two_view_model(tmp_path_factory):
    """n16-tiny exported for two views (the model takes one image per camera)."""
    model = tmp_path_factory.mktemp("model") / "n16-tiny-2views.pt"
    subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny", "--out", str(model),
                    "--set", "num_views=2"], check=True, env=ENV, capture_output=True)
    return model


@pytest.mark.parametrize("name,spec,views", [("one_camera", ONE_CAMERA, 1), ("two_cameras", TWO_CAMERAS, 2),
                                             ("v21", V21, 2)])
def test_a_dataset_written_by_lerobot_converts_validates_and_trains(tmp_path, two_view_model, name, spec, views):
    root = lerobot_oracle.write_lerobot_dataset(tmp_path / name, spec)
    data = tmp_path / f"{name}.lf"
    convert(root, data)
    r = subprocess.run([CLI, "validate-dataset", str(data), "--full"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "VALID"
    got, log = losses(tmp_path, data, MODEL if views == 1 else two_view_model, "run")
    assert len(got) == 3 and all(math.isfinite(x) and x > 0 for x in got), got
    # The run's start line says what the model's resize does with each camera's aspect (issue #44).
    if name == "two_cameras":
        assert "'observation.images.front' 64x48 (4:3 = 1.333) squashed (width x0.750 relative to height)" in log
        assert "'observation.images.wrist' 32x32 kept" in log
