#!/usr/bin/env bash
# Builds the decoding stack that LeRobot 0.6.1's dataset code needs on the GPU
# machine (which has no FFmpeg): a minimal *shared* FFmpeg 7.1 from Debian 13's
# source package, its `ffprobe` (scripts/convert_lerobot.py probes videos with
# it) and `ffmpeg` (the reference trainer, scripts/reference/lf_dataset.py,
# decodes each video with the ffmpeg CLI to raw yuv420p; without one it falls
# back to OpenCV, whose PyPI wheels have no software AV1 decoder), and a PyAV
# 15.1.0 wheel built from PyPI's sdist against it.
#
# Why not PyPI's PyAV wheel: it bundles a full FFmpeg and is 40 MB, more than
# the GPU call's 64 MiB carry leaves (docs/benchmarks.md, the headline harness). PyAV >= 15
# (lerobot 0.6.1 requires av >= 15, and imports it in lerobot.datasets.video_utils)
# needs FFmpeg >= 7, so Debian 12's 5.1 will not do; torchcodec (LeRobot's default
# decoder) loads FFmpeg 7's sonames through its libtorchcodec_core7.so.
#
#   bash scripts/bench/build_ffmpeg7_shared.sh [PREFIX]   (default ~/.cache/loongforge/ffmpeg7-shared)
#
# Decoders: h264, hevc, AV1 through libdav1d (linked in statically, from the
# prefix scripts/dev/gpu/build_ffmpeg_static.sh builds), mjpeg; the mp4/mov and
# matroska demuxers and muxers (LeRobot's v2.1 -> v3.0 conversion remuxes mp4s
# with PyAV), the parsers and bitstream filters those need, and the filters
# torchcodec's and PyAV's filter graphs use. The source is fetched with apt-get
# under a private apt configuration (a deb-src entry for trixie in
# ~/.cache/loongforge/bench-apt), so the system's apt sources stay as they are.
# Idempotent: does nothing when PREFIX already holds libavcodec.so.61, bin/ffmpeg and the av wheel. A
# prefix from before bin/ffmpeg was added gets its libraries rebuilt (the same FFmpeg 7.1.5 with a few
# more components, the same ABI) and keeps its PyAV wheel.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
prefix=${1:-$HOME/.cache/loongforge/ffmpeg7-shared}
cache=$HOME/.cache/loongforge
if [ -f "$prefix/lib/libavcodec.so.61" ] && [ -x "$prefix/bin/ffmpeg" ] && [ -f "$prefix/wheels/.stripped" ]; then
  echo "ffmpeg7-shared: present at $prefix"; exit 0
fi
py312=${PY312:-$cache/py312/bin/python}
[ -x "$py312" ] || { echo "no Python 3.12 at $py312 (scripts/bench/setup_py312.sh makes it)" >&2; exit 1; }
if [ ! -f "$prefix/lib/libavcodec.so.61" ] || [ ! -x "$prefix/bin/ffmpeg" ]; then
# dav1d (static, PIC, 8-bit) comes from the static FFmpeg prefix of the trainer's build.
bash "$repo/scripts/dev/gpu/build_ffmpeg_static.sh" >/dev/null
static=$cache/ffmpeg-static
[ -f "$static/lib/libdav1d.a" ] || { echo "no $static/lib/libdav1d.a" >&2; exit 1; }

apt_dir=$cache/bench-apt
src_ver=7:7.1.5-0+deb13u1
mkdir -p "$apt_dir/parts" "$apt_dir/lists/partial" "$apt_dir/src"
cat > "$apt_dir/parts/trixie-src.sources" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/parts"
      -o "Dir::State::Lists=$apt_dir/lists" -o Debug::NoLocking=1)
if ! ls "$apt_dir"/src/ffmpeg_7.1.*.dsc >/dev/null 2>&1; then
  apt-get "${opts[@]}" update -qq
  (cd "$apt_dir/src" && apt-get "${opts[@]}" source --download-only "ffmpeg=$src_ver" >/dev/null)
