#!/usr/bin/env bash
# A Python 3.12 on the CPU machine that stands for the GPU machine's /opt/torch/.venv (Python 3.12.3),
# so that part (a) of scripts/bench/headline.sh (LeRobot 0.6.1 needs Python >= 3.12) runs here first:
# ~/.cache/loongforge/py312, a venv of pyenv's 3.12 with the packages the GPU image already has, at the
# versions known for it (torch 2.11.0, torchvision 0.26.0, numpy 2.5.2, huggingface_hub 1.33.0, accelerate
# 1.15.0, safetensors 0.8.0, tokenizers 0.23.2, transformers 5.17.0, as a GPU session's pip list showed
# them) and PyPI's current release of the others it has whose versions are not known here (pandas,
# pyarrow, peft, timm, regex, ...).
# The carried wheels (scripts/bench/prepare_carry.sh) are then installed over it exactly as on the GPU
# machine, into a --target folder put first on PYTHONPATH (headline.sh's lerobot_env).
# PyPI's torch 2.11.0 for Linux is its CUDA build (with the nvidia-* wheels, several GB); it runs on the CPU.
#   bash scripts/bench/setup_py312.sh
set -euo pipefail
venv=${PY312_VENV:-$HOME/.cache/loongforge/py312}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, transformers, pynvml, psutil" 2>/dev/null; then
  echo "py312: present at $venv"; exit 0
fi
py=""
for c in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
  [ -x "$c" ] && py=$c && break
done
[ -n "$py" ] || { echo "no Python 3.12: pyenv install 3.12 (or apt-get install python3.12 where Debian has it)" >&2; exit 1; }
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/pip" install -q torch==2.11.0 torchvision==0.26.0 numpy==2.5.2 huggingface_hub==1.33.0 accelerate==1.15.0 \
  safetensors==0.8.0 tokenizers==0.23.2 transformers==5.17.0 pandas pyarrow pillow opencv-python-headless einops psutil \
  nvidia-ml-py matplotlib peft timm regex fsspec httpx xxhash cloudpickle typing-inspect requests tqdm pyyaml packaging \
  jinja2 filelock absl-py wrapt attrs pytest
"$venv/bin/python" -c "import sys, torch; print('py312:', sys.version.split()[0], 'torch', torch.__version__)"
