#!/usr/bin/env bash
# One definition per program (config.hpp): code under `#if defined(FOURWAY_CUDA_COMPILATION)` (or
# its #else) changes what a name means between a g++ and an nvcc translation unit, so it must sit
# between FOURWAY_BEGIN_MODE_NAMESPACE and FOURWAY_END_MODE_NAMESPACE. Blocks holding only
# #include lines are fine. This check (ctest lint.mode_namespace) lists every line that breaks it.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(find include/fourway \( -name '*.hpp' -o -name '*.cuh' \) ! -path include/fourway/config.hpp \
  -print0 | sort -z | xargs -0 awk '
  FNR == 1 { depth = 0; mode_if = 0; ns = 0 }
  /FOURWAY_BEGIN_MODE_NAMESPACE/ { ns++ }
  /FOURWAY_END_MODE_NAMESPACE/ { ns-- }
  /^[ \t]*#[ \t]*if/ {
    depth++
    if (mode_if == 0 && $0 ~ /FOURWAY_CUDA_COMPILATION/) mode_if = depth
    next
  }
  /^[ \t]*#[ \t]*endif/ { if (depth == mode_if) mode_if = 0; depth--; next }
  mode_if > 0 && ns == 0 && $0 !~ /^[ \t]*(#[ \t]*(include|else|elif)|\/\/|$)/ {
    print FILENAME ":" FNR ": " $0
  }')
if [ -n "$bad" ]; then
  echo "check-mode-namespace: code that depends on FOURWAY_CUDA_COMPILATION outside"
  echo "FOURWAY_BEGIN_MODE_NAMESPACE ... FOURWAY_END_MODE_NAMESPACE (see config.hpp):"
  echo "$bad"
  exit 1
fi
echo "check-mode-namespace: ok"
