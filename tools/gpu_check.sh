#!/usr/bin/env bash
# What we run on the GPU machine (see ../shared/GPU.md): build out of tree, run the
# gpu suite (required to find a GPU), the cpu suite, and the CUDA benchmark.
# Logs go to $OUT (default /tmp/out); a short summary is printed last.
#   tools/gpu_check.sh [--no-bench] [--no-cpu] [--tests PATTERN] [--targets 'T...'] [--example] [--parity] [--cmd 'SHELL']...
# --targets builds only the named ninja targets (e.g. 'tests/frugal_gpu_tests tests/op_fuzz'),
# when device time is short: a cold build of everything takes ~2 minutes there.
# --cmd runs a shell command after the suites with $BUILD set to the build folder and
# $ROOT to the checkout (repeatable; output in $OUT/cmd<N>.log, its tail printed).
# --example trains the Fashion-MNIST CNN, --parity runs tools/parity_mlp.py; both
# read the dataset from data/fashion-mnist (carry it: the GPU machine has none).
# If snapshot.tar is present (made with `git archive HEAD -o snapshot.tar`), the
# committed tree in it is built instead of the working tree, so half-edited files
# never reach the GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
if [ -f snapshot.tar ]; then
  rm -rf /tmp/src && mkdir -p /tmp/src && tar -xf snapshot.tar -C /tmp/src && cd /tmp/src
fi
out=${OUT:-/tmp/out}
mkdir -p "$out"
bench=1
cpu=1
example=0
parity=0
pattern='*'
cmds=()
targets=()
while (($#)); do
  case "$1" in
    --no-bench) bench=0 ;;
    --no-cpu) cpu=0 ;;
    --example) example=1 ;;
    --parity) parity=1 ;;
    --tests) pattern=$2; shift ;;
    --targets) read -ra targets <<<"$2"; shift ;;
    --cmd) cmds+=("$2"); shift ;;
  esac
  shift
done

t0=$(date +%s)
# A build folder per source tree: reconfiguring one made for another tree would build the wrong files.
build=/tmp/b_$(pwd | md5sum | cut -c1-8)
# nvcc through tools/nvcc_deps.sh, which writes the .cu objects' header dependencies: a warm
# machine keeps $build between calls, and without them an edited .cuh left stale objects.
native=/tmp/nvcc_deps_$(pwd | md5sum | cut -c1-8).ini
printf "[binaries]\ncuda = ['sh', '%s']\n" "$(pwd)/tools/nvcc_deps.sh" >"$native"  # (sh: the copy may lose the exec bit)
if ! { meson setup "$build" -Dbuildtype=release -Dcuda=enabled --native-file "$native" >"$out/setup.log" 2>&1 ||
  meson setup --reconfigure "$build" >>"$out/setup.log" 2>&1; }; then
  tail -30 "$out/setup.log"; exit 1
fi
if ! ninja -C "$build" "${targets[@]}" >"$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -40; exit 1
fi
t1=$(date +%s)
FRUGAL_REQUIRE_GPU=1 "$build/tests/frugal_gpu_tests" -tc="$pattern" >"$out/gpu_tests.log" 2>&1
gpu_rc=$?
cpu_rc=0
if ((cpu)); then
  "$build/tests/frugal_cpu_tests" -tc="$pattern" >"$out/cpu_tests.log" 2>&1
  cpu_rc=$?
fi
t2=$(date +%s)
if ((bench)); then "$build/bench/bench_ops" --device cuda >"$out/bench_cuda.log" 2>&1; fi
t3=$(date +%s)
if ((example)); then
  "$build/examples/fashion_mnist" --data-dir "$root/data/fashion-mnist" --checkpoint-dir /tmp/fm_checkpoints >"$out/example.log" 2>&1
fi
if ((parity)); then
  for dev in cuda cpu; do
    for opt in adam sgd; do
      python3 tools/parity_mlp.py --build "$build" --data-dir "$root/data/fashion-mnist" --device $dev --optimizer $opt
    done
  done >"$out/parity.log" 2>&1
fi
cmd_rc=0
for i in "${!cmds[@]}"; do
  BUILD=$build ROOT=$root bash -c "${cmds[$i]}" >"$out/cmd$i.log" 2>&1 || cmd_rc=1
done
t4=$(date +%s)

echo "== build $((t1 - t0))s, tests $((t2 - t1))s, bench $((t3 - t2))s, example+parity $((t4 - t3))s"
grep -E "ERROR|FAILED|TEST CASE|error:" "$out/gpu_tests.log" | head -60
echo "gpu: $(grep 'test cases' "$out/gpu_tests.log") rc=$gpu_rc"
((cpu)) && echo "cpu: $(grep 'test cases' "$out/cpu_tests.log") rc=$cpu_rc"
((bench)) && tail -25 "$out/bench_cuda.log"
((example)) && tr '\r' '\n' <"$out/example.log" | grep -E "epoch .*mean loss|test_accuracy|fashion_mnist"
((parity)) && grep parity_max "$out/parity.log"
for i in "${!cmds[@]}"; do echo "== cmd$i: ${cmds[$i]}"; tail -${CMD_TAIL:-25} "$out/cmd$i.log"; done
exit $((gpu_rc || cpu_rc || cmd_rc))
