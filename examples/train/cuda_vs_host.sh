#!/usr/bin/env bash
# fourway-train-cuda against the host fourway-train on the same flags (a 2-layer, width-64 GPT,
# 8 AdamW steps at lr 3e-3 on the built-in corpus); the loss of every step must agree within
#   fp32, 1 rank                      relative 1e-4
#   fp32, 4-rank LocalWorld ZeRO-3    relative 1e-4   (all ranks on one GPU, one stream each)
#   bf16, 4-rank LocalWorld ZeRO-3    relative 5e-3
#   fp32, tp2·dp2 ZeRO-1 (4 ranks)    relative 1e-4   (tensor parallelism)
#   fp32, tp2·pp2·dp2 ZeRO-1 (8)      relative 1e-4   (the 3D mesh: p2p between stages too)
#   fp32, cp2·dp2 ZeRO-3 (4 ranks)    relative 1e-4   (context parallelism: the CUDA ring)
#   bf16, cp2·pp2 (4 ranks)           relative 5e-3   (the ring in bf16, under a pipeline)
#   fp32, --classifier-chunk 64       relative 1e-4   (the fused classifier: 4 chunks of 64 tokens)
#   fp16, 1 rank                      relative 5e-3   (loss scaling, the fp16 kernels end to end)
#   bf16, --attention fused           relative 5e-3   (the tensor-core attention, head size 16,
#                                                      against the host's bf16 run; the program
#                                                      must say it runs the fused kernels)
#   --tf32 against the host's fp32    relative 2e-3   (TF32 rounds GEMM inputs to 10 bits)
#   fp32, 1 rank, --cuda-graph off    relative 1e-4   (the one-rank cases above capture their
#                                                      step in a CUDA graph, fourway-train-cuda's
#                                                      default: this one launches it kernel by
#                                                      kernel; fp32-1rank must say it captured)
# Tolerances: in fp32 only the summation order differs (cuBLAS vs the host GEMM, device vs host
# collectives): ~1e-6 relative per step, grown by the AdamW steps; 1e-4 as in
# tests/parallel/sharded_cuda_test.cu. In bf16 the whole effect of bf16 rounding on this run is
# 7e-4 (host bf16 vs host fp32, largest step), so two summation orders in bf16 stay well inside
# 5e-3; another random initialization already moves the losses by 1.3e-2, and a wrong kernel by
# far more. fp16 and TF32 round to 11 bits where bf16 rounds to 8, so they sit well inside bf16's
# bound (2e-3 for TF32, whose only rounding is the GEMMs' inputs).
# Prints one `PASS name: ...` or `FAIL name: ...` line per case; exits 0 when all pass, 1 when
# one fails, 77 when no GPU is visible (ctest reports that as skipped).
# Usage: cuda_vs_host.sh HOST_EXE CUDA_EXE OUT_DIR
set -uo pipefail
host=$1 cuda=$2 out=$3
mkdir -p "$out"
# --precision fp32 unless a case names one (the flag is refused twice): fourway-train-cuda defaults
# to bf16, the host to fp32
model=(--layers 2 --dim 64 --heads 4 --seq 32 --batch 8 --lr 3e-3 --seed 7 --quiet)
steps=8

if ! "$cuda" "${model[@]}" --precision fp32 --steps 0 > "$out/probe.txt" 2>&1; then
  if grep -q "no CUDA device is visible" "$out/probe.txt"; then
    echo "SKIP: no CUDA device is visible"
    exit 77
  fi
  cat "$out/probe.txt"
  echo "FAIL probe: fourway-train-cuda --steps 0 failed"
  exit 1
fi

# losses, compare: loss_compare.sh (shared with multi_gpu_vs_host.sh)
status=0
# shellcheck source=examples/train/loss_compare.sh
source "$(dirname "$0")/loss_compare.sh"

compare fp32-1rank 1e-4
compare fp32-zero3-4ranks 1e-4 --ranks 4 --zero 3
compare bf16-zero3-4ranks 5e-3 --ranks 4 --zero 3 --precision bf16
compare fp32-tp2-dp2-zero1 1e-4 --tp 2 --dp 2 --zero 1
compare fp32-tp2-pp2-dp2-zero1 1e-4 --tp 2 --pp 2 --dp 2 --zero 1 --micro-batches 2
compare fp32-cp2-dp2-zero3 1e-4 --cp 2 --dp 2 --zero 3
compare bf16-cp2-pp2 5e-3 --cp 2 --pp 2 --micro-batches 2 --precision bf16
compare fp32-classifier-chunk 1e-4 --classifier-chunk 64
compare fp16-1rank 5e-3 --precision fp16
compare bf16-fused-attention 5e-3 --precision bf16 -- --attention fused
# the layers fall back to the blockwise path where the fused kernels refuse: this case must not
if ! grep -q '^attention: fused' "$out/bf16-fused-attention.cuda.txt" 2>/dev/null; then
  echo "FAIL bf16-fused-attention: fourway-train-cuda did not run the fused kernels:" \
    "$(grep '^attention:' "$out/bf16-fused-attention.cuda.txt" 2>/dev/null || echo 'no attention line')"
  status=1
fi
compare tf32-1rank 2e-3 -- --tf32
compare fp32-1rank-uncaptured 1e-4 -- --cuda-graph off
# a one-rank run captures its step by default: fp32-1rank must have, or it tested the other path
if ! grep -Eq '^cuda graph: [0-9]+ captures?, [0-9]+ of' "$out/fp32-1rank.cuda.txt" 2>/dev/null; then
  echo "FAIL fp32-1rank: fourway-train-cuda did not capture its step:" \
    "$(grep '^cuda graph:' "$out/fp32-1rank.cuda.txt" 2>/dev/null || echo 'no cuda graph line')"
  status=1
fi
exit $status
