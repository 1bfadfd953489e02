#!/bin/bash
# One fp32 GPT-2 training step, fourway vs PyTorch 1.13, side by side on this machine.
#
#   benchmarks/train/compare_pytorch.sh [build-dir] [threads]
#
# Same model, same step (forward, backward, clip at 1.0, AdamW), same thread count (fourway:
# OPENBLAS_NUM_THREADS; PyTorch: torch.set_num_threads). Each run does warm-up steps, then
# reports the median step time of its timed steps; the two sides run ROUNDS times (default 3),
# interleaved, the side that starts alternating, and every figure is min / median / max over the
# rounds; the ratio divides the medians (fourway tokens/s / PyTorch tokens/s: > 1, fourway faster).
#
# Environment:
#   SHAPE=vocab   (default) 4 layers, width 256, 8 heads, vocab 50257 (GPT-2's), T 128, B 8: the
#                 (B·T, V) logits and the tied head take most of the step
#   SHAPE=blocks  4 layers, width 384, 6 heads, vocab 512, T 128, B 8: the blocks take the step
#   PIN=CPUS      run both sides under `taskset -c CPUS` (e.g. PIN=0: one core, as the targets ask)
#   AGAINST=EXE   the other side is another fourway-train binary (an older build) instead of
#                 PyTorch, run the same way; the ratio is then this build / EXE
#   ROUNDS, STEPS (timed steps per run, default 6)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build/default}
threads=${2:-1}
steps=${STEPS:-6}
rounds=${ROUNDS:-3}
warmup=2
source "$here/../stats.sh"  # stats, median, ratio, machine, load1
exe=$build/examples/train/fourway-train
[ -x "$exe" ] || { echo "no $exe: build the fourway-train target first" >&2; exit 1; }
[ -z "${AGAINST:-}" ] || [ -x "$AGAINST" ] || { echo "AGAINST=$AGAINST is not an executable" >&2; exit 1; }
case ${SHAPE:-vocab} in
  vocab) layers=4 dim=256 heads=8 vocab=50257 ;;
  blocks) layers=4 dim=384 heads=6 vocab=512 ;;
  *) echo "SHAPE is vocab or blocks, got '$SHAPE'" >&2; exit 2 ;;
esac
seq=128 batch=8
model="--layers $layers --dim $dim --heads $heads --vocab $vocab --seq $seq --batch $batch"
pin=()
[ -n "${PIN:-}" ] && pin=(taskset -c "$PIN")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# random tokens over the whole vocabulary, as the PyTorch side uses, in an llm.c file
/usr/bin/python3 "$here/../random_tokens.py" "$tmp/tok.bin" "$vocab" "$((batch * seq * 12 + 1))"

fourway_ms() {  # median step_ms of one fourway-train run (steps after the warm-up) of ${1:-$exe}
  OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "${pin[@]}" "${1:-$exe}" $model \
    --data "$tmp/tok.bin" --steps $((steps + warmup)) --lr 3e-4 --beta2 0.95 --weight-decay 0.1 \
    --grad-clip 1.0 --log-json "$tmp/log.jsonl" --quiet > /dev/null
  awk -v w=$warmup -F'"step_ms":' 'NR > w { split($2, a, ","); print a[1] }' "$tmp/log.jsonl" | median
}
pytorch_ms() {  # median step_ms of one PyTorch run; its CPU ms per step go to pt_cpu.ms
  if [ -n "${AGAINST:-}" ]; then fourway_ms "$AGAINST"; echo 0 >> "$tmp/pt_cpu.ms"; return; fi
  local line
  line=$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads \
    "${pin[@]}" /usr/bin/python3 "$here/pytorch_step.py" --threads "$threads" --steps "$steps" \
    --warmup $warmup --layers $layers --dim $dim --heads $heads --vocab $vocab --seq $seq \
    --batch $batch)
  echo "$line" | sed -E 's/.*cpu_ms ([0-9.]+).*/\1/' >> "$tmp/pt_cpu.ms"
  echo "$line" | sed -E 's/.*step_ms ([0-9.]+).*/\1/'
}

echo "machine: $(machine); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "shape ${SHAPE:-vocab}: $model, fp32, $threads thread(s)${PIN:+, pinned to CPU $PIN}," \
  "$steps timed steps after $warmup warm-up, $rounds rounds"
for i in $(seq "$rounds"); do
  if (( i % 2 )); then
    fw=$(fourway_ms); pt=$(pytorch_ms)
  else
    pt=$(pytorch_ms); fw=$(fourway_ms)
  fi
  echo "$fw" >> "$tmp/fw.ms"
  echo "$pt" >> "$tmp/pt.ms"
  echo "round $i (load $(load1)): fourway $fw ms, ${AGAINST:+old }${AGAINST:-pytorch} $pt ms"
done
other=pytorch
[ -n "${AGAINST:-}" ] && other="fourway at $AGAINST"
fw_med=$(median < "$tmp/fw.ms")
pt_med=$(median < "$tmp/pt.ms")
tokens=$((batch * seq))
printf 'fourway step_ms min / median / max %s, tokens/s at the median %.0f\n' \
  "$(stats < "$tmp/fw.ms")" "$(echo "$tokens * 1000 / $fw_med" | bc -l)"
printf '%s step_ms min / median / max %s, tokens/s at the median %.0f (cpu_ms %s)\n' "$other" \
  "$(stats < "$tmp/pt.ms")" "$(echo "$tokens * 1000 / $pt_med" | bc -l)" "$(stats < "$tmp/pt_cpu.ms")"
echo "ratio of the medians, fourway / $other tokens/s: $(ratio "$pt_med" "$fw_med")" \
  "(step time $(ratio "$fw_med" "$pt_med"))"

# CPU time per step (robust when the machine is shared): the same step through the Trainer in
# bench_fourway_train (Google Benchmark, CPU time; its own fixed GPT-2 shape, vocab 50257).
bench=$build/benchmarks/train/bench_fourway_train
if [ -x "$bench" ] && [ "${SHAPE:-vocab}" = vocab ] && [ -z "${AGAINST:-}" ]; then
  cpu=$(OPENBLAS_NUM_THREADS=$threads "${pin[@]}" "$bench" --benchmark_min_time=1 \
        --benchmark_format=csv 2>/dev/null | awk -F, '/BM_Gpt2TrainStepFp32/ { print $4 }')
  pt_cpu=$(median < "$tmp/pt_cpu.ms")
  printf 'fourway bench cpu_ms %.1f, pytorch cpu_ms (median) %.1f: cpu-time ratio %.3f\n' "$cpu" \
    "$pt_cpu" "$(echo "$cpu / $pt_cpu" | bc -l)"
fi
