#!/usr/bin/env bash
# fourway-train-cuda --backend nccl on several GPUs, one process per GPU, against the host
# fourway-train on the same mesh (LocalWorld threads): the loss of every step must agree within
# 1e-4 relative (loss_compare.sh, shared with cuda_vs_host.sh). The processes are started by
# scripts/launch-local.sh with torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR, MASTER_PORT): NCCL's id goes over the TCP rendezvous, no MPI needed.
# For N = 2, 4 and 8 processes, as many as GPUS allows (D = N/2):
#   nN-dp                    --zero 0 over N ranks
#   nN-zero3                 --zero 3 over N ranks
#   nN-tp2                   --tp 2 --dp D
#   nN-pp2-SCHEDULE          --pp 2 --dp D --micro-batches 4, for every schedule: gpipe, 1f1b,
#                            interleaved, zb-h1, zb-v
#   n8-tp2-pp2-dp2-zero3     --tp 2 --pp 2 --dp 2 --zero 3 --micro-batches 2 (N = 8 only)
# The model: 4 layers (the interleaved and ZB-V schedules put 2 chunks on each of 2 stages),
# width 64, 4 heads, T 32, batch 16 (one row per micro-batch at N = 8), 8 AdamW steps at lr 3e-3,
# fp32. Tolerance 1e-4 as cuda_vs_host.sh's fp32 cases: only the summation order differs (NCCL's
# reductions and cuBLAS against LocalWorld's fixed rank order and the host GEMM).
# Prints one `PASS name: ...`, `FAIL name: ...` or `SKIP ...` line per case; exits 0 when all
# that ran pass, 1 when one fails, 77 when fewer than 2 GPUs are visible, 2 for bad arguments.
# Usage: multi_gpu_vs_host.sh HOST_EXE CUDA_EXE OUT_DIR GPUS
#   GPUS: the number of GPUs visible (the caller counts them: nvidia-smi -L)
# Environment: LAUNCH (default scripts/launch-local.sh beside this checkout), CASE_TIMEOUT
#   (seconds each launch may take, default 60: a tiny model's 8 steps), MULTI_GPU_STEPS
#   (default 8).
set -uo pipefail
[ $# -eq 4 ] || { echo "usage: multi_gpu_vs_host.sh HOST_EXE CUDA_EXE OUT_DIR GPUS" >&2; exit 2; }
host=$1 cuda=$2 out=$3 gpus=$4
[[ "$gpus" =~ ^[0-9]+$ ]] || { echo "multi_gpu_vs_host.sh: GPUS must be a number, got '$gpus'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
launch=${LAUNCH:-$here/../../scripts/launch-local.sh}
case_timeout=${CASE_TIMEOUT:-60}
steps=${MULTI_GPU_STEPS:-8}
model=(--layers 4 --dim 64 --heads 4 --seq 32 --batch 16 --lr 3e-3 --seed 7 --quiet)
if [ "$gpus" -lt 2 ]; then
  echo "SKIP: $gpus GPU$([ "$gpus" -eq 1 ] || echo s) visible, needs 2"
  exit 77
fi
mkdir -p "$out"

status=0
# shellcheck source=examples/train/loss_compare.sh
source "$here/loss_compare.sh"
nproc=2
run_cuda() {  # the CUDA side: nproc processes, one per GPU, each rank's output in NAME.ranks/
  local name=$1
  shift
  "$launch" --nproc "$nproc" --timeout "$case_timeout" --logs "$out/$name.ranks" -- "$cuda" "$@"
}

for n in 2 4 8; do
  if [ "$n" -gt "$gpus" ]; then
    echo "SKIP n$n: $gpus GPUs visible, needs $n"
    continue
  fi
  nproc=$n
  d=$((n / 2))
  compare "n$n-dp" 1e-4 --ranks "$n" --zero 0 -- --backend nccl
  compare "n$n-zero3" 1e-4 --ranks "$n" --zero 3 -- --backend nccl
  compare "n$n-tp2" 1e-4 --ranks "$n" --tp 2 --dp "$d" -- --backend nccl
  for s in gpipe 1f1b interleaved zb-h1 zb-v; do
    compare "n$n-pp2-$s" 1e-4 --ranks "$n" --pp 2 --dp "$d" --micro-batches 4 --schedule "$s" \
      -- --backend nccl
  done
  if [ "$n" -eq 8 ]; then
    compare n8-tp2-pp2-dp2-zero3 1e-4 --ranks 8 --tp 2 --pp 2 --dp 2 --zero 3 --micro-batches 2 \
      -- --backend nccl
  fi
done
exit $status
