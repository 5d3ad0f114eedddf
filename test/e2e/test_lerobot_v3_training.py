"""loongforge-train on a LeRobot v3.0 dataset: the v3.0 copy of the bundled
robot_sim.PickNPlace made by LeRobot 0.6.1's own v2.1 -> v3.0 tool
(test/lerobot_oracle.py make_v30_copy) and converted by
scripts/convert_lerobot.py trains to the same losses as the v2.0 original
(3 steps on two episodes; the per-episode videos are cut out of LeRobot's
shared mp4 and checked by the trainer like any other). The two datasets'
normalization stats come from different tools (GR00T's stats.json, stored
rounded to float32, and LeRobot's recomputation), so the losses are compared
within 1e-6 relative (when this test was written they were bit-identical).

Environment as in test_train_run.py (set by ctest).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("LOONGFORGE_TRAIN", str(REPO / "build/src/daemon/loongforge-train"))
MODEL = Path(os.environ.get("LOONGFORGE_TEST_MODELS", str(REPO / "build/test-models"))) / "n16-tiny.pt"
FIXTURE = Path(os.environ.get("LOONGFORGE_PICKNPLACE",
                              REPO.parent / "shared" / "datasets" / "robot_sim.PickNPlace")).resolve()
sys.path.insert(0, str(REPO / "test"))
import lerobot_oracle  # noqa: E402


def convert(src, dst):
    subprocess.run([sys.executable, str(REPO / "scripts/convert_lerobot.py"), str(src), str(dst), "--episodes", "0,1",
                    "--quiet"], check=True, env=dict(os.environ, PYTHONPATH=str(REPO / "scripts")))


def losses(tmp_path, data, name):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
           "--set", f"data.path={data}", "--set", f"run.output_dir={tmp_path / name}", "--set", "trainer.max_steps=3",
           "--set", "logging.interval_steps=1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / name / "n16-tiny-demo/metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_a_lerobot_v3_copy_trains_to_the_losses_of_the_v2_original(tmp_path):
    v3 = lerobot_oracle.make_v30_copy(FIXTURE, tmp_path / "lerobot")
    shutil.copyfile(FIXTURE / "meta/modality.json", v3 / "meta/modality.json")
    convert(FIXTURE, tmp_path / "from_v2")
    convert(v3, tmp_path / "from_v3")
    a, b = losses(tmp_path, tmp_path / "from_v2", "a"), losses(tmp_path, tmp_path / "from_v3", "b")
    assert len(a) == len(b) == 3
    assert all(abs(x - y) <= 1e-6 * abs(x) for x, y in zip(a, b)), (a, b)
