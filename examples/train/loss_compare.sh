# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034  # host, cuda, out, model, steps, status: the sourcing script's
# Sourced by cuda_vs_host.sh and multi_gpu_vs_host.sh: the per-step loss comparison of
# fourway-train-cuda against the host fourway-train on the same flags.
#
# The sourcing script sets `host` (fourway-train), `out` (a folder), `model` (an array of flags
# both sides get), `steps`, and `status=0`; it may redefine `run_cuda NAME ARGS...`, which runs
# the CUDA side of case NAME (by default "$cuda" ARGS...), to start it another way (several
# processes through a launcher). Then
#   compare NAME TOL FLAGS... [-- FLAGS only fourway-train-cuda takes]
# runs both with --log-json, adds --precision fp32 to both when FLAGS name none, prints one
# `PASS NAME: ...` or `FAIL NAME: ...` line, and sets status=1 on a failure: a side that fails,
# a step count other than `steps`, nan/inf, or a loss off by more than TOL relative.

# losses FILE: the "loss" of every line of a --log-json file, one a line
losses() { grep -o '"loss":[-0-9.eE+naif]*' "$1" 2>/dev/null | cut -d: -f2; }

run_cuda() {  # run_cuda NAME ARGS...: the CUDA side of case NAME
  shift
  "$cuda" "$@"
}

compare() {  # compare NAME TOL FLAGS... [-- FLAGS only fourway-train-cuda takes]
  local name=$1 tol=$2 both=() cuda_only=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do both+=("$1") && shift; done
  [ $# -gt 0 ] && shift && cuda_only=("$@")
  [[ " ${both[*]} " == *" --precision "* ]] || both+=(--precision fp32)
  local h=$out/$name.host.json d=$out/$name.cuda.json
  if ! "$host" "${model[@]}" --steps "$steps" "${both[@]}" --log-json "$h" > "$out/$name.host.txt" 2>&1; then
    echo "FAIL $name: host fourway-train failed: $(tail -1 "$out/$name.host.txt")"
    status=1
    return
  fi
  if ! run_cuda "$name" "${model[@]}" --steps "$steps" "${both[@]}" "${cuda_only[@]}" \
    --log-json "$d" > "$out/$name.cuda.txt" 2>&1; then
    echo "FAIL $name: fourway-train-cuda failed: $(tail -1 "$out/$name.cuda.txt")"
    status=1
    return
  fi
  local verdict
  verdict=$(paste <(losses "$h") <(losses "$d") | awk -v tol="$tol" -v steps="$steps" '
    { n++; last_h = $1; last_d = $2
      if ($1 !~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/ || $2 !~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/) {
        bad++; next }  # nan, inf or a missing value
      r = ($1 - $2) / ($1 < 0 ? -$1 : $1); if (r < 0) r = -r
      if (r > worst) worst = r
      if (r > tol) bad++ }
    END { if (n != steps) { printf "FAIL %d steps logged, expected %d", n, steps; exit }
          printf "%s %d steps, final loss host %s cuda %s, max rel diff %.2e (tol %s)",
                 bad ? "FAIL" : "PASS", n, last_h, last_d, worst, tol }')
  echo "${verdict%% *} $name: ${verdict#* }"
  [[ "$verdict" == PASS* ]] || status=1
}
