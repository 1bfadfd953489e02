#!/bin/bash
# Data-parallel step time, side by side in one run on this machine:
#   1. fourway DP=2 (LocalWorld, 2 ranks) vs PyTorch DDP (gloo, 2 processes, Debian's torch 1.13)
#   2. fourway DP=2 with overlap (buckets all-reduced during backward) vs without
#   3. fourway --zero 0 / 1 / 2 / 3 on 2 ranks
#
#   benchmarks/parallel/compare_ddp.sh [build-dir]
#
# Same GPT-2 on both sides (4 layers, width 256, 8 heads, vocab 4096, T 128, global batch 8,
# AdamW, clip 1.0, fp32), one thread per rank (OPENBLAS_NUM_THREADS=1 / torch.set_num_threads(1)),
# buckets of $BUCKET_MB MiB on both sides (default 4: the 17 MB of gradients make 5 buckets, so
# there is something to overlap; at 25 MiB fourway would put the whole model in one bucket).
# Each run does 2 warm-up steps, then reports the median step time of its timed steps; the whole
# set of runs is repeated ROUNDS times (default 3), interleaved, and each figure is reported as
# min / median / max over the rounds, ratios as ratios of the medians. Ratios < 1 mean fourway is
# faster. The checks against the targets of docs/BENCHMARKS.md come last.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build/default}
steps=${STEPS:-8}
bucket=${BUCKET_MB:-4}
rounds=${ROUNDS:-3}
warmup=2
source "$here/../stats.sh"  # stats, median, ratio, machine, load1
exe=$build/examples/train/fourway-train
[ -x "$exe" ] || { echo "no $exe: build the fourway-train target first" >&2; exit 1; }
model="--layers 4 --dim 256 --heads 8 --vocab 4096 --seq 128 --batch 8"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 "$here/../random_tokens.py" "$tmp/tokens.bin" 4096 $((8 * 128 * 16 + 1))

median_ms() {  # median step_ms of a fourway-train JSON log after the warm-up steps
  awk -v w=$warmup -F'"step_ms":' 'NR > w { split($2, a, ","); print a[1] }' "$1" |
    sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
fourway() {  # fourway <name> <flags...>: prints "<name> <ms> <bytes/rank/step>"
  local name=$1; shift
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$exe" $model --data "$tmp/tokens.bin" \
    --steps $((steps + warmup)) --lr 1e-4 --beta2 0.95 --weight-decay 0.1 --grad-clip 1.0 \
    --log-json "$tmp/$name.jsonl" --quiet "$@" > /dev/null
  local bytes
  bytes=$(tail -1 "$tmp/$name.jsonl" | grep -o '"comm_modelled_bytes_per_rank":[0-9.]*' | cut -d: -f2)
  echo "$(median_ms "$tmp/$name.jsonl") ${bytes:--}"
}

echo "machine: $(machine); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $model, fp32, buckets $bucket MiB, $steps timed steps after $warmup warm-up, $rounds rounds"
runs="dp2_overlap dp2_no_overlap zero1 zero1_no_overlap zero2 zero2_no_overlap zero3 zero3_no_prefetch one_rank pytorch"
flags() {  # the fourway-train flags of a run
  case $1 in
    dp2_overlap) echo "--ranks 2 --zero 0 --bucket-mb $bucket" ;;
    dp2_no_overlap) echo "--ranks 2 --zero 0 --bucket-mb $bucket --no-overlap" ;;
    zero[123]) echo "--ranks 2 --zero ${1#zero} --bucket-mb $bucket" ;;
    zero[12]_no_overlap) echo "--ranks 2 --zero ${1:4:1} --bucket-mb $bucket --no-overlap" ;;
    zero3_no_prefetch) echo "--ranks 2 --zero 3 --bucket-mb $bucket --no-overlap" ;;
    one_rank) echo "--ranks 1 --zero 0" ;;
  esac
}
for i in $(seq "$rounds"); do
  line="round $i (load $(load1)):"
  for r in $runs; do
    if [ "$r" = pytorch ]; then
      pt=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/python3 "$here/ddp_torch.py" \
           --ranks 2 --threads 1 --layers 4 --dim 256 --heads 8 --vocab 4096 --seq 128 --batch 8 \
           --steps "$steps" --warmup $warmup --bucket-mb "$bucket")
      ms=$(echo "$pt" | sed -E 's/.*"ms_per_step": ([0-9.]+).*/\1/')
      bytes=-
    else
      read -r ms bytes <<< "$(fourway "$r" $(flags "$r"))"
    fi
    echo "$ms" >> "$tmp/$r.ms"
    echo "$bytes" > "$tmp/$r.bytes"
    line+=" $r $ms"
  done
  echo "$line"
done

med() { median < "$tmp/$1.ms"; }
printf '\n%-20s %-28s %12s %16s\n' "run" "ms/step min / median / max" "tokens/s" "comm B/rank/step"
for r in $runs; do
  printf '%-20s %-28s %12.0f %16s\n' "$r" "$(stats < "$tmp/$r.ms")" \
    "$(echo "1024 * 1000 / $(med "$r")" | bc -l)" "$(cat "$tmp/$r.bytes")"
done
echo
echo "ratios of the medians (targets in docs/BENCHMARKS.md):"
show() { printf '  %-44s %s  %s\n' "$1" "$2" "$3"; }
show "fourway DP=2 / PyTorch DDP, step time" "$(ratio "$(med dp2_overlap)" "$(med pytorch)")" "(target <= 1.0)"
show "two ranks / one rank, tokens/s" "$(ratio "$(med one_rank)" "$(med dp2_overlap)")" "(target >= 1.7)"
for pair in dp2_overlap:dp2_no_overlap zero1:zero1_no_overlap zero2:zero2_no_overlap \
            zero3:zero3_no_prefetch; do
  show "overlap on / off, step time, ${pair%%:*}" "$(ratio "$(med "${pair%%:*}")" "$(med "${pair#*:}")")" \
    "(target <= 1.0)"
done
show "ZeRO-3 / DP, step time" "$(ratio "$(med zero3)" "$(med dp2_overlap)")" ""
