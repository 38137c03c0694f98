#!/usr/bin/env bash
# What a user of the installed frugal gets: installs the build BUILD_DIR (already built)
# into a temporary folder, checks that every public header was installed and compiles
# from there, builds examples/external against it through pkg-config and runs it on the
# CPU, and compiles and links the README's "Writing a model" program with the plain
# compiler line the README gives; with cmake installed, builds examples/external with CMake too.
#   tools/check_install.sh [BUILD_DIR]   (default: build; the cpu suite runs it as `install`)
# Needs no root: `meson install --destdir` writes under the temporary folder, and the
# installed frugal.pc is pointed there by its prefix= line (every other path in it is
# relative to ${prefix}).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

meson install -C "$build" --no-rebuild --quiet --destdir "$tmp/dest" >/dev/null
pc="$(find "$tmp/dest" -name frugal.pc -path '*/pkgconfig/*' | head -n 1)"
[ -n "$pc" ] || { echo "check_install: no frugal.pc installed" >&2; exit 1; }
prefix="$(sed -n 's/^prefix=//p' "$pc")"
sed -i "s|^prefix=.*|prefix=$tmp/dest$prefix|" "$pc"
inc="$tmp/dest$prefix/include/frugal"

# Every header of the layers, except the kernels' own (tensor/cpu/, tensor/cuda/).
missing=0
cd "$root"
for h in $(find core memory tensor autograd optim nn parallel profiler models train -name '*.h' \
             -not -path 'tensor/cpu/*' -not -path 'tensor/cuda/*'); do
  [ -f "$inc/$h" ] || { echo "check_install: $h is not installed (add it to its install_headers)" >&2; missing=1; }
done
[ -f "$inc/frugal.h" ] || { echo "check_install: frugal/frugal.h is not installed" >&2; missing=1; }
cuda_lib=""
grep -q FRUGAL_WITH_CUDA "$pc" && cuda_lib=libfrugal_cuda.a
for lib in libfrugal.a $cuda_lib bin/frugal-run; do
  [ -n "$(find "$tmp/dest" -path "*$lib")" ] || { echo "check_install: $lib is not installed" >&2; missing=1; }
done
[ "$missing" = 0 ] || exit 1

export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
if command -v ccache >/dev/null 2>&1; then export CXX="${CXX:-ccache c++}"; fi

# Every installed header compiles from the install alone, with frugal.pc's Cflags (one
# file, so it takes a second); core/cuda_check.h needs the CUDA headers.
cflags="$(pkg-config --cflags frugal)"
(cd "$inc/.." && find frugal -name '*.h' | sort | sed 's|.*|#include <&>|') >"$tmp/all_headers.cpp"
case "$cflags" in *FRUGAL_WITH_CUDA*) ;; *) sed -i '/core\/cuda_check.h/d' "$tmp/all_headers.cpp" ;; esac
${CXX:-c++} -std=c++20 -fsyntax-only $cflags "$tmp/all_headers.cpp" \
  || { echo "check_install: the installed headers do not compile on their own" >&2; exit 1; }

# The user's project: its own meson setup.
meson setup "$tmp/ext" "$root/examples/external" >"$tmp/setup.log" 2>&1 || { cat "$tmp/setup.log" >&2; exit 1; }
ninja -C "$tmp/ext" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; exit 1; }
"$tmp/ext/tiny_mlp" cpu
"$tmp/ext/tiny_mlp"  # on the GPU where the build and the machine have one

# The same project through CMake's find_package(frugal) (frugalConfig.cmake), where cmake is
# installed (tools/bootstrap.sh installs it).
if command -v cmake >/dev/null 2>&1; then
  config="$(find "$tmp/dest" -name frugalConfig.cmake | head -n 1)"
  [ -n "$config" ] || { echo "check_install: no frugalConfig.cmake installed" >&2; exit 1; }
  [ -f "$(dirname "$config")/frugalConfigVersion.cmake" ] \
    || { echo "check_install: no frugalConfigVersion.cmake beside frugalConfig.cmake" >&2; exit 1; }
  cmake -S "$root/examples/external" -B "$tmp/ext_cmake" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$tmp/dest$prefix" >"$tmp/cmake.log" 2>&1 \
    && cmake --build "$tmp/ext_cmake" >>"$tmp/cmake.log" 2>&1 \
    || { cat "$tmp/cmake.log" >&2; echo "check_install: examples/external does not build with CMake" >&2; exit 1; }
  "$tmp/ext_cmake/tiny_mlp" cpu
fi

# The README's programs, as a user would build them without Meson: "Writing a model" (not
# run: it wants the Fashion-MNIST files) and "Training helpers" (run twice in a scratch
# folder: the second run resumes from the first one's last checkpoint and trains no more).
readme_block() {
  python3 - "$root/README.md" "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text[text.index(sys.argv[2]):]
print(re.search(r"<!-- example -->\n```cpp\n(.*?)```", section, re.S).group(1))
PY
}
readme_block "## Writing a model" >"$tmp/net.cpp"
readme_block "### Training helpers" >"$tmp/helpers.cpp"
for prog in net helpers; do
  ${CXX:-c++} -std=c++20 -O1 "$tmp/$prog.cpp" -o "$tmp/$prog" $(pkg-config --cflags --libs frugal) \
    || { echo "check_install: the README's $prog.cpp program does not build" >&2; exit 1; }
done
mkdir "$tmp/run" && (cd "$tmp/run" && "$tmp/helpers" >first.log && "$tmp/helpers" >second.log) \
  || { echo "check_install: the README's training-helpers program failed" >&2; exit 1; }
[ "$(ls "$tmp/run" | grep -c '^ckpt-.*\.safetensors$')" = 2 ] && [ "$(wc -l <"$tmp/run/first.log")" = 5 ] \
  && [ ! -s "$tmp/run/second.log" ] \
  || { echo "check_install: the training-helpers program did not keep 2 checkpoints or resume" >&2; exit 1; }
