#!/usr/bin/env bash
# examples/train/cuda_vs_host.sh without a GPU: a stand-in fourway-train-cuda records its flags,
# drops the ones only it takes (--attention, --tf32) and runs the real host fourway-train, so
# every case must pass, each with its flags on the right side (--attention fused and --tf32 on
# the CUDA side only, --precision fp32 added to both sides of a case that names none); with
# STUB_SKEW the stand-in scales its losses, and a case whose tolerance that passes must fail;
# with STUB_ATTENTION it reports the blockwise fallback, which fails the fused case; a one-rank
# run without --cuda-graph gets the host's --cuda-graph on (fourway-train-cuda captures such a
# run by default; the host program rehearses the capture), and with STUB_NO_CAPTURE the host
# runs uncaptured, which fails fp32-1rank; no GPU visible is exit 77. The real comparison needs a GPU (scripts/device-check.sh, step
# train-cuda-vs-host).
#   cuda_vs_host_stubbed.sh SCRIPT HOST_EXE WORKDIR
set -uo pipefail
# shellcheck source=tests/device_check/stub_checks.sh
source "$(dirname "$0")/stub_checks.sh"
script=$1
host=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
cat > "$work/fourway-train-cuda" <<'STUB'
#!/usr/bin/env bash
echo "$*" >> "$STUB_ARGS"
[ -n "${STUB_NO_GPU:-}" ] && echo "fourway-train-cuda: no CUDA device is visible" >&2 && exit 1
args=() json= mesh= graph=
while [ $# -gt 0 ]; do
  case $1 in
    --ranks|--tp|--pp|--cp) mesh=1 && args+=("$1") ;;
    --cuda-graph) graph=1 && args+=("$1") ;;
    --attention) echo "attention: ${STUB_ATTENTION:-fused (the tensor-core flash kernels)}" && shift ;;
    --tf32) ;;
    --log-json) json=$2 && args+=("$1" "$2") && shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
[ -z "$mesh" ] && [ -z "$graph" ] && [ -z "${STUB_NO_CAPTURE:-}" ] && args+=(--cuda-graph on)
"$STUB_HOST" "${args[@]}" || exit 1
if [ -n "${STUB_SKEW:-}" ] && [ -n "$json" ]; then
  "$STUB_SKEWER" "$json" "$STUB_SKEW"
fi
STUB
chmod +x "$work/fourway-train-cuda"
export STUB_ARGS=$work/cuda-args.txt STUB_HOST=$host
STUB_SKEWER=$(cd "$(dirname "$0")" && pwd)/skew_losses.sh
export STUB_SKEWER

out=$(bash "$script" "$host" "$work/fourway-train-cuda" "$work/run" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with a stand-in that runs the host program"
expect_in_out "" "PASS fp32-1rank: 8 steps" "PASS fp32-zero3-4ranks:" "PASS bf16-zero3-4ranks:" \
  "PASS fp32-tp2-dp2-zero1:" "PASS fp32-tp2-pp2-dp2-zero1:" "PASS fp32-cp2-dp2-zero3:" \
  "PASS bf16-cp2-pp2:" "PASS fp32-classifier-chunk:" "PASS fp16-1rank:" \
  "PASS bf16-fused-attention:" "PASS tf32-1rank:" "PASS fp32-1rank-uncaptured:"
[ "$(grep -c '^PASS' <<< "$out")" -eq 12 ] || fail "not 12 PASS lines"
# the flags each side got: the CUDA side's from the record, the host's from its own logs
args_of() { grep -E -- "--log-json [^ ]*/$1.cuda.json" "$STUB_ARGS"; }
grep -q -- "--cuda-graph off" <<< "$(args_of fp32-1rank-uncaptured)" ||
  fail "fp32-1rank-uncaptured: the CUDA side was not given --cuda-graph off"
grep -q -- "--precision bf16 --attention fused" <<< "$(args_of bf16-fused-attention)" ||
  fail "bf16-fused-attention: the CUDA side was not given --attention fused after its flags"
grep -q -- "--precision fp32 --tf32" <<< "$(args_of tf32-1rank)" ||
  fail "tf32-1rank: the CUDA side was not given --precision fp32 --tf32"
grep -q -- "--classifier-chunk 64 --precision fp32" <<< "$(args_of fp32-classifier-chunk)" ||
  fail "fp32-classifier-chunk: the CUDA side was not given its flags"
grep -q -- "--precision fp16" <<< "$(args_of fp16-1rank)" || fail "fp16-1rank: no --precision fp16"
grep -q -- "--precision fp32" <<< "$(args_of fp16-1rank)" &&
  fail "fp16-1rank: --precision fp32 added to a case that names its precision"

# losses 0.3% off: the fp32 cases (1e-4) and TF32's (2e-3) fail, fp16 / bf16 (5e-3) pass
: > "$STUB_ARGS"
out=$(STUB_SKEW=1.003 bash "$script" "$host" "$work/fourway-train-cuda" "$work/skew" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc with losses 0.3% off, want 1"
expect_in_out " with losses 0.3% off" "FAIL fp32-1rank:" "FAIL fp32-classifier-chunk:" \
  "FAIL fp32-cp2-dp2-zero3:" "PASS bf16-cp2-pp2:" "FAIL tf32-1rank:" "PASS fp16-1rank:" \
  "PASS bf16-fused-attention:" "max rel diff 3.00e-03"

# the CUDA side says it fell back to the blockwise path: the fused case fails, naming that line
out=$(STUB_ATTENTION="blockwise: the fused kernels refuse this model here (x)" bash "$script" \
  "$host" "$work/fourway-train-cuda" "$work/fallback" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc when the fused kernels were refused, want 1"
expect_in_out " when the fused kernels were refused" \
  "FAIL bf16-fused-attention: fourway-train-cuda did not run the fused kernels: attention: blockwise"

# the CUDA side did not capture the one-rank step: fp32-1rank fails, naming that
out=$(STUB_NO_CAPTURE=1 bash "$script" "$host" "$work/fourway-train-cuda" "$work/uncaptured" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc when the step was not captured, want 1"
expect_in_out " when the step was not captured" \
  "FAIL fp32-1rank: fourway-train-cuda did not capture its step: no cuda graph line"

out=$(STUB_NO_GPU=1 bash "$script" "$host" "$work/fourway-train-cuda" "$work/nogpu" 2>&1)
rc=$?
[ $rc -eq 77 ] || fail "exit $rc with no GPU visible, want 77"
expect_in_out " with no GPU" "SKIP: no CUDA device is visible"

finish cuda_vs_host_stubbed
