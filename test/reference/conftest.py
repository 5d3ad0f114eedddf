"""Shared by the tests of test/reference/: the import paths of the reference trainer's
modules (scripts/, scripts/reference/) and of test/lerobot_oracle.py, upstream's N1.7
image transform compiled from the lerobot wheel, and the bundled dataset converted with
--keep-float64 (ds64)."""
import ast
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
for p in (REPO / "scripts", REPO / "scripts" / "reference", REPO / "test"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import lerobot_oracle  # noqa: E402

UPSTREAM = "lerobot/policies/groot/processor_groot.py"
TRANSFORM = "_transform_n1_7_image_for_vlm_torch"
ALBUMENTATIONS = "_transform_n1_7_image_for_vlm_albumentations"


def _upstream_function(name: str, namespace: dict):
    """A top-level function of upstream's processor_groot.py, compiled alone from the wheel's source
    (test/lerobot_oracle.py) into `namespace`."""
    source = (lerobot_oracle.unpacked_wheel() / UPSTREAM).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), UPSTREAM, "exec"), namespace)
    return namespace[name]


@pytest.fixture(scope="module")
def upstream_transform():
    """lerobot 0.6.1's `_transform_n1_7_image_for_vlm_torch`, compiled alone from the wheel's source
    (test/lerobot_oracle.py; the module itself imports cv2 and transformers' Qwen3-VL processors,
    which the transform does not need)."""
    import torchvision.transforms.v2.functional as tv_functional
    from torchvision.transforms import InterpolationMode
    return _upstream_function(TRANSFORM, {"torch": torch, "tv_functional": tv_functional,
                                          "InterpolationMode": InterpolationMode})


@pytest.fixture(scope="module")
def upstream_albumentations_transform():
    """lerobot 0.6.1's `_transform_n1_7_image_for_vlm_albumentations` (checkpoints saved with
    use_albumentations: OpenCV's INTER_AREA), compiled alone from the wheel's source."""
    import cv2
    import numpy as np
    return _upstream_function(ALBUMENTATIONS, {"np": np, "cv2": cv2})


@pytest.fixture(scope="module")
def ds64(tmp_path_factory):
    """The bundled dataset converted with --keep-float64: its float64 state and action kept."""
    import os
    import subprocess

    import numpy as np

    import lf_dataset
    from test_reference import SOURCE
    out = tmp_path_factory.mktemp("ds64") / "picknplace64.lf"
    subprocess.run([sys.executable, str(REPO / "scripts" / "convert_lerobot.py"), str(SOURCE), str(out),
                    "--keep-float64", "--quiet"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO / "scripts")})
    data = lf_dataset.LFDataset(out)
    assert data.array(0, "observation.state").dtype == np.float64
    return data
