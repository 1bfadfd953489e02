#!/usr/bin/env bash
# Builds llm.c's GPT-2 trainer, the same-GPU anchor of benchmarks/train/compare_pytorch_gpu.sh
# (LLMC), from the copy in ../shared/anchors/llm.c with the build lines of its README (its code is
# not fourway's and is never copied into it):
#   <build>/llmc/train_gpt2cu         its own attention kernels
#   <build>/llmc/train_gpt2cu_cudnn   its cuDNN flash attention, when the cudnn-frontend headers
#                                     are found (FOURWAY_CUDNN_FRONTEND_DIR, else the CMake cache's)
# Built for sm_90 (H100/H200; ARCH to change), so a staged build carries them to the GPU machine
# (scripts/device-check.sh --stage copies <build>/llmc, and the device check passes them to the
# comparison).
#
#   benchmarks/train/build_llmc.sh [build-dir] [llm.c-dir]   (defaults build/cuda, the anchors')
# Exit: 0 built (the cuDNN one skipped without the headers, said so); 1 nvcc failed; 2 no llm.c
# copy or no nvcc.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build/cuda}
src=${2:-$here/../../../shared/anchors/llm.c}
arch=${ARCH:-sm_90}
die() {
  echo "build_llmc: $1" >&2
  exit "${2:-2}"
}
[ -f "$src/train_gpt2.cu" ] || die "no llm.c at $src (train_gpt2.cu): pass its folder"
command -v nvcc >/dev/null 2>&1 || die "no nvcc on PATH"
fe=${FOURWAY_CUDNN_FRONTEND_DIR:-}
if [ -z "$fe" ] && [ -f "$build/CMakeCache.txt" ]; then
  fe=$(sed -n 's/^FOURWAY_CUDNN_FRONTEND_DIR:PATH=//p' "$build/CMakeCache.txt")
fi
out=$build/llmc
mkdir -p "$out"
common=(--threads=0 -t=0 --use_fast_math -std=c++17 -O3 "-arch=$arch")
echo "build_llmc: $src -> $out ($arch)"
(cd "$src" && nvcc "${common[@]}" train_gpt2.cu -Idev -lcublas -lcublasLt \
  -o "$out/train_gpt2cu") || die "nvcc failed on train_gpt2.cu" 1
if [ -n "$fe" ] && [ -f "$fe/cudnn_frontend.h" ]; then
  (cd "$src" && nvcc -c "${common[@]}" -DENABLE_CUDNN -I"$fe" llmc/cudnn_att.cpp \
      -o "$out/cudnn_att.o" &&
    nvcc "${common[@]}" -DENABLE_CUDNN -Idev -I"$fe" train_gpt2.cu "$out/cudnn_att.o" \
      -lcublas -lcublasLt -lcudnn -lnvrtc -lcuda -o "$out/train_gpt2cu_cudnn") ||
    die "nvcc failed on llm.c's cuDNN build" 1
  rm -f "$out/cudnn_att.o"
else
  echo "build_llmc: no cudnn-frontend headers (FOURWAY_CUDNN_FRONTEND_DIR): train_gpt2cu_cudnn" \
    "not built"
fi
ls -l "$out"