fi
work=$cache/bench-ffmpeg7-build
rm -rf "$work" && mkdir -p "$work"
dpkg-source -x --no-check "$(ls "$apt_dir"/src/ffmpeg_7.1.*.dsc | head -1)" "$work/src" >/dev/null
keep=""
if [ -d "$prefix/wheels" ]; then keep=$(mktemp -d) && mv "$prefix/wheels" "$keep/"; fi
rm -rf "$prefix"
cd "$work/src"
PKG_CONFIG_PATH="$static/lib/pkgconfig" ./configure --prefix="$prefix" --pkg-config-flags=--static \
  --enable-shared --disable-static --enable-pic --disable-doc --disable-network --disable-autodetect \
  --disable-everything --enable-ffmpeg --disable-ffplay --enable-ffprobe \
  --enable-protocol=file,pipe \
  --enable-demuxer=mov,matroska,image2,concat --enable-muxer=mp4,mov,matroska,rawvideo \
  --enable-libdav1d --enable-decoder=h264,hevc,libdav1d,mjpeg,rawvideo --enable-encoder=rawvideo \
  --enable-parser=h264,hevc,av1,mjpeg \
  --enable-bsf=h264_mp4toannexb,hevc_mp4toannexb,extract_extradata,av1_frame_merge,av1_frame_split,null \
  --enable-filter=buffer,buffersink,abuffer,abuffersink,format,aformat,scale,null,anull,copy,crop,setpts,fps \
  --enable-avdevice --enable-avfilter --enable-swscale --enable-swresample >/dev/null
make -j"$(nproc)" >/dev/null
make install >/dev/null
rm -rf "$prefix/share"
if [ -n "$keep" ]; then mv "$keep/wheels" "$prefix/" && rmdir "$keep"; fi
strip --strip-unneeded "$prefix"/lib/*.so.* "$prefix/bin/ffprobe" "$prefix/bin/ffmpeg"
# Each library finds its siblings, and ffprobe the libraries, through a relative rpath, wherever
# the prefix is copied to (the GPU machine's checkout); other users set LD_LIBRARY_PATH.
command -v patchelf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >/dev/null
for f in "$prefix"/lib/lib*.so.*.*; do patchelf --set-rpath '$ORIGIN' "$f"; done
patchelf --set-rpath '$ORIGIN/../lib' "$prefix/bin/ffprobe" "$prefix/bin/ffmpeg"
"$prefix/bin/ffprobe" -hide_banner -decoders 2>/dev/null | grep -E "h264|dav1d" | head -3
"$prefix/bin/ffmpeg" -hide_banner -encoders 2>/dev/null | grep -E "rawvideo" | head -1
fi

# PyAV 15.1.0 from its sdist, against this FFmpeg (cp312, the GPU machine's Python); its extension
# modules are then stripped and their rpath removed (users set LD_LIBRARY_PATH to the libraries, on
# the CPU machine as on the GPU one) and the wheel repacked with `wheel pack` (RECORD rewritten).
mkdir -p "$prefix/wheels"
if ! ls "$prefix"/wheels/av-15.1.0-*.whl >/dev/null 2>&1; then
  PKG_CONFIG_PATH="$prefix/lib/pkgconfig" "$py312" -m pip wheel -q --no-deps --no-binary=:all: av==15.1.0 \
    -w "$prefix/wheels"
fi
"$py312" -m pip install -q wheel
command -v patchelf >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patchelf >/dev/null
tmp=$(mktemp -d)
whl=$(ls "$prefix"/wheels/av-15.1.0-*.whl | head -1)
"$py312" -m wheel unpack "$whl" -d "$tmp" >/dev/null
find "$tmp" -name "*.so" -exec strip --strip-unneeded {} \; -exec patchelf --remove-rpath {} \;
rm "$whl"
"$py312" -m wheel pack "$tmp"/av-15.1.0 -d "$prefix/wheels" >/dev/null
rm -rf "$tmp"
touch "$prefix/wheels/.stripped"
du -sh "$prefix/lib" "$prefix/bin" "$prefix"/wheels/*.whl
