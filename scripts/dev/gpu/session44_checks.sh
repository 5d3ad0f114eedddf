#!/usr/bin/env bash
# What session 44 built but could not run on a GPU (no machine was lent after its first calls), in one
# device call on one H100/H200 (~6-8 min): the GPU tests (LONG=0: the device pad of data.image_aspect,
# test_image_aspect_gpu, the page-locked staging of the chunked checkpoint writer in test_trainer_gpu,
# the two tests whose harness was fixed: the trainer's free port and the reference's binary), then
# the checkpoint write throughput of issue #45 on the GPU host (/dev/shm and the local disk, 16 cores:
# GB=8, THREADS=8, and staging bounded at 4096 MB, the default). Carry: .gpu-carry
# (scripts/dev/gpu/prepare_carry.sh). The headline harness with the new data defaults is separate:
# PART=prep, PART="lerobot lf", PART="ref report" (scripts/bench/headline.sh, carry .bench-carry and
# .gpu-carry/ffmpeg, which together with .gpu-carry's dataset exceed the 64 MiB carry).
#   bash scripts/dev/gpu/session44_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh" session44_checks
stamp "gpu tests (LONG=0)"
LONG=0 GPU_TEST_LINES=${GPU_TEST_LINES:-40} bash scripts/dev/gpu/gpu_tests.sh || true
stamp "checkpoint throughput"
ninja -C build-gpu bench_checkpoint > "$OUT/bench_build.log" 2>&1 || { tail -20 "$OUT/bench_build.log"; exit 1; }
BUILD=build-gpu GB=${GB:-8} THREADS=${THREADS:-8} STAGING_MB=${STAGING_MB:-4096} REPEAT=${REPEAT:-1} \
  bash scripts/bench/checkpoint.sh /dev/shm/lf-bench-ckpt "$PWD/build-gpu/bench-ckpt" 2>&1 | tee "$OUT/checkpoint.log" | tail -25
stamp "done"
