#!/usr/bin/env bash
# The GPU check in one command, for a machine with an NVIDIA GPU (written for an H200, sm_90):
#   1. configure the `cuda` preset (Release, sm_90, CUDA required),
#   2. build what the GPU checks need (every gpu-labelled test and every bench_*_gpu),
#   3. run `ctest -L gpu` (a GPU test that reports Skipped here is counted as a problem),
#   4. compare fourway-train-cuda's losses with the host fourway-train's on the same flags
#      (examples/train/cuda_vs_host.sh: 1 rank, and a 4-rank LocalWorld ZeRO-3 on one GPU),
#   5. run every bench_*_gpu executable briefly (JSON figures in build/cuda/device-check/),
#   6. print a summary table. Exits non-zero if any step failed or timed out.
# Every step runs under `timeout`; the whole run stays within DEVICE_CHECK_BUDGET seconds (360).
# Usage: scripts/device-check.sh        (env: JOBS, DEVICE_CHECK_BUDGET, BENCH_MIN_TIME)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=$root/build/cuda
jobs=${JOBS:-$(nproc)}
budget=${DEVICE_CHECK_BUDGET:-360}
bench_min_time=${BENCH_MIN_TIME:-0.05}
t0=$(date +%s)
rows=()
failed=0

remaining() { echo $((budget - ($(date +%s) - t0))); }
# run_step NAME LIMIT_S CMD...: runs CMD under timeout (the smaller of LIMIT_S and what is left
# of the budget), logs to $logdir/NAME.log, records a row; returns CMD's status.
run_step() {
  local name=$1 limit=$2
  shift 2
  local left
  left=$(remaining)
  if [ "$left" -lt "$limit" ]; then limit=$left; fi
  if [ "$limit" -le 5 ]; then
    rows+=("$name|NOT RUN|0|budget of ${budget}s spent")
    failed=1
    return 124
  fi
  local s rc
  s=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$logdir/$name.log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - s))
  if [ $rc -eq 0 ]; then
    rows+=("$name|ok|$dt|")
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    rows+=("$name|TIMEOUT|$dt|limit ${limit}s, log $logdir/$name.log")
    failed=1
  else
    rows+=("$name|FAILED ($rc)|$dt|log $logdir/$name.log")
    failed=1
  fi
  return $rc
}

logdir=$build/device-check
mkdir -p "$logdir"
rm -f "$logdir"/*.log "$logdir"/*.json

echo "== device-check: $(date -u +%FT%TZ), $(nproc) cores, budget ${budget}s"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi
nvcc --version 2>/dev/null | tail -1

echo "== configure (cmake --preset cuda)"
if ! run_step configure 90 cmake --preset cuda; then
  tail -30 "$logdir/configure.log"
fi

targets=()
if [ "$failed" -eq 0 ]; then
  # The targets behind gpu-labelled tests (a test is named after its executable, MPI ones with an
  # _npN suffix) and every bench_*_gpu target. If none is found, everything is built.
  mapfile -t all_targets < <(cmake --build "$build" --target help 2>/dev/null |
    sed -n 's/^\.\.\. \([A-Za-z0-9_.+-]*\).*/\1/p' | sort -u)
  mapfile -t gpu_tests < <(ctest --test-dir "$build" -L gpu -N 2>/dev/null |
    sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/\1/p' | sed 's/_np[0-9]*$//' | sort -u)
  for t in "${gpu_tests[@]}"; do
    printf '%s\n' "${all_targets[@]}" | grep -qx "$t" && targets+=("$t")
  done
  for t in "${all_targets[@]}"; do
    [[ "$t" =~ ^bench_.*_gpu$ ]] && targets+=("$t")
  done
  for t in fourway-train fourway-train-cuda; do  # step 4
    printf '%s\n' "${all_targets[@]}" | grep -qx "$t" && targets+=("$t")
  done
  echo "== build (${#targets[@]} targets, -j $jobs)"
  if [ ${#targets[@]} -gt 0 ]; then
    run_step build 210 cmake --build "$build" -j "$jobs" --target "${targets[@]}"
  else
    run_step build 210 cmake --build "$build" -j "$jobs"
  fi
  [ $? -ne 0 ] && grep -E "error|Error" "$logdir/build.log" | head -30
fi

tests_note=""
if [ "$failed" -eq 0 ]; then
  echo "== ctest -L gpu"
  # train_fourway_train_cuda_vs_host is step 4, run once there with a row per case
  run_step gpu-tests 120 ctest --test-dir "$build" -L gpu --output-on-failure -j 2 --timeout 100 \
    -E '^train_fourway_train_cuda_vs_host$'
  grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)|\(Timeout\)|Not Run" \
    "$logdir/gpu-tests.log" || true
  tests_note=$(grep -E "tests passed" "$logdir/gpu-tests.log" | tail -1)
  nskip=$(grep -c "(Skipped)" "$logdir/gpu-tests.log" || true)
  if [ "${nskip:-0}" -gt 0 ]; then
    rows+=("gpu-tests skipped|PROBLEM|0|$nskip gpu tests skipped on a GPU machine")
    failed=1
  fi
fi

train_host=$build/examples/train/fourway-train
train_cuda=$build/examples/train/fourway-train-cuda
if [ -x "$train_host" ] && [ -x "$train_cuda" ]; then
  echo "== fourway-train-cuda vs fourway-train (examples/train/cuda_vs_host.sh)"
  rm -rf "$logdir/train-cuda-vs-host"
  run_step train-cuda-vs-host 60 examples/train/cuda_vs_host.sh "$train_host" "$train_cuda" \
    "$logdir/train-cuda-vs-host"
  while IFS= read -r line; do
    case "$line" in
      PASS\ *|FAIL\ *)
        case_name=${line#* }
        rows+=("  ${case_name%%:*}|${line%% *}|0|${line#*: }")
        ;;
    esac
  done < "$logdir/train-cuda-vs-host.log"
  grep -E "^(PASS|FAIL|SKIP)" "$logdir/train-cuda-vs-host.log" || tail -5 "$logdir/train-cuda-vs-host.log"
else
  rows+=("train-cuda-vs-host|NOT RUN|0|fourway-train or fourway-train-cuda not built")
  failed=1
fi

bench_rows=()
if [ -d "$build" ]; then
  mapfile -t bench_exes < <(find "$build" -type f -perm -u+x -name 'bench_*_gpu' | sort)
  if [ ${#bench_exes[@]} -gt 0 ]; then
    echo "== benchmarks (${#bench_exes[@]}, --benchmark_min_time=$bench_min_time)"
  fi
  for exe in "${bench_exes[@]}"; do
    name=$(basename "$exe")
    run_step "$name" 60 "$exe" --benchmark_min_time="$bench_min_time" \
      --benchmark_out="$logdir/$name.json" --benchmark_out_format=json
    sed -n '/^-----/,$p' "$logdir/$name.log" | head -40
  done
fi

echo
echo "== device-check summary ($(($(date +%s) - t0)) s of ${budget} s)"
printf '%-34s %-14s %6s  %s\n' "step" "status" "sec" "note"
for r in "${rows[@]}"; do
  IFS='|' read -r n st dt note <<< "$r"
  [ "$n" = "gpu-tests" ] && [ -n "$tests_note" ] && note="$tests_note ${note}"
  printf '%-34s %-14s %6s  %s\n' "$n" "$st" "$dt" "$note"
done
if [ "$failed" -eq 0 ]; then
  echo "device-check: PASSED"
else
  echo "device-check: FAILED"
fi
exit "$failed"
