#!/usr/bin/env bash
# The real-text demo (docs/train.md, "A run on real text"), what `cmake --workflow --preset
# text-demo` runs: the licence texts this machine ships (/usr/share/common-licenses, no download)
# as byte ids, split into training and validation files by fourway-data; a 4-layer GPT trained on
# them by fourway-train on the 3D mesh tp2·pp2·dp2 with ZeRO-1 (8 LocalWorld ranks), evaluated on
# the held-out bytes every 25 steps, saved; a sample from the saved weights; and the training
# and validation curves drawn by tools/plot_log.py into OUT/curves.svg.
#
#   scripts/text-demo.sh BUILD_DIR OUT_DIR [STEPS]     (BUILD_DIR holds fourway-train and
#                                                       fourway-data; STEPS default 600)
set -euo pipefail
build=${1:?usage: text-demo.sh BUILD_DIR OUT_DIR [STEPS]}
out=${2:?usage: text-demo.sh BUILD_DIR OUT_DIR [STEPS]}
steps=${3:-600}
here=$(cd "$(dirname "$0")/.." && pwd)
train="$build/examples/train/fourway-train"
data="$build/examples/data/fourway-data"
mkdir -p "$out"
echo "== 1. text -> token files (byte ids): /usr/share/common-licenses"
"$data" encode --tokenizer bytes --out "$out/licences" --val-tokens 16384 /usr/share/common-licenses
echo "== 2. train on tp2 x pp2 x dp2 (ZeRO-1), validation every 25 steps"
"$train" --data "$out/licences_train.bin" --val-data "$out/licences_val.bin" --eval-every 25 \
  --eval-batches 8 --vocab 256 --layers 4 --dim 128 --heads 4 --seq 128 --batch 8 \
  --steps "$steps" --lr 3e-3 --warmup $((steps / 20)) --min-lr 3e-4 --weight-decay 0.1 \
  --tp 2 --pp 2 --dp 2 --zero 1 --micro-batches 4 \
  --log-json "$out/log.jsonl" --save "$out/model.safetensors" --quiet
echo "== 3. a sample from the saved weights"
"$train" --init-from "$out/model.safetensors" --data "$out/licences_val.bin" --steps 0 \
  --batch 1 --seq 128 --sample-tokens 96 --prompt "Permission is hereby granted" \
  --temperature 0.8 --top-k 40 --sample-seed 7 --tokenizer bytes --quiet
echo "== 4. the curves"
python3 "$here/tools/plot_log.py" "$out/log.jsonl" "$out/curves.svg" \
  --title "fourway-train on the licence texts: 4 layers, width 128, tp2 x pp2 x dp2"
