#!/usr/bin/env bash
# The capability flags FOURWAY_HAS_CUDA/NCCL/MPI/CBLAS are always defined (0 or 1, config.hpp),
# so `#ifdef FOURWAY_HAS_MPI` or `defined(FOURWAY_HAS_MPI)` is always true. This check (ctest
# lint.capability_flags) finds those spellings anywhere but config.hpp; write `#if FOURWAY_HAS_MPI`.
set -euo pipefail
cd "$(dirname "$0")/.."
hits=$(grep -rnE '(#[[:space:]]*if(n)?def[[:space:]]+|defined[[:space:]]*\(?[[:space:]]*)FOURWAY_HAS_' \
  include tests examples benchmarks 2>/dev/null | grep -v '^include/fourway/config.hpp:' || true)
if [ -n "$hits" ]; then
  echo "check-capability-flags: FOURWAY_HAS_* is always defined (0 or 1); use '#if FOURWAY_HAS_X':"
  echo "$hits"
  exit 1
fi
echo "check-capability-flags: ok"
