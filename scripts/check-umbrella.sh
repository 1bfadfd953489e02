#!/usr/bin/env bash
# Every public header is reachable from an umbrella: each include/fourway/**/*.hpp is included by
# fourway/fourway.hpp, each **/*.cuh by fourway/fourway.cuh (ctest lint.umbrella). A header that
# needs a component goes inside `#if FOURWAY_HAS_<COMPONENT>` in the umbrella.
set -euo pipefail
cd "$(dirname "$0")/../include"
status=0
for kind in hpp cuh; do
  umbrella=fourway/fourway.$kind
  while IFS= read -r h; do
    [ "$h" = "$umbrella" ] && continue
    if ! grep -q "^#include \"$h\"" "$umbrella"; then
      echo "check-umbrella: $h is not included by $umbrella"
      status=1
    fi
  done < <(find fourway -name "*.$kind" | LC_ALL=C sort)
done
[ $status -eq 0 ] && echo "check-umbrella: ok"
exit $status
