#!/usr/bin/env bash
# Builds a minimal static FFmpeg (decoders LoongForge needs) from Debian's
# source package, for the GPU machine, which has no FFmpeg and no network.
# Run on the CPU machine; the result is carried to the GPU machine.
#
#   bash scripts/gpu/build_ffmpeg_static.sh [PREFIX]   (default ~/.cache/loongforge/ffmpeg-static)
#
# Idempotent: does nothing when PREFIX already holds the libraries.
set -euo pipefail
prefix=${1:-$HOME/.cache/loongforge/ffmpeg-static}
[ -f "$prefix/lib/libavcodec.a" ] && { echo "ffmpeg-static: present at $prefix"; exit 0; }
work=$HOME/.cache/loongforge/ffmpeg-src
mkdir -p "$work"
if ! ls "$work"/ffmpeg-*/configure >/dev/null 2>&1; then
  if ! grep -rqs "deb-src" /etc/apt/sources.list.d/ /etc/apt/sources.list; then
    # A deb-src entry with the same URI and keyring as the binary one (docs/architecture.md s9).
    cat > /etc/apt/sources.list.d/loongforge-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq
  fi
  command -v nasm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nasm dpkg-dev >/dev/null
  (cd "$work" && apt-get source --download-only ffmpeg >/dev/null && dpkg-source -x --no-check ffmpeg_*.dsc >/dev/null)
fi
src=$(ls -d "$work"/ffmpeg-*/ | head -1)
cd "$src"
./configure --prefix="$prefix" --disable-everything --disable-programs --disable-doc --disable-network \
  --disable-autodetect --enable-static --disable-shared --enable-pic --enable-protocol=file \
  --enable-demuxer=mov,matroska,wav --enable-decoder=h264,hevc,mjpeg,aac,pcm_s16le \
  --enable-parser=h264,hevc,aac --enable-swscale --enable-swresample >/dev/null
make -j"$(nproc)" >/dev/null
make install >/dev/null
strip --strip-debug "$prefix"/lib/*.a
du -sh "$prefix"
