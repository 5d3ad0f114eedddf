#!/usr/bin/env bash
# Builds a small SHARED FFmpeg with the `ffmpeg` and `ffprobe` programs, for
# scripts/bench_data.py on the GPU machine (scripts/dev/gpu/issue12_decode.sh),
# which has no FFmpeg at all. Two users there:
#   - the reference DataLoader (scripts/reference/lf_dataset.py), which runs
#     `ffprobe ... -of json` and `ffmpeg ... -f rawvideo -pix_fmt yuv420p|rgb24 -`
#     found on PATH;
#   - torchcodec 0.11.1's CPU wheel, whose libtorchcodec_core5.so links
#     libavutil.so.57, libavcodec.so.59, libavformat.so.59, libavdevice.so.59,
#     libavfilter.so.8, libswscale.so.6 and libswresample.so.4 (FFmpeg 5.1:
#     all seven must exist; LD_LIBRARY_PATH=PREFIX/lib finds them).
# Run on the CPU machine; the result is carried. Same sources and way as
# scripts/dev/gpu/build_ffmpeg_static.sh (Debian 12's ffmpeg 5.1.9 and dav1d 1.0.0
# source packages in ~/.cache/loongforge/ffmpeg-src, which that script fetches;
# nothing is downloaded here), so its decodes are the system /usr/bin/ffmpeg's.
#
#   bash scripts/dev/gpu/build_ffmpeg_bench.sh [PREFIX]   (default .gpu-carry/ffmpeg-bench)
#
# PREFIX gets bin/{ffmpeg,ffprobe} and lib/lib*.so* only (stripped; no headers),
# with RUNPATH $ORIGIN/../lib on the programs and $ORIGIN on the libraries, so
# the folder can move. Components: file and pipe protocols, the mov demuxer,
# h264 and libdav1d decoders (dav1d 8-bit, linked statically into
# libavcodec.so), h264/av1 parsers, the rawvideo encoder and muxer, the
# buffer/buffersink/format/scale/null/crop filters (plus those the ffmpeg
# program selects itself), swscale, swresample; no external library but dav1d.
# The build works in copies (ffmpeg-bench-src, dav1d-bench-*) beside the static
# build's, so the two scripts never share objects.
#
# Idempotent: does nothing when PREFIX already holds the programs and libraries.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
prefix=$(realpath -m "${1:-$repo/.gpu-carry/ffmpeg-bench}")
if [ -x "$prefix/bin/ffmpeg" ] && [ -x "$prefix/bin/ffprobe" ] && [ -f "$prefix/lib/libavdevice.so.59" ]; then
  echo "ffmpeg-bench: present at $prefix ($(du -sh "$prefix" | cut -f1))"
  exit 0
fi
work=$HOME/.cache/loongforge/ffmpeg-src
ls "$work"/ffmpeg_*.dsc "$work"/dav1d-*/meson.build >/dev/null 2>&1 ||
  bash "$repo/scripts/dev/gpu/build_ffmpeg_static.sh"        # fetches the source packages
jobs=$(nproc)

# dav1d: as for the static build (8-bit, no tools), into a staging prefix of its
# own; meson builds static libraries position-independent (b_staticpic).
stage=$work/dav1d-bench-stage
rm -rf "$work/dav1d-bench-build" "$stage"
meson setup "$work/dav1d-bench-build" "$(ls -d "$work"/dav1d-*/meson.build | head -1 | xargs dirname)" \
  --prefix="$stage" --libdir=lib --buildtype=release --default-library=static \
  -Denable_tools=false -Denable_tests=false -Dbitdepths=8 >/dev/null
ninja -C "$work/dav1d-bench-build" >/dev/null
ninja -C "$work/dav1d-bench-build" install >/dev/null

# FFmpeg: a fresh extraction of the Debian source package (patches applied).
src=$work/ffmpeg-bench-src
rm -rf "$src" "$work/ffmpeg-bench-install"
(cd "$work" && dpkg-source -x --no-check "$(ls ffmpeg_*.dsc | head -1)" "$src" >/dev/null)
cd "$src"
PKG_CONFIG_PATH="$stage/lib/pkgconfig" ./configure --prefix="$work/ffmpeg-bench-install" \
  --pkg-config-flags=--static --disable-everything --disable-doc --disable-network --disable-autodetect \
  --disable-debug --enable-shared --disable-static --enable-pic \
  --disable-programs --enable-ffmpeg --enable-ffprobe \
  --enable-protocol=file,pipe --enable-demuxer=mov --enable-muxer=rawvideo --enable-encoder=rawvideo \
  --enable-libdav1d --enable-decoder=h264,libdav1d --enable-parser=h264,av1 \
  --enable-filter=buffer,buffersink,format,scale,null,crop \
  --enable-avdevice --enable-avfilter --enable-swscale --enable-swresample > "$work/ffmpeg-bench-configure.log"
# The RUNPATHs, written into config.mak after configure (whose evals would eat a
# $ given on its command line). make turns \$$ into \$ and the shell that into $;
# the library rule is expanded twice (ffbuild/library.mak's $(eval $(RULES))),
# hence \$$$$ there.
sed -i -e 's|^LDEXEFLAGS=.*|LDEXEFLAGS=-Wl,-rpath,\\$$ORIGIN/../lib|' \
  -e 's|^LDSOFLAGS=.*|LDSOFLAGS=-Wl,-rpath,\\$$$$ORIGIN|' ffbuild/config.mak
make -j"$jobs" > "$work/ffmpeg-bench-make.log" 2>&1 || { tail -20 "$work/ffmpeg-bench-make.log"; exit 1; }
make install >/dev/null
rm -rf "$prefix" && mkdir -p "$prefix/bin" "$prefix/lib"
cp "$work/ffmpeg-bench-install/bin/ffmpeg" "$work/ffmpeg-bench-install/bin/ffprobe" "$prefix/bin/"
cp -P "$work/ffmpeg-bench-install/lib/"lib*.so* "$prefix/lib/"
strip --strip-unneeded "$prefix/bin/"* "$prefix/lib/"lib*.so.*.*
# Only the C runtime outside PREFIX: the GPU machine has nothing else of ours.
if ldd "$prefix/bin/ffmpeg" "$prefix/lib/"lib*.so.*.* | grep -E "=>" | grep -vE "$prefix|lib(c|m|pthread|dl)\.so"; then
  echo "ffmpeg-bench: links a library outside $prefix (above)" >&2; exit 1
fi
"$prefix/bin/ffmpeg" -hide_banner -version | head -1
du -sh "$prefix"
