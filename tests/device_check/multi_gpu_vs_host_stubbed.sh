#!/usr/bin/env bash
# examples/train/multi_gpu_vs_host.sh without a GPU: a stand-in fourway-train-cuda records the
# variables scripts/launch-local.sh started it with (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
# MASTER_PORT) and its flags; rank 0 runs the real host fourway-train on the same flags without
# --backend nccl (the same mesh on LocalWorld threads), the other ranks exit 0. So every case
# must pass, each launched as N processes with distinct ranks and one port; fewer GPUs leave out
# the larger N; one GPU is exit 77; a rank that fails fails every case, naming the rank; losses
# skewed past 1e-4 fail. The real run needs several GPUs (scripts/device-check.sh, multi-gpu).
#   multi_gpu_vs_host_stubbed.sh SCRIPT LAUNCHER HOST_EXE WORKDIR
set -uo pipefail
# shellcheck source=tests/device_check/stub_checks.sh
source "$(dirname "$0")/stub_checks.sh"
script=$1
launcher=$2
host=$3
work=$4
rm -rf "$work" && mkdir -p "$work"
cat > "$work/fourway-train-cuda" <<'STUB'
#!/usr/bin/env bash
echo "RANK=${RANK:-unset} WORLD_SIZE=${WORLD_SIZE:-unset} LOCAL_RANK=${LOCAL_RANK:-unset}" \
     "MASTER_ADDR=${MASTER_ADDR:-unset} MASTER_PORT=${MASTER_PORT:-unset} $*" >> "$STUB_ARGS"
if [ "${STUB_FAIL_RANK:-x}" = "${RANK:-}" ]; then
  echo "stub: rank $RANK failed on purpose"
  exit 1
fi
args=() json= nccl=0
while [ $# -gt 0 ]; do
  case $1 in
    --backend) [ "$2" = nccl ] && nccl=1 && shift ;;
    --log-json) json=$2 && args+=("$1" "$2") && shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
[ $nccl -eq 1 ] || { echo "stub: started without --backend nccl"; exit 1; }
[ "$RANK" = 0 ] || exit 0
"$STUB_HOST" "${args[@]}" || exit 1
if [ -n "${STUB_SKEW:-}" ] && [ -n "$json" ]; then
  "$STUB_SKEWER" "$json" "$STUB_SKEW"
fi
STUB
chmod +x "$work/fourway-train-cuda"
export STUB_ARGS=$work/cuda-args.txt STUB_HOST=$host LAUNCH=$launcher MULTI_GPU_STEPS=3
STUB_SKEWER=$(cd "$(dirname "$0")" && pwd)/skew_losses.sh
export STUB_SKEWER

# eight GPUs: every case of N = 2, 4, 8
out=$(bash "$script" "$host" "$work/fourway-train-cuda" "$work/run8" 8 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with 8 GPUs and a stand-in that runs the host program"
for n in 2 4 8; do
  expect_in_out " with 8 GPUs" "PASS n$n-dp: 3 steps" "PASS n$n-zero3:" "PASS n$n-tp2:" \
    "PASS n$n-pp2-gpipe:" "PASS n$n-pp2-1f1b:" "PASS n$n-pp2-interleaved:" "PASS n$n-pp2-zb-h1:" \
    "PASS n$n-pp2-zb-v:"
done
expect_in_out " with 8 GPUs" "PASS n8-tp2-pp2-dp2-zero3:"
[ "$(grep -c '^PASS' <<< "$out")" -eq 25 ] || fail "not 25 PASS lines with 8 GPUs"
# how each case was launched: N processes, ranks 0..N-1, LOCAL_RANK = RANK, one port per case
launches() { grep -E -- "--log-json [^ ]*/$1.cuda.json" "$STUB_ARGS"; }
for c in n2-dp:2 n4-zero3:4 n8-pp2-zb-v:8 n8-tp2-pp2-dp2-zero3:8; do
  name=${c%:*} n=${c#*:}
  lines=$(launches "$name")
  [ "$(wc -l <<< "$lines")" -eq "$n" ] || fail "$name: not $n processes"
  for ((r = 0; r < n; ++r)); do
    grep -q "^RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 " <<< "$lines" ||
      fail "$name: no process with RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1"
  done
  [ "$(grep -o 'MASTER_PORT=[0-9]*' <<< "$lines" | sort -u | wc -l)" -eq 1 ] ||
    fail "$name: the ranks were given different ports"
  grep -q -- "--ranks $n .*--backend nccl" <<< "$lines" || fail "$name: not --ranks $n ... --backend nccl"
done
grep -q -- "--tp 2 --pp 2 --dp 2 --zero 3 --micro-batches 2" <<< "$(launches n8-tp2-pp2-dp2-zero3)" ||
  fail "n8-tp2-pp2-dp2-zero3: the CUDA side was not given the 3D mesh's flags"
grep -q -- "--schedule interleaved" <<< "$(launches n4-pp2-interleaved)" ||
  fail "n4-pp2-interleaved: no --schedule interleaved"

# four GPUs: N = 8 is left out, and says why
: > "$STUB_ARGS"
out=$(bash "$script" "$host" "$work/fourway-train-cuda" "$work/run4" 4 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with 4 GPUs"
expect_in_out " with 4 GPUs" "SKIP n8: 4 GPUs visible, needs 8" "PASS n4-pp2-zb-h1:"
[ "$(grep -c '^PASS' <<< "$out")" -eq 16 ] || fail "not 16 PASS lines with 4 GPUs"
grep -q "WORLD_SIZE=8" "$STUB_ARGS" && fail "8 processes started with 4 GPUs"

out=$(bash "$script" "$host" "$work/fourway-train-cuda" "$work/run1" 1 2>&1)
rc=$?
[ $rc -eq 77 ] || fail "exit $rc with 1 GPU, want 77"
expect_in_out " with 1 GPU" "SKIP: 1 GPU visible, needs 2"

# rank 1 fails: every case fails, naming it (the launcher's line)
out=$(STUB_FAIL_RANK=1 bash "$script" "$host" "$work/fourway-train-cuda" "$work/fail" 2 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc when rank 1 fails, want 1"
expect_in_out " when rank 1 fails" \
  "FAIL n2-dp: fourway-train-cuda failed: launch-local: rank 1 of 2 failed (exit 1)"
[ "$(grep -c '^FAIL' <<< "$out")" -eq 8 ] || fail "not 8 FAIL lines when rank 1 fails"

# losses 0.3% off: past 1e-4, every case fails
out=$(STUB_SKEW=1.003 bash "$script" "$host" "$work/fourway-train-cuda" "$work/skew" 2 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc with losses 0.3% off, want 1"
expect_in_out " with losses 0.3% off" "FAIL n2-zero3:" "max rel diff 3.00e-03"
[ "$(grep -c '^PASS' <<< "$out")" -eq 0 ] || fail "a case passed with losses 0.3% off"

finish multi_gpu_vs_host_stubbed
