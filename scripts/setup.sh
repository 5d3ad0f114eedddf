#!/usr/bin/env bash
# One-command setup: installs what is missing, then builds LoongForge.
#
#   bash scripts/setup.sh            # deps + build (idempotent, safe to rerun)
#   bash scripts/setup.sh --demo     # ... then train n16-tiny on the bundled dataset (CPU)
#
# CPU machine (Debian 12, network to Debian and PyPI): installs missing Debian
# packages, makes a venv with scripts/requirements.txt (and the test-only
# scripts/requirements-test.txt: the upstream GR00T oracle) under
# ~/.cache/loongforge, builds with ccache (cache also there).
# GPU machine (no network, torch preinstalled): uses the system python3's
# torch and the installed libraries; installs nothing. Detects, never assumes.
#
# Environment: LOONGFORGE_CACHE (default ~/.cache/loongforge),
#              LOONGFORGE_BUILD (default <repo>/build), LOONGFORGE_CUDA (AUTO|ON|OFF).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${LOONGFORGE_CACHE:-$HOME/.cache/loongforge}
build=${LOONGFORGE_BUILD:-$repo/build}
demo=0
for arg in "$@"; do
  case $arg in
    --demo) demo=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

t_start=$(date +%s)
step() { echo "== [setup $(( $(date +%s) - t_start ))s] $*"; }
did=()
mkdir -p "$cache"

# ---------------------------------------------------------------------------
# 1. System packages (Debian/Ubuntu). Only missing ones are installed.
debs=(build-essential cmake ninja-build ccache pkg-config git libcli11-dev libspdlog-dev libyaml-cpp-dev
      nlohmann-json3-dev catch2 libavcodec-dev libavformat-dev libavutil-dev libswscale-dev
      libswresample-dev libgloo-dev libssl-dev zlib1g-dev python3-venv ffmpeg)
missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  if $sudo apt-get update -qq >/dev/null 2>&1; then
    step "installing Debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    did+=("installed ${#missing[@]} Debian packages")
  else
    # No package network (the GPU machine): go on with what is there and let
    # CMake say precisely what is missing.
    step "cannot reach a package mirror; not installing: ${missing[*]}"
  fi
else
  step "system packages: all present"
fi

# ---------------------------------------------------------------------------
# 2. Python with torch: the system's if it already has the pinned torch (GPU
#    machine), else a venv under the cache.
torch_pin=$(sed -n 's/^torch==//p' "$repo/scripts/requirements.txt")
python=""
if python3 -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$torch_pin' else 1)" 2>/dev/null; then
  python=$(command -v python3)
  step "using the system python3 with torch $torch_pin ($python)"
else
  venv=$cache/venv
  stamp=$venv/.requirements.sha256
  want=$(sha256sum "$repo/scripts/requirements.txt" | cut -d' ' -f1)
  if [ ! -x "$venv/bin/python" ]; then
    step "creating venv $venv"
    python3 -m venv "$venv"
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    step "installing scripts/requirements.txt into the venv (torch is a large download the first time)"
    PIP_CACHE_DIR=$cache/pip "$venv/bin/pip" install -q --disable-pip-version-check -r "$repo/scripts/requirements.txt"
    echo "$want" > "$stamp"
    did+=("installed Python requirements")
  else
    step "venv up to date ($venv)"
  fi
  python=$venv/bin/python
  # Test-only packages (the upstream GR00T oracle), constrained by the pins above.
  test_stamp=$venv/.requirements-test.sha256
  test_want=$(cat "$repo/scripts/requirements.txt" "$repo/scripts/requirements-test.txt" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$test_stamp" 2>/dev/null)" != "$test_want" ]; then
    step "installing scripts/requirements-test.txt into the venv (test oracle: diffusers, transformers)"
    PIP_CACHE_DIR=$cache/pip "$venv/bin/pip" install -q --disable-pip-version-check \
      -r "$repo/scripts/requirements-test.txt" -c "$repo/scripts/requirements.txt"
    echo "$test_want" > "$test_stamp"
    did+=("installed Python test requirements")
  fi
fi
"$python" -c "import torch, numpy, pyarrow, safetensors" 2>/dev/null \
  || step "note: $python lacks numpy/pyarrow/safetensors; the dataset converter and some tests will be skipped or fail"

# ---------------------------------------------------------------------------
# 3. Build (ccache under the cache directory).
export CCACHE_DIR=${CCACHE_DIR:-$cache/ccache}
# Hits across clones in other folders (CI builds a fresh clone elsewhere).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$repo} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
step "configuring $build"
mkdir -p "$build"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLOONGFORGE_PYTHON="$python" -DLOONGFORGE_CUDA="${LOONGFORGE_CUDA:-AUTO}" >"$build/cmake.log" 2>&1 \
  || { cat "$build/cmake.log"; echo "setup.sh: CMake configuration failed (log above)" >&2; exit 1; }
step "building (ninja, $(nproc) jobs)"
ninja -C "$build" -j"$(nproc)" || { echo "setup.sh: build failed (compiler output above)" >&2; exit 1; }
did+=("built $build")
command -v ccache >/dev/null && step "ccache: $(ccache -s 2>/dev/null | grep -i -m1 'hits' | tr -s ' ' || true)"

step "done in $(( $(date +%s) - t_start ))s: ${did[*]:-nothing to do}"
echo "$python" > "$build/python-path"

# ---------------------------------------------------------------------------
# 4. The README demo.
if [ $demo = 1 ]; then
  exec bash "$repo/scripts/demo.sh"
fi
