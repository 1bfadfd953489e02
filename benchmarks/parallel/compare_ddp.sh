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
# Each run does 2 warm-up steps, then reports the median step time of the timed
# steps. Ratios < 1 mean fourway is faster.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build/default}
steps=${STEPS:-8}
bucket=${BUCKET_MB:-4}
warmup=2
exe=$build/examples/train/fourway-train
[ -x "$exe" ] || { echo "no $exe: build the fourway-train target first" >&2; exit 1; }
model="--layers 4 --dim 256 --heads 8 --vocab 4096 --seq 128 --batch 8"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$tmp/tokens.bin" <<'PY'
import struct, sys, random
random.seed(1)
n = (8 * 128) * 16 + 1
toks = [random.randrange(4096) for _ in range(n)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *toks))
PY

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
  echo "$name $(median_ms "$tmp/$name.jsonl") ${bytes:--}"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (the figures are only meaningful on an idle machine)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "model: $model, fp32, buckets $bucket MiB, $steps timed steps after $warmup warm-up"
res=()
res+=("$(fourway dp2_overlap --ranks 2 --zero 0 --bucket-mb $bucket)")
res+=("$(fourway dp2_no_overlap --ranks 2 --zero 0 --bucket-mb $bucket --no-overlap)")
for z in 1 2 3; do res+=("$(fourway zero$z --ranks 2 --zero $z --bucket-mb $bucket)"); done
res+=("$(fourway zero3_no_prefetch --ranks 2 --zero 3 --no-overlap)")
res+=("$(fourway one_rank --ranks 1 --zero 0)")
pt=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/python3 "$here/ddp_torch.py" --ranks 2 --threads 1 --layers 4 --dim 256 --heads 8 \
     --vocab 4096 --seq 128 --batch 8 --steps "$steps" --warmup $warmup --bucket-mb "$bucket")
pt_ms=$(echo "$pt" | sed -E 's/.*"ms_per_step": ([0-9.]+).*/\1/')

printf '\n%-22s %10s %12s %16s\n' "run" "ms/step" "tokens/s" "comm B/rank/step"
for r in "${res[@]}"; do
  set -- $r
  printf '%-22s %10.1f %12.0f %16s\n' "fourway $1" "$2" "$(echo "1024 * 1000 / $2" | bc -l)" "$3"
done
printf '%-22s %10.1f %12.0f %16s\n' "pytorch ddp gloo x2" "$pt_ms" "$(echo "1024 * 1000 / $pt_ms" | bc -l)" "-"
ms() { for r in "${res[@]}"; do set -- $r; if [ "$1" = "$want" ]; then echo "$2"; fi; done; }
want=dp2_overlap; dp=$(ms)
want=dp2_no_overlap; dpn=$(ms)
want=zero3; z3=$(ms)
echo
printf 'ratio fourway DP=2 / PyTorch DDP step time   %.3f (target <= 1.0)\n' "$(echo "$dp / $pt_ms" | bc -l)"
printf 'overlap gain: no-overlap / overlap step time %.3f\n' "$(echo "$dpn / $dp" | bc -l)"
printf 'ZeRO-3 / DP step time                        %.3f\n' "$(echo "$z3 / $dp" | bc -l)"
