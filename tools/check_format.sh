#!/usr/bin/env bash
# Lists files clang-format would change; exits 1 if any. Fix with: tools/check_format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then clang-format -i $files; exit 0; fi
clang-format --dry-run --Werror $files
