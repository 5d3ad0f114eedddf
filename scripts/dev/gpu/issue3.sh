#!/usr/bin/env bash
# One device call for issue #3 on an H200: build LoongForge there (CUDA on,
# carried static FFmpeg), run the GPU tests, export n16-1b, then train it for
# 300 bf16 steps with loongforge-train and with the reference PyTorch trainer
# (baseline mode) on the same data order. Logs and metrics go to $OUT.
#
# Carry: .gpu-carry (ffmpeg-static prefix + converted dataset), made by
#   bash scripts/dev/gpu/prepare_carry.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" issue3

stamp "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
nproc; git rev-parse --short HEAD 2>/dev/null || true

stamp "build (CUDA on, static FFmpeg from .gpu-carry)"
bash scripts/dev/gpu/build.sh || exit 1
stamp "GPU tests"
ctest --test-dir build-gpu -L gpu --output-on-failure 2>&1 | tail -15

stamp "export n16-1b"
mkdir -p build-gpu/models
PYTHONPATH=scripts python3 scripts/model/export.py --config n16-1b --out build-gpu/models/n16-1b.pt | tail -8

cfg=configs/bench/n16-1b-h200.yaml
steps=${STEPS:-300}
stamp "loongforge-train: $cfg, $steps steps"
build-gpu/src/daemon/loongforge-train --config $cfg --set trainer.max_steps=$steps --set run.output_dir=/tmp/runs \
  --set logging.progress=lines 2>&1 | tail -25
cp /tmp/runs/n16-1b-h200/metrics.jsonl "$OUT/cpp_metrics.jsonl"
cp /tmp/runs/n16-1b-h200/summary.json "$OUT/cpp_summary.json"

stamp "reference PyTorch trainer (baseline mode: bf16 autocast, DataLoader workers, fused AdamW)"
PYTHONPATH=scripts python3 scripts/reference/train_torch.py --config $cfg --set trainer.max_steps=$steps \
  --set run.output_dir=/tmp/runs --mode baseline --loongforge-train build-gpu/src/daemon/loongforge-train \
  --out /tmp/runs/torch 2>&1 | tail -25
cp /tmp/runs/torch/metrics.jsonl "$OUT/torch_metrics.jsonl"
cp /tmp/runs/torch/summary.json "$OUT/torch_summary.json"
stamp "done"
