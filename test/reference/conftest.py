"""Shared by the tests of test/reference/: the import paths of the reference trainer's
modules (scripts/, scripts/reference/) and of test/lerobot_oracle.py, and upstream's N1.7
image transform compiled from the lerobot wheel."""
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


@pytest.fixture(scope="module")
def upstream_transform():
    """lerobot 0.6.1's `_transform_n1_7_image_for_vlm_torch`, compiled alone from the wheel's source
    (test/lerobot_oracle.py; the module itself imports cv2 and transformers' Qwen3-VL processors,
    which the transform does not need)."""
    import torchvision.transforms.v2.functional as tv_functional
    from torchvision.transforms import InterpolationMode
    source = (lerobot_oracle.unpacked_wheel() / UPSTREAM).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == TRANSFORM)
    namespace = {"torch": torch, "tv_functional": tv_functional, "InterpolationMode": InterpolationMode}
    exec(compile(ast.Module(body=[node], type_ignores=[]), UPSTREAM, "exec"), namespace)
    return namespace[TRANSFORM]
