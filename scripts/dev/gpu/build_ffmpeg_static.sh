#!/usr/bin/env bash
# Builds a minimal static FFmpeg (decoders LoongForge needs) from Debian's
# source packages, for the GPU machine, which has no FFmpeg and no network.
# Run on the CPU machine; the result is carried to the GPU machine.
#
#   bash scripts/dev/gpu/build_ffmpeg_static.sh [PREFIX]   (default ~/.cache/loongforge/ffmpeg-static)
#
# AV1 decodes through libdav1d (as on the CPU build, whose Debian FFmpeg links
# it): dav1d is built first, static, from Debian's `dav1d` source package
# (fetched the same way as FFmpeg's), installed into PREFIX, and FFmpeg is
# configured with --enable-libdav1d against it. Nothing is downloaded on the
# GPU machine; LOONGFORGE_FFMPEG_ROOT=PREFIX links lib/libdav1d.a
# (third_party/Dependencies.cmake).
#
# Idempotent: does nothing when PREFIX already holds the libraries (a PREFIX
# from before dav1d was added is rebuilt).
set -euo pipefail
prefix=${1:-$HOME/.cache/loongforge/ffmpeg-static}
if [ -f "$prefix/lib/libavcodec.a" ] && [ -f "$prefix/lib/libdav1d.a" ]; then
  echo "ffmpeg-static: present at $prefix"
  exit 0
fi
rm -rf "$prefix"
work=$HOME/.cache/loongforge/ffmpeg-src
mkdir -p "$work"

# Debian source packages: a deb-src entry with the same URI and keyring as the
# binary one (docs/architecture.md s9), the build tools, then `apt-get source`.
need_src=0
ls "$work"/ffmpeg-*/configure >/dev/null 2>&1 || need_src=1
ls "$work"/dav1d-*/meson.build >/dev/null 2>&1 || need_src=1
if [ $need_src = 1 ]; then
  if ! grep -rqs "deb-src" /etc/apt/sources.list.d/ /etc/apt/sources.list; then
    cat > /etc/apt/sources.list.d/loongforge-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq
  fi
  tools=()
  for t in nasm dpkg-source meson ninja; do command -v "$t" >/dev/null || tools+=("$t"); done
  if [ ${#tools[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nasm dpkg-dev meson ninja-build >/dev/null
  fi
  for pkg in ffmpeg dav1d; do
    if ! ls -d "$work"/$pkg-*/ >/dev/null 2>&1; then
      (cd "$work" && apt-get source --download-only "$pkg" >/dev/null && dpkg-source -x --no-check ${pkg}_*.dsc >/dev/null)
    fi
  done
fi

# dav1d: static, 8-bit only (LeRobot's AV1 videos are yuv420p), no tools.
dav1d_src=$(ls -d "$work"/dav1d-*/ | head -1)
rm -rf "$work/dav1d-build"
meson setup "$work/dav1d-build" "$dav1d_src" --prefix="$prefix" --libdir=lib --buildtype=release \
  --default-library=static -Denable_tools=false -Denable_tests=false -Dbitdepths=8 >/dev/null
ninja -C "$work/dav1d-build" >/dev/null
ninja -C "$work/dav1d-build" install >/dev/null

src=$(ls -d "$work"/ffmpeg-*/ | head -1)
cd "$src"
make distclean >/dev/null 2>&1 || true
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" ./configure --prefix="$prefix" --pkg-config-flags=--static \
  --disable-everything --disable-programs --disable-doc --disable-network \
  --disable-autodetect --enable-static --disable-shared --enable-pic --enable-protocol=file \
  --enable-demuxer=mov,matroska,wav --enable-libdav1d \
  --enable-decoder=h264,hevc,mjpeg,libdav1d,aac,pcm_s16le \
  --enable-parser=h264,hevc,av1,aac --enable-swscale --enable-swresample >/dev/null
make -j"$(nproc)" >/dev/null
make install >/dev/null
strip --strip-debug "$prefix"/lib/*.a
du -sh "$prefix"
