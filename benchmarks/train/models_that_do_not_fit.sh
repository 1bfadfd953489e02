#!/usr/bin/env bash
# Models that do not fit, measured (docs/benchmarks/train.md, docs/memory.md):
#  1. a GPT-2 124M-shaped model (12 x 768, vocab 50257; context = --seq) trained a few steps under
#     ZeRO-3 on 8 LocalWorld ranks with a per-rank cap below a third of its unsharded bf16
#     states: every rank's whole-run peak (accountant) next to fourway-plan's prediction and the
#     one-rank figure;
#  2. load (--init-from) and save (--save) of its 248 MB bf16 file on 8 ranks against `cp` of the
#     same file (and `cp` + `sync FILE`, since the save fsyncs), interleaved REPEATS times;
#     min / median / max.
# usage: benchmarks/train/models_that_do_not_fit.sh [BUILD_DIR] [REPEATS] [STEPS]
set -euo pipefail
build=${1:-build/default}
repeats=${2:-3}
steps=${3:-2}
train=$build/examples/train/fourway-train
plan=$build/examples/plan/fourway-plan
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
seq_len=64
model="--layers 12 --dim 768 --heads 12 --vocab 50257 --seq $seq_len --batch 8 --precision bf16"
cap_gb=0.6

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "load at start: $(uptime)"

echo "== 1. ZeRO-3 on 8 ranks, cap $cap_gb GB per rank, $steps steps"
"$train" $model --steps "$steps" --ranks 8 --zero 3 --quiet --memory-cap-gb $cap_gb \
  --memory-report --save "$work/gpt2.safetensors" > "$work/z3.txt"
grep -E "parameters|one rank alone" "$work/z3.txt" | head -2
awk '/^memory of rank/ {r=$4} /^total/ {peak[r]=$3} END {for (r in peak) print "rank " r " whole-run peak " peak[r] " B"}' \
  "$work/z3.txt" | sort -k2n
echo "predicted (fourway-plan --footprint fourway):"
"$plan" --family gpt2 --layers 12 --hidden 768 --heads 12 --vocab 50257 --seq $seq_len --gpus 8 \
  --dp 8 --zero 3 --precision bf16 --micro-batch 1 --footprint fourway --json |
  grep -o '"total":[0-9.e+]*' | head -1
echo "one rank, DataParallel on 1 rank (predicted):"
"$plan" --family gpt2 --layers 12 --hidden 768 --heads 12 --vocab 50257 --seq $seq_len --gpus 1 \
  --dp 1 --zero 0 --precision bf16 --micro-batch 8 --footprint fourway --json |
  grep -o '"total":[0-9.e+]*' | head -1
echo "the same model under --zero 0 with the cap:"
"$train" $model --steps 1 --ranks 8 --zero 0 --quiet --memory-cap-gb $cap_gb 2>&1 >/dev/null |
  grep -o "out of memory on rank [0-9]*: allocating [0-9]* B of [a-z_]*" || true

echo "== 2. load and save on 8 ranks (ZeRO-3) vs cp, $repeats times interleaved"
file="$work/gpt2.safetensors"
bytes=$(stat -c %s "$file")
echo "file: $bytes B"
for i in $(seq "$repeats"); do
  out=$("$train" $model --init-from "$file" --steps 0 --ranks 8 --zero 3 --quiet \
    --save "$work/resaved.safetensors")
  load=$(echo "$out" | grep -o "^loaded .* in [0-9.]* s" | grep -o "[0-9.]* s$" | cut -d' ' -f1)
  save=$(echo "$out" | grep -o "^saved .* in [0-9.]* s" | grep -o "[0-9.]* s$" | cut -d' ' -f1)
  cmp -s "$file" "$work/resaved.safetensors" || { echo "resaved file differs"; exit 1; }
  t0=$(date +%s.%N); cp "$file" "$work/copy.safetensors"; t1=$(date +%s.%N)
  sync "$work/copy.safetensors"; t2=$(date +%s.%N)
  rm -f "$work/copy.safetensors" "$work/resaved.safetensors"
  echo "run $i: load $load s, save $save s, cp $(echo "$t1 - $t0" | bc) s, cp+sync $(echo "$t2 - $t0" | bc) s, load avg $(cut -d' ' -f1 /proc/loadavg)"
done
echo "load at end: $(uptime)"
