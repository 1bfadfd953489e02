#!/usr/bin/env bash
# Runs clang-tidy (checks in .clang-tidy) over public headers, compiled as C++20 host code.
# With no arguments: config, core, the host backend, the pipeline schedules and executor.
#   scripts/run-clang-tidy.sh                       # the default set
#   scripts/run-clang-tidy.sh include/fourway/comm/communicator.hpp ...
# Exits 77 (ctest: skipped) when clang-tidy is not installed, 1 on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
tidy=${CLANG_TIDY:-clang-tidy}
if ! command -v "$tidy" >/dev/null 2>&1; then
  echo "run-clang-tidy: $tidy not found, skipped"
  exit 77
fi
if [ $# -gt 0 ]; then
  headers=("$@")
else
  headers=(include/fourway/config.hpp include/fourway/core/*.hpp
           include/fourway/backend/host/backend.hpp include/fourway/schedule/*.hpp
           include/fourway/parallel/pp/*.hpp)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One translation unit including them all (quick); each header alone is the hygiene tests' job.
tu="$tmp/tidy.cpp"
: > "$tu"
for h in "${headers[@]}"; do
  printf '#include "%s"\n' "${h#include/}" >> "$tu"
done
status=0
"$tidy" --quiet --config-file="$PWD/.clang-tidy" "$tu" -- -std=c++20 -Iinclude -xc++ \
  > "$tmp/out" 2>&1 || status=1
if grep -q "warning:\|error:" "$tmp/out"; then
  status=1
fi
if [ $status -ne 0 ]; then
  cat "$tmp/out"
else
  echo "run-clang-tidy: ${#headers[@]} headers clean"
fi
exit $status
