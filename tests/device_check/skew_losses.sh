#!/usr/bin/env bash
# Multiplies every "loss" of a --log-json file by K, in place: how the stand-ins of the *_stubbed.sh
# tests make their losses disagree with the host's by a known amount.
#   skew_losses.sh JSON K
set -euo pipefail
awk -v k="$2" '{
  if (match($0, /"loss":[-0-9.eE+]+/)) {
    v = substr($0, RSTART + 7, RLENGTH - 7) * k
    $0 = substr($0, 1, RSTART + 6) sprintf("%.9g", v) substr($0, RSTART + RLENGTH)
  }
  print }' "$1" > "$1.skew"
mv "$1.skew" "$1"
