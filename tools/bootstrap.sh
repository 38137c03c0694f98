#!/usr/bin/env bash
# One command from a fresh machine to a running frugal:
#   tools/bootstrap.sh example   installs what is missing, builds, runs the main example
#   tools/bootstrap.sh test      installs what is missing, builds, runs every test suite;
#                                its last line is "N passed, N failed"
# The CUDA backend is built where a GPU can run it (nvidia-smi sees one);
# FRUGAL_CUDA=enabled|disabled overrides. FRUGAL_BUILD_DIR picks the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-test}
build=${FRUGAL_BUILD_DIR:-build}

# libopenmpi-dev and openmpi-bin: the mpi backend and its tests (mpirun); without them both skip.
packages=(meson ninja-build g++ pkg-config cmake python3 libeigen3-dev doctest-dev zlib1g-dev dataset-fashion-mnist
  libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda=${FRUGAL_CUDA:-}
if [ -z "$cuda" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=enabled; else cuda=disabled; fi
fi
if [ -f "$build/build.ninja" ]; then
  meson configure "$build" -Dcuda="$cuda" >/dev/null
else
  meson setup "$build" -Dbuildtype=release -Dcuda="$cuda" >/dev/null
fi
echo "bootstrap: building in $build (cuda $cuda)"
ninja -C "$build" -j"$(nproc)" >/dev/null

case "$what" in
  example)
    exec "$build/examples/fashion_mnist"
    ;;
  test)
    status=0
    meson test -C "$build" --suite cpu --suite gpu --print-errorlogs || status=$?
    python3 tools/count_tests.py "$build/meson-logs/testlog.json" || status=1
    exit "$status"
    ;;
  *)
    echo "usage: tools/bootstrap.sh example|test" >&2
    exit 2
    ;;
esac
