#!/usr/bin/env bash
# Fills, on the CPU machine, what scripts/dev/gpu/issue12_decode.sh carries to the
# GPU machine beside the tree (all git-ignored):
#   .gpu-carry/ffmpeg                        static FFmpeg for the C++ build (prepare_carry.sh)
#   .gpu-carry/datasets/robot_sim.PickNPlace.lf      the converted bundled dataset, h264 (prepare_carry.sh)
#   .gpu-carry/ffmpeg-bench                  shared FFmpeg, ffmpeg and ffprobe (build_ffmpeg_bench.sh)
#   .gpu-carry/datasets/robot_sim.PickNPlace.av1.lf  the tests' AV1 copy (test/data/av1_fixture.cmake:
#                                            build/test-data's, made by `ctest -R convert_av1_dataset`;
#                                            self-contained: its videos are inside it)
#   .gpu-carry/datasets/decode-digests.txt   this machine's decodes of both (system FFmpeg through the
#                                            reference's ffmpeg command and torchcodec; decode_digest.py)
#   .whl/torchcodec-0.11.1-cp312-*.whl       torchcodec for the GPU machine's Python 3.12 (PyPI's CPU
#                                            wheel, as scripts/requirements-test.txt; no Requires-Dist
#                                            but extras)
#   bash scripts/dev/gpu/prepare_decode_carry.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$repo"
python=$(cat build/python-path 2>/dev/null || { [ -x "$HOME/.cache/loongforge/venv/bin/python" ] && echo "$HOME/.cache/loongforge/venv/bin/python"; } || echo python3)
carry=.gpu-carry
[ -d "$carry/ffmpeg" ] && [ -f "$carry/datasets/robot_sim.PickNPlace.lf/loongforge_dataset.json" ] ||
  bash scripts/dev/gpu/prepare_carry.sh
bash scripts/dev/gpu/build_ffmpeg_bench.sh "$carry/ffmpeg-bench"
av1=build/test-data/robot_sim.PickNPlace.av1.lf
[ -f "$av1/loongforge_dataset.json" ] ||
  { echo "prepare_decode_carry: $av1 missing: cd build && ctest -R convert_av1_dataset" >&2; exit 1; }
rm -rf "$carry/datasets/robot_sim.PickNPlace.av1.lf"
cp -r "$av1" "$carry/datasets/robot_sim.PickNPlace.av1.lf"
# The digests come from the system FFmpeg: /usr/bin first, no LD_LIBRARY_PATH.
env -u LD_LIBRARY_PATH PATH="/usr/bin:$PATH" "$python" scripts/dev/gpu/decode_digest.py \
  "$carry/datasets/robot_sim.PickNPlace.lf" "$carry/datasets/robot_sim.PickNPlace.av1.lf" \
  > "$carry/datasets/decode-digests.txt"
ls .whl/torchcodec-0.11.1-cp312-*.whl >/dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl torchcodec==0.11.1
du -sh "$carry/ffmpeg" "$carry/ffmpeg-bench" "$carry/datasets/robot_sim.PickNPlace.lf" \
  "$carry/datasets/robot_sim.PickNPlace.av1.lf" .whl/torchcodec-0.11.1-cp312-*.whl
