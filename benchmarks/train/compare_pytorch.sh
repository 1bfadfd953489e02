#!/bin/bash
# One fp32 GPT-2 training step, fourway vs PyTorch 1.13, side by side on this machine.
#
#   benchmarks/train/compare_pytorch.sh [build-dir] [threads]
#
# Same model (4 layers, width 256, 8 heads, vocab 50257, T 128, B 8), same step (forward,
# backward, clip at 1.0, AdamW), same thread count (fourway: OPENBLAS_NUM_THREADS; PyTorch:
# torch.set_num_threads). Each side runs warm-up steps, then reports the median step time of
# the timed steps. Prints both lines and the ratio fourway / PyTorch (< 1: fourway faster).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build/default}
threads=${2:-1}
steps=${STEPS:-6}
warmup=2
exe=$build/examples/train/fourway-train
[ -x "$exe" ] || { echo "no $exe: build the fourway-train target first" >&2; exit 1; }
model="--layers 4 --dim 256 --heads 8 --vocab 50257 --seq 128 --batch 8"

# fourway: the step times from fourway-train's JSON log (steps after the warm-up)
log=$(mktemp)
trap 'rm -f "$log" "$log.tok"' EXIT
# random tokens over the whole vocabulary, as the PyTorch side uses, in an llm.c file
/usr/bin/python3 - "$log.tok" <<'PY'
import struct, sys, random
random.seed(1)
n = (8 * 128) * 12 + 1
toks = [random.randrange(50257) for _ in range(n)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *toks))
PY
OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads "$exe" $model --data "$log.tok" \
  --steps $((steps + warmup)) --lr 3e-4 --beta2 0.95 --weight-decay 0.1 --grad-clip 1.0 \
  --log-json "$log" --quiet > /dev/null
fw_ms=$(awk -v w=$warmup -F'"step_ms":' 'NR > w { split($2, a, ","); print a[1] }' "$log" |
        sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
printf 'fourway threads %s step_ms %.1f tokens_per_s %.0f\n' "$threads" "$fw_ms" \
  "$(echo "8 * 128 * 1000 / $fw_ms" | bc -l)"

pt_line=$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads \
  /usr/bin/python3 "$here/pytorch_step.py" --threads "$threads" --steps "$steps" --warmup $warmup)
echo "$pt_line"
pt_ms=$(echo "$pt_line" | sed -E 's/.*step_ms ([0-9.]+).*/\1/')
printf 'ratio fourway/pytorch step time %.3f (target <= 1.0)\n' "$(echo "$fw_ms / $pt_ms" | bc -l)"

# CPU time per step (robust when the machine is shared): the same step through the Trainer in
# bench_fourway_train (Google Benchmark, real and CPU time) against PyTorch's process time.
bench=$build/benchmarks/train/bench_fourway_train
if [ -x "$bench" ]; then
  cpu=$(OPENBLAS_NUM_THREADS=$threads "$bench" --benchmark_min_time=1 --benchmark_format=csv \
        2>/dev/null | awk -F, '/BM_Gpt2TrainStepFp32/ { print $4 }')
  pt_cpu=$(echo "$pt_line" | sed -E 's/.*cpu_ms ([0-9.]+).*/\1/')
  printf 'fourway bench cpu_ms %.1f, pytorch cpu_ms %.1f: cpu-time ratio %.3f\n' "$cpu" "$pt_cpu" \
    "$(echo "$cpu / $pt_cpu" | bc -l)"
fi
