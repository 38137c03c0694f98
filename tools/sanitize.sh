#!/usr/bin/env bash
# Builds the cpu suite under a sanitizer and runs it (README, "Sanitizers").
#
#   tools/sanitize.sh asan [doctest options]   # ASan + UBSan, the whole suite, in build-asan/
#   tools/sanitize.sh tsan [doctest options]   # TSan, the threaded test cases, in build-tsan/
#
# The build directory is set up when missing (CPU only, debugoptimized) and brought
# up to date; JOBS=N limits ninja's parallelism. Extra arguments go to the test
# program and replace the default selection, e.g.
#   tools/sanitize.sh asan -tc='allocator*'
# The full output goes to <build dir>/sanitize.log; the script prints the sanitizer
# reports it holds and doctest's summary, and exits non-zero when a test failed or
# a sanitizer reported anything.
#
# Host tensor memory is visible to ASan because the caching allocator poisons what
# it caches (Note [Poisoning host blocks] in memory/caching_allocator.h). Under TSan
# OpenMP runs on one thread: libgomp is not built with TSan, so its barriers are
# invisible to it and every parallel loop would be reported as a race.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
[ $# -gt 0 ] && shift
case "$mode" in
  asan)
    dir=build-asan
    sanitize=address,undefined
    # Everything in tests/cpu; the threaded cases run too (ASan has no trouble with threads).
    default_args=()
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    ;;
  tsan)
    dir=build-tsan
    sanitize=thread
    # The cases that run threads: rank threads (communicator, DDP, ZeRO, tensor and
    # pipeline parallel, the TP models, the parallel bench), tcp_store, the
    # dataloader's worker, and the thread-safe pieces (allocator, generator,
    # deferred checks). Each rank thread runs autograd and the ops. Pass -tc='*' for
    # everything (with OpenMP on one thread the rest is single-threaded).
    default_args=(-tc='*communicator*,*ddp*,zero-1*,zero-2*,zero-3*,*tensor parallel*,*tensor-parallel*,*tensor x pipeline*,pipeline*,parallel_bench*,tcp_store*,dataloader*,*concurrent*,*several threads*,*thread*')
    export OMP_NUM_THREADS=1
    export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:history_size=4${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
    ;;
  *)
    echo "usage: $0 asan|tsan [doctest options]" >&2
    exit 2
    ;;
esac

if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" -Dbuildtype=debugoptimized -Db_sanitize="$sanitize" -Db_lundef=false -Dcuda=disabled
fi
ninja -C "$dir" ${JOBS:+-j"$JOBS"} tests/frugal_cpu_tests tools/frugal-run  # the launch tests run frugal-run

args=("$@")
[ ${#args[@]} -eq 0 ] && args=("${default_args[@]}")
log="$dir/sanitize.log"
echo "running $dir/tests/frugal_cpu_tests ${args[*]} (output in $log)"
set +e
"$dir/tests/frugal_cpu_tests" --duration=false "${args[@]}" >"$log" 2>&1
status=$?
set -e

reports=$(grep -cE '^(==[0-9]+==ERROR: |WARNING: ThreadSanitizer|.*: runtime error: )' "$log" || true)
if [ "$reports" -gt 0 ]; then
  echo "$reports sanitizer report(s):"
  grep -E '^(==[0-9]+==ERROR: |WARNING: ThreadSanitizer|SUMMARY: |.*: runtime error: )' "$log" | sort | uniq -c | sort -rn | head -40
fi
grep -E '^\[doctest\] (test cases|assertions|Status)' "$log" || echo "no doctest summary: the run died (see $log)"
if [ "$status" -ne 0 ] || [ "$reports" -gt 0 ]; then
  echo "FAILED (exit status $status, $reports sanitizer report(s))"
  exit 1
fi
echo "clean"
