#!/usr/bin/env bash
# Checks that every C++/CUDA file under include/ tests/ examples/ benchmarks/ is formatted as
# .clang-format says (clang-format --dry-run -Werror). With --fix, formats them in place.
#   scripts/check-format.sh            # check (ctest lint.format)
#   scripts/check-format.sh --fix      # format the whole tree
#   scripts/check-format.sh --fix a.cpp b.hpp   # format only these files
# Exits 77 (ctest: skipped) when clang-format is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
  echo "check-format: $cf not found, skipped"
  exit 77
fi
fix=0
if [ "${1:-}" = "--fix" ]; then
  fix=1
  shift
fi
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(find include tests examples benchmarks -type f \
    \( -name '*.hpp' -o -name '*.h' -o -name '*.cpp' -o -name '*.cuh' -o -name '*.cu' \) \
    2>/dev/null | LC_ALL=C sort)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "check-format: no files"
  exit 0
fi
if [ $fix -eq 1 ]; then
  "$cf" -i "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
out=$("$cf" --dry-run -Werror "${files[@]}" 2>&1 || true)
mapfile -t bad < <(printf '%s\n' "$out" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error:.*/\1/p' |
  sort -u)
if [ ${#bad[@]} -eq 0 ] && [ -n "$out" ]; then
  printf '%s\n' "$out"  # clang-format failed for another reason
  exit 1
fi
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} of ${#files[@]} files are not formatted ($("$cf" --version)):"
  printf '  %s\n' "${bad[@]}"
  echo "fix with: scripts/check-format.sh --fix"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
