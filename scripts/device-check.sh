#!/usr/bin/env bash
# The GPU check in one call, for a machine with an NVIDIA GPU (written for one H200, sm_90, 16
# cores, CUDA 13, CMake, ninja and Python with PyTorch's NCCL wheel — but no GoogleTest, no Google
# Benchmark, no MPI and no network). It ends with one table: every step ok / FAILED / TIMEOUT /
# NOT RUN, its seconds, and the figures.
#
#   kit-build            GoogleTest (and Google Benchmark when the kit has it) from the device kit
#                        (.device-kit/, carried with the run)
#   configure            the `cuda` preset, Ninja, NCCL from the Python wheel; benchmarks on when
#                        Google Benchmark was built
#   build                only what the checks need: every gpu-labelled test's executable,
#                        fourway-train, fourway-train-cuda (and bench_kernels_gpu)
#   gpu-tests            ctest -L gpu (a gpu test that reports Skipped on a GPU machine fails)
#   memcheck-*           compute-sanitizer --tool memcheck on the kernel and LocalWorld-on-GPU tests
#   racecheck-*          compute-sanitizer --tool racecheck on the same
#   gpt-step             one GPT step GPU vs host: small shapes, and GPT-2 124M's width, heads and
#                        vocabulary at T = 1024 with 2 layers (fp32)
#   train-cuda-vs-host   fourway-train-cuda vs fourway-train: 1 rank; 4-rank ZeRO-3 on LocalWorld on
#                        one GPU (fp32, bf16); tp2·dp2 and the 3D mesh tp2·pp2·dp2 (fp32); the
#                        fused classifier (fp32), fp16, bf16 with --attention fused, --tf32
#                        (examples/train/cuda_vs_host.sh)
#   multi-gpu            with 2 or more GPUs visible: fourway-train-cuda --backend nccl on 2, 4
#                        and 8 processes (as many as there are GPUs), started with torchrun-style
#                        variables by scripts/launch-local.sh (no MPI here), against the host
#                        program's losses: dp, ZeRO-3, tp2, pp2 with every schedule, tp2·pp2·dp2
#                        ZeRO-3 (examples/train/multi_gpu_vs_host.sh). With fewer GPUs it is
#                        NOT RUN with the reason, which does not fail the check (the verdict line
#                        names it)
#   train-vs-pytorch-gpu one GPT-2 124M training step (12 layers, width 768, vocab 50257, T 1024,
#                        B 8, bf16 with fp32 masters, AdamW, clip 1.0): fourway-train-cuda vs
#                        PyTorch eager (and SDPA) on the same GPU, 3 interleaved rounds, fourway
#                        with its blockwise and its fused attention; tokens/s, MFU and the ratios
#                        in the table (benchmarks/train/compare_pytorch_gpu.sh)
#   train-vs-pytorch-gpu-b64  the same at B 64 (llm.c's published batch at T 1024): fourway
#                        (blockwise and fused), llm.c when staged, PyTorch SDPA and torch.compile
#                        (eager's (B, H, T, T) scores left out), 3 rounds of 4 timed steps
#   bench-kernels        near the end, with what is left of the budget: bench_kernels_gpu (GEMM
#                        vs a direct cuBLAS call, AdamW (one tensor and GPT-2's 148) / LayerNorm /
#                        GELU / softmax / cross-entropy / column sum vs the copy bandwidth,
#                        attention fused / blockwise / tiled / materialised), its JSON kept in the
#                        logs, figures in the table
#   bench-comm           bench_comm_gpu: 8 bf16 GEMMs with a 32 MiB all-reduce after each, on
#                        NcclComm's communication stream and on the bound stream, 3 interleaved
#                        repetitions (the overlap of gradient reduction with compute)
#   profile-step         last: every kernel of one GPT-2 124M bf16 step (B 8, T 1024, fused
#                        attention) timed by Nsight Compute, summed by kernel function; the top
#                        ones in the table
#                        (benchmarks/train/profile_step_gpu.sh)
#
# Every step runs under `timeout` with its own limit, cut to what is left of the total budget
# (DEVICE_CHECK_BUDGET, 480 s); a step the budget cannot start is NOT RUN. A step's command sees
# that limit in STEP_LIMIT_S (compare_pytorch_gpu.sh stops starting rounds before it).
#
# Building on the GPU machine costs minutes of its time (fourway-train-cuda's one translation unit
# takes over 6 minutes on one core here), so the check can also run what was built elsewhere:
#   kit-build, configure, build   replaced by one `prebuilt` row when --prebuilt DIR is given
#
# Usage:
#   scripts/device-check.sh --prepare [SRC]  here (a machine with the kit sources): copy the kit
#                                            from SRC (default ../shared/device-kit beside the
#                                            checkout) into .device-kit/ (git-ignored)
#   scripts/device-check.sh --stage [DIR]    here, after building the check's targets in --build
#                                            (sm_90, Release, no MPI, no CBLAS, portable -march;
#                                            docs/building.md): copy the executables, Google
#                                            Benchmark's shared library and ctest's files into
#                                            DIR (default .device-build, git-ignored), stripped
#   scripts/device-check.sh --dry-run        parse, check the kit, print the plan; no GPU needed
#   scripts/device-check.sh                  on the GPU machine, with .device-kit carried along
#   scripts/device-check.sh --prebuilt DIR   on the GPU machine, with the staged DIR carried along
#                                            (no kit needed; ctest's paths are rewritten there)
# Options: --kit DIR (default .device-kit), --build DIR (default build/cuda), --budget S, --jobs N,
#   --only STEP[,STEP...]  run only the named steps after the build (or prebuilt) ones, say to rerun
#                          one that failed with the rest of the budget; the others are rows marked
#                          "not asked" and the verdict line names the steps that ran.
# Exit: 0 all ok (a step this machine lacks the GPUs for is NOT RUN without failing; the verdict
#   names it); 1 a step failed, timed out or was not run; 2 bad arguments or no kit.
# With $OUT set (the device tool's output folder) the table and a tarball of the logs go there.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=run
kit=${FOURWAY_DEVICE_KIT:-$root/.device-kit}
build=$root/build/cuda
budget=${DEVICE_CHECK_BUDGET:-480}
jobs=${JOBS:-$(nproc)}
prepare_src=$root/../shared/device-kit
stage_dir=$root/.device-build
prebuilt=
only=

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() {
  echo "device-check: $*" >&2
  exit 2
}
number() { [[ "$2" =~ ^[0-9]+$ ]] || die "$1 needs a whole number, got '$2'"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) mode=dry ;;
    --prepare)
      mode=prepare
      if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then
        prepare_src=$2
        shift
      fi
      ;;
    --stage)
      mode=stage
      if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then
        stage_dir=$2
        shift
      fi
      ;;
    --prebuilt) [ $# -gt 1 ] || die "--prebuilt needs the staged folder"; prebuilt=$2; shift ;;
    --kit) [ $# -gt 1 ] || die "--kit needs a folder"; kit=$2; shift ;;
    --build) [ $# -gt 1 ] || die "--build needs a folder"; build=$2; shift ;;
    --budget) [ $# -gt 1 ] || die "--budget needs seconds"; number --budget "$2"; budget=$2; shift ;;
    --jobs) [ $# -gt 1 ] || die "--jobs needs a number"; number --jobs "$2"; jobs=$2; shift ;;
    --only) [ $# -gt 1 ] || die "--only needs step names (comma-separated)"; only=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
  shift
done
case "$kit" in /*) ;; *) kit=$(pwd)/$kit ;; esac
case "$build" in /*) ;; *) build=$(pwd)/$build ;; esac
case "$stage_dir" in /*) ;; *) stage_dir=$(pwd)/$stage_dir ;; esac
case "$prebuilt" in /*|'') ;; *) prebuilt=$(pwd)/$prebuilt ;; esac

# ---- a staged build -----------------------------------------------------------------------------
# What the steps run: every gpu-labelled test's executable, the two trainers and the GPU
# benchmarks, at their paths under the build folder; ctest's files beside them (their absolute
# paths name this checkout and this build, and are rewritten on the GPU machine).
staged_programs=(tests/backend/backend_kernels_cuda_test tests/comm/comm_cuda_test
                 tests/core/core_cuda_backend_test tests/layers/layers_cuda_test
                 tests/parallel/parallel_sharded_cuda_test
                 tests/parallel/parallel_tensor_parallel_cuda_test
                 tests/parallel/parallel_ring_attention_cuda_test
                 tests/train/train_trainer_cuda_test examples/train/fourway-train
                 examples/train/fourway-train-cuda benchmarks/backend/bench_kernels_gpu
                 benchmarks/comm/bench_comm_gpu)

if [ "$mode" = stage ]; then
  [ -f "$build/CTestTestfile.cmake" ] || die "cannot stage: $build is not a configured build \
(configure and build it first: docs/building.md, 'A staged build')"
  for f in "${staged_programs[@]}"; do
    [ -x "$build/$f" ] || die "cannot stage: $build/$f is not built (build the check's targets \
first: docs/building.md, 'A staged build')"
  done
  rm -rf "$stage_dir"
  mkdir -p "$stage_dir/lib"
  (cd "$build" && find . \( -name CTestTestfile.cmake -o -name '*_include.cmake' \
     -o -name '*_tests.cmake' \) -print0 | xargs -0 cp --parents -t "$stage_dir") ||
    die "cannot copy ctest's files from $build"
  for f in "${staged_programs[@]}"; do
    mkdir -p "$stage_dir/$(dirname "$f")"
    strip -o "$stage_dir/$f" "$build/$f" || die "cannot strip $build/$f"
  done
  # llm.c's trainers, the comparison's anchor, when benchmarks/train/build_llmc.sh built them
  if compgen -G "$build/llmc/train_gpt2cu*" > /dev/null; then
    mkdir -p "$stage_dir/llmc" && cp "$build"/llmc/train_gpt2cu* "$stage_dir/llmc/" ||
      die "cannot copy $build/llmc"
  fi
  # shared libraries the GPU machine lacks (Google Benchmark); CUDA's, cuBLAS's and NCCL's are there
  while read -r lib; do
    cp -L "$lib" "$stage_dir/lib/" || die "cannot copy $lib"
  done < <(ldd "$build/benchmarks/backend/bench_kernels_gpu" | awk '/libbenchmark/ { print $3 }')
  # the commit the programs were built from, so a later session knows whether they are current
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] &&
    commit="$commit with uncommitted changes"
  { echo "source $root"; echo "build $build"
    echo "staged $(date -u +%FT%TZ) on $(hostname), commit $commit"; } > "$stage_dir/STAGED"
  echo "device-check: staged ${#staged_programs[@]} programs from $build in $stage_dir" \
       "($(du -sh "$stage_dir" | cut -f1)); send it with the run (device tool: carry" \
       "[\"${stage_dir#"$root"/}\"], command scripts/device-check.sh --prebuilt" \
       "${stage_dir#"$root"/})"
  exit 0
fi
if [ -n "$prebuilt" ]; then
  [ -f "$prebuilt/STAGED" ] || die "--prebuilt $prebuilt: no STAGED file there (stage it with \
scripts/device-check.sh --stage on the machine that built it, and carry the folder)"
  for f in "${staged_programs[@]}"; do
    [ -x "$prebuilt/$f" ] || die "--prebuilt $prebuilt: $f is missing (stage again)"
  done
  build=$prebuilt
fi

# ---- the device kit -----------------------------------------------------------------------------
# What the GPU machine lacks, as sources: GoogleTest (required) and Google Benchmark (optional:
# without it the kernel benchmarks are not built and bench-kernels is NOT RUN).
kit_files=(googletest/CMakeLists.txt googletest/googletest/include/gtest/gtest.h
           googletest/googletest/src/gtest-all.cc)

if [ "$mode" = prepare ]; then
  for f in "${kit_files[@]}"; do
    [ -f "$prepare_src/$f" ] || die "cannot prepare the kit: $prepare_src/$f is missing (pass the \
device-kit folder: scripts/device-check.sh --prepare SRC)"
  done
  rm -rf "$kit"
  mkdir -p "$kit"
  cp -R "$prepare_src/googletest" "$kit/googletest"
  [ -d "$prepare_src/benchmark" ] && cp -R "$prepare_src/benchmark" "$kit/benchmark"
  [ -f "$prepare_src/README.md" ] && cp "$prepare_src/README.md" "$kit/README.md"
  echo "prepared from $(cd "$prepare_src" && pwd) on $(date -u +%FT%TZ)" > "$kit/PREPARED"
  echo "device-check: kit prepared in $kit ($(du -sh "$kit" | cut -f1)); send it with the run" \
       "(device tool: carry [\"${kit#"$root"/}\"])"
  exit 0
fi

missing=()
[ -z "$prebuilt" ] && for f in "${kit_files[@]}"; do [ -f "$kit/$f" ] || missing+=("$f"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "device-check: the device kit is missing or incomplete at $kit (missing: ${missing[*]})." >&2
  echo "  Prepare it on a machine that has the kit sources: scripts/device-check.sh --prepare" \
       "[SRC] (SRC defaults to ../shared/device-kit beside the checkout), then send .device-kit" \
       "with the run (device tool: carry [\".device-kit\"]). See docs/building.md." >&2
  exit 2
fi

# ---- the plan -----------------------------------------------------------------------------------
# name|limit seconds|what
plan=(
  "kit-build|40|GoogleTest from $kit/googletest into $build-kit"
  "configure|60|cmake --preset cuda -G Ninja (benchmarks off, NCCL from the Python wheel if any)"
  "build|160|every gpu-labelled test's executable + fourway-train + fourway-train-cuda, -j $jobs"
  "gpu-tests|50|ctest -L gpu (but layers_cuda_test and the train comparison: own steps)"
  "memcheck-kernels|25|compute-sanitizer --tool memcheck backend_kernels_cuda_test"
  "memcheck-localworld|20|compute-sanitizer --tool memcheck comm_cuda_test, LocalWorld tests (fp32)"
  "memcheck-graph|30|compute-sanitizer --tool memcheck train_trainer_cuda_test: the one-rank step captured in a CUDA graph and replayed (TrainerCuda.CapturedSteps*)"
  "racecheck-kernels|90|compute-sanitizer --tool racecheck backend_kernels_cuda_test (fp32, not the cuBLAS GEMM tests; attention: tiled, and fused in bf16)"
  "racecheck-localworld|15|compute-sanitizer --tool racecheck comm_cuda_test, LocalWorld tests (fp32)"
  "gpt-step|90|layers_cuda_test --gtest_filter=GptCuda.*MatchesHost (small; GPT-2 width T=1024)"
  "train-cuda-vs-host|110|examples/train/cuda_vs_host.sh: 1 rank; 4-rank ZeRO-3 LocalWorld fp32, bf16; tp2 dp2; tp2 pp2 dp2; cp2 dp2 ZeRO-3, cp2 pp2 bf16; classifier chunks; fp16; fused attention; tf32; one rank uncaptured (the others capture by default)"
  "multi-gpu|300|examples/train/multi_gpu_vs_host.sh: --backend nccl on 2, 4, 8 GPUs (launch-local.sh, torchrun-style): dp, zero3, tp2, pp2 x gpipe/1f1b/interleaved/zb-h1/zb-v, tp2 pp2 dp2 zero3 vs host losses; needs >= 2 GPUs"
  "train-vs-pytorch-gpu|180|benchmarks/train/compare_pytorch_gpu.sh: GPT-2 124M bf16 B8 T1024, fourway-train-cuda (blockwise captured in a CUDA graph and not, fused) vs PyTorch eager/SDPA/torch.compile with fused AdamW, 3 rounds (torch.compile's compilation in each round's warm-up)"
  "train-vs-pytorch-gpu-b64|150|benchmarks/train/compare_pytorch_gpu.sh at B64 T1024: fourway-train-cuda (blockwise and fused) vs PyTorch SDPA/torch.compile (and llm.c when staged), 3 rounds of 4 timed steps"
  "bench-kernels|60|bench_kernels_gpu: GEMM vs cuBLAS, gelu(x·W+b) fused vs unfused, AdamW (one tensor, GPT-2's list)/LayerNorm/GELU/softmax/cross-entropy/column sum vs copy, attention fused/blockwise/tiled/materialised"
  "bench-comm|30|bench_comm_gpu: GEMMs + bucket all-reduces on the communication stream vs the bound stream, 3 interleaved repetitions"
  "profile-step|180|benchmarks/train/profile_step_gpu.sh: ncu times every kernel of one GPT-2 124M bf16 step (fused attention)"
)

# --only: names the plan knows, not the build steps (they run whenever they are needed)
if [ -n "$only" ]; then
  IFS=, read -r -a only_steps <<< "$only"
  for o in "${only_steps[@]}"; do
    known=0
    for p in "${plan[@]:3}"; do [ "${p%%|*}" = "$o" ] && known=1; done
    [ "$known" -eq 1 ] || die "--only: '$o' is not a step after the build (see --help)"
  done
fi
asked() {  # asked NAME: whether --only leaves NAME to run
  [ -z "$only" ] && return 0
  local o
  for o in "${only_steps[@]}"; do [ "$o" = "$1" ] && return 0; done
  return 1
}

if [ -n "$prebuilt" ]; then  # the three build steps become one
  plan=("prebuilt|10|staged programs in $prebuilt: ctest's paths rewritten, libraries found"
        "${plan[@]:3}")
  echo "== device-check ($mode): prebuilt $prebuilt ($(sed -n 's/^staged //p' "$prebuilt/STAGED")), budget ${budget}s"
else
  echo "== device-check ($mode): kit $kit, build $build, budget ${budget}s, -j $jobs"
fi
printf '   %-24s %5s  %s\n' step limit what
for p in "${plan[@]}"; do
  IFS='|' read -r n l w <<< "$p"
  case "$n" in kit-build|configure|build|prebuilt) ;; *) asked "$n" || w="(not asked) $w" ;; esac
  printf '   %-24s %5s  %s\n' "$n" "${l}s" "$w"
done
# GPUs this run may use: nvidia-smi's list, cut to CUDA_VISIBLE_DEVICES when that is set
visible_gpus() {
  local n v
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    IFS=, read -r -a v <<< "$CUDA_VISIBLE_DEVICES"
    [ "${#v[@]}" -lt "$n" ] && n=${#v[@]}
  fi
  echo "${n:-0}"
}
if [ "$mode" = dry ]; then
  for tool in nvidia-smi nvcc compute-sanitizer cmake ninja python3; do
    if command -v "$tool" >/dev/null 2>&1; then s=found; else s="not found here"; fi
    printf '   tool %-18s %s\n' "$tool" "$s"
  done
  printf '   %-23s %s\n' "GPUs visible" "$(visible_gpus) (multi-gpu needs 2)"
  what=kit
  [ -n "$prebuilt" ] && what="staged programs"
  echo "device-check: dry run ok ($what present, ${#plan[@]} steps planned)"
  exit 0
fi

# ---- running steps ------------------------------------------------------------------------------
logdir=$build/device-check
mkdir -p "$logdir"
rm -f "$logdir"/*.log
t0=$(date +%s)
rows=()
failed=0
limit_of() {
  local p n l w
  for p in "${plan[@]}"; do
    IFS='|' read -r n l w <<< "$p"
    [ "$n" = "$1" ] && { echo "$l"; return; }
  done
  echo 60
}
row() { rows+=("$1|$2|$3|$4"); }
# step NAME CMD...: runs CMD under timeout (its limit, or what is left of the budget), logs to
# $logdir/NAME.log, adds a row; returns CMD's status (124 for a step the budget cannot start).
step() {
  local name=$1 limit
  shift
  if ! asked "$name"; then
    row "$name" "-" 0 "not asked (--only $only)"
    : > "$logdir/$name.log"
    return 0
  fi
  limit=$(limit_of "$name")
  local left=$((budget - ($(date +%s) - t0)))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    row "$name" "NOT RUN" 0 "budget of ${budget}s spent"
    failed=1
    return 124
  fi
  echo "== $name (limit ${limit}s)"
  local s rc
  s=$(date +%s)
  STEP_LIMIT_S=$limit timeout --kill-after=5 "$limit" "$@" > "$logdir/$name.log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - s))
  if [ $rc -eq 0 ]; then
    row "$name" ok "$dt" ""
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    row "$name" TIMEOUT "$dt" "limit ${limit}s; log $name.log"
    failed=1
  else
    row "$name" FAILED "$dt" "exit $rc; log $name.log"
    failed=1
    tail -15 "$logdir/$name.log"
  fi
  return $rc
}
absent_steps=()
absent() {  # absent NAME WHY: a step this machine lacks the hardware for: NOT RUN, not a failure
  if ! asked "$1"; then
    row "$1" "-" 0 "not asked (--only $only)"
    return 0
  fi
  row "$1" "NOT RUN" 0 "$2"
  absent_steps+=("$1 NOT RUN: $2")
}
skip() {  # skip NAME WHY: a step that cannot run because an earlier one failed
  if ! asked "$1"; then
    row "$1" "-" 0 "not asked (--only $only)"
    return 0
  fi
  row "$1" "NOT RUN" 0 "$2"
  failed=1
}
note() {  # note NAME TEXT: appends TEXT (when not empty) to NAME's row
  local i
  [ -n "$2" ] || return 0
  for i in "${!rows[@]}"; do
    IFS='|' read -r n st dt nt <<< "${rows[$i]}"
    [ "$n" = "$1" ] && rows[$i]="$n|$st|$dt|${nt:+$nt; }$2"
  done
}

echo "== $(date -u +%FT%TZ), $(nproc) cores"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4
nvcc --version 2>/dev/null | tail -1

# NCCL: the toolkit's, else the one in Python's nvidia wheels (libnccl.so.2 has no unversioned name
# there, so the library is passed by path).
nccl_args=()
# Python's site-packages, where PyTorch's nvidia wheels (NCCL, cuBLAS, the CUDA runtime) live
sp=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
if [ ! -f "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")/../include/nccl.h" ]; then
  nccl_h=$(find $sp -maxdepth 5 -path '*nvidia*' -name nccl.h 2>/dev/null | head -1)
  nccl_so=$(find $sp -maxdepth 5 -path '*nvidia*' -name 'libnccl.so*' 2>/dev/null | head -1)
  if [ -n "$nccl_h" ] && [ -n "$nccl_so" ]; then
    nccl_args=(-DFOURWAY_NCCL_INCLUDE_DIR="$(dirname "$nccl_h")" -DFOURWAY_NCCL_LIBRARY="$nccl_so")
    export LD_LIBRARY_PATH=$(dirname "$nccl_so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "NCCL from the Python wheel: $nccl_so"
  else
    echo "NCCL not found (no nccl.h beside nvcc, none in Python's nvidia wheels)"
  fi
fi

# A staged build: ctest's files name the checkout and build folder they were made in; point them
# here. The programs find Google Benchmark in lib/, CUDA's libraries beside nvcc or in Python's
# nvidia wheels; any library still not found fails the row (ldd's lines in prebuilt.log).
use_prebuilt() {
  local old_src old_build f lib missing_libs
  old_src=$(sed -n 's/^source //p' "$prebuilt/STAGED")
  old_build=$(sed -n 's/^build //p' "$prebuilt/STAGED")
  while IFS= read -r -d '' f; do
    sed -i -e "s#$old_build#$prebuilt#g" -e "s#$old_src#$root#g" "$f" || return 1
  done < <(find "$prebuilt" -name '*.cmake' -print0)
  local dirs=("$prebuilt/lib")
  command -v nvcc >/dev/null 2>&1 && dirs+=("$(dirname "$(command -v nvcc)")/../lib64")
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    f=$(find $sp -maxdepth 5 -path '*nvidia*' -name "$lib" 2>/dev/null | head -1)
    [ -n "$f" ] && dirs+=("$(dirname "$f")")
  done
  export LD_LIBRARY_PATH=$(IFS=:; echo "${dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  missing_libs=0
  for f in "${staged_programs[@]}"; do
    echo "-- ldd $f"
    ldd "$prebuilt/$f"
    ldd "$prebuilt/$f" | grep -q 'not found' && missing_libs=1
  done
  return $missing_libs
}

prefix=$build-kit
if [ -n "$prebuilt" ]; then
  use_prebuilt > "$logdir/prebuilt.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    row prebuilt ok 0 "$(sed -n 's/^staged //p' "$prebuilt/STAGED")"
  else
    row prebuilt FAILED 0 "a library is not found or a path not rewritten; log prebuilt.log"
    failed=1
    grep 'not found' "$logdir/prebuilt.log" | sort -u | head -5
  fi
  benchmarks=ON
elif [ -f "$prefix/lib/cmake/GTest/GTestConfig.cmake" ] || [ -f "$prefix/lib64/cmake/GTest/GTestConfig.cmake" ]; then
  row kit-build ok 0 "already built in $prefix"
else
  bench_kit=true
  if [ -f "$kit/benchmark/CMakeLists.txt" ]; then
    bench_kit="cmake -S '$kit/benchmark' -B '$build-kit-bench' -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX='$prefix' -DBENCHMARK_ENABLE_TESTING=OFF \
      -DBENCHMARK_ENABLE_GTEST_TESTS=OFF -DBENCHMARK_ENABLE_WERROR=OFF && \
      cmake --build '$build-kit-bench' -j $jobs && cmake --install '$build-kit-bench'"
  fi
  step kit-build bash -c "cmake -S '$kit/googletest' -B '$build-kit-build' -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX='$prefix' -DBUILD_GMOCK=OFF && \
    cmake --build '$build-kit-build' -j $jobs && cmake --install '$build-kit-build' && $bench_kit"
fi
if [ -z "$prebuilt" ]; then
  benchmarks=OFF
  compgen -G "$prefix/lib*/cmake/benchmark/benchmarkConfig.cmake" >/dev/null && benchmarks=ON
fi

if [ -n "$prebuilt" ]; then
  :  # nothing to configure or build
elif [ "$failed" -eq 0 ]; then
  step configure cmake --preset cuda -G Ninja -B "$build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DFOURWAY_BUILD_BENCHMARKS=$benchmarks "${nccl_args[@]}"
else
  skip configure "kit-build failed"
fi

if [ -n "$prebuilt" ]; then
  :
elif [ "$failed" -eq 0 ]; then
  mapfile -t gpu_tests < <(ctest --test-dir "$build" -L gpu -N 2>/dev/null |
    sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/\1/p' | sort -u)
  targets=(fourway-train fourway-train-cuda)
  [ "$benchmarks" = ON ] && targets+=(bench_kernels_gpu)
  [ "$benchmarks" = ON ] && ninja -C "$build" -t query bench_comm_gpu >/dev/null 2>&1 &&
    targets+=(bench_comm_gpu)
  for t in "${gpu_tests[@]}"; do
    ninja -C "$build" -t query "$t" >/dev/null 2>&1 && targets+=("$t")
  done
  step build cmake --build "$build" -j "$jobs" --target "${targets[@]}"
  note build "${#targets[@]} targets"
  ctest --test-dir "$build" -N -R '^comm_cuda_test$' 2>/dev/null | grep -q comm_cuda_test ||
    note build "no NCCL: comm_cuda_test not built"
else
  skip build "configure failed"
fi

exe() { find "$build/tests" -type f -perm -u+x -name "$1" | head -1; }
built=$([ "$failed" -eq 0 ] && echo 1 || echo 0)
if [ "$built" -eq 1 ]; then
  step gpu-tests ctest --test-dir "$build" -L gpu --output-on-failure -j 4 --timeout 50 \
    -E '^(layers_cuda_test|train_fourway_train_cuda_vs_host)$'
  note gpu-tests "$(grep -E 'tests passed' "$logdir/gpu-tests.log" | tail -1)"
  nskip=$(grep -c "(Skipped)" "$logdir/gpu-tests.log" || true)
  if [ "${nskip:-0}" -gt 0 ]; then
    note gpu-tests "$nskip SKIPPED on a GPU machine"
    failed=1
  fi
  kernels=$(exe backend_kernels_cuda_test)
  comm=$(exe comm_cuda_test)
  # LocalWorld under the sanitizers: the fp32 instance of the typed test (1-8 ranks) and the
  # bitwise and refusal tests. racecheck (shared-memory hazards, independent of the element type)
  # runs the fp32 instances of the kernel tests but the GEMM ones (cuBLAS's kernels under
  # racecheck took over 20 s on the first GPU run, and they are not fourway's), and of the
  # attention test only the kernels that share memory: the tiled ones, and the fused ones in the
  # bf16 instance (they take 16-bit types only; the blockwise paths are cuBLAS and warp-shuffle
  # element kernels, and with them the step outran 40 s); memcheck runs all three types and
  # every path.
  localworld='DeviceComm/0.LocalWorld*:DeviceComm.*LocalWorld*'
  sanitize() {  # sanitize STEP TOOL EXE FILTER
    if ! command -v compute-sanitizer >/dev/null 2>&1 || [ -z "$3" ]; then
      skip "$1" "compute-sanitizer or the test executable missing (comm_cuda_test needs NCCL)"
      return
    fi
    step "$1" compute-sanitizer --tool "$2" --error-exitcode 1 "$3" --gtest_filter="$4"
    note "$1" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logdir/$1.log" | tail -1)"
  }
  sanitize memcheck-kernels memcheck "$kernels" '*'
  sanitize memcheck-localworld memcheck "$comm" "$localworld"
  sanitize memcheck-graph memcheck "$(exe train_trainer_cuda_test)" 'TrainerCuda.CapturedSteps*'
  FOURWAY_TEST_ATTENTION_PATHS=tiled,fused sanitize racecheck-kernels racecheck "$kernels" \
    'CudaKernels/0.*:CudaKernels/1.FlashAttention*-CudaKernels/0.Gemm*'
  sanitize racecheck-localworld racecheck "$comm" "$localworld"
  gpt=$(exe layers_cuda_test)
  if [ -n "$gpt" ]; then
    step gpt-step "$gpt" --gtest_filter='GptCuda.*MatchesHost'
    while IFS= read -r f; do note gpt-step "${f#FIGURE gpt-step }"; done \
      < <(grep -E '^(FIGURE gpt-step|gpt-step T1024)' "$logdir/gpt-step.log")
  else
    skip gpt-step "layers_cuda_test not built"
  fi
  train_host=$build/examples/train/fourway-train
  train_cuda=$build/examples/train/fourway-train-cuda
  if [ -x "$train_host" ] && [ -x "$train_cuda" ]; then
    step train-cuda-vs-host "$root/examples/train/cuda_vs_host.sh" "$train_host" "$train_cuda" \
      "$logdir/train-cuda-vs-host"
    while IFS= read -r line; do note train-cuda-vs-host "$line"; done \
      < <(grep -E '^(PASS|FAIL|SKIP)' "$logdir/train-cuda-vs-host.log")
  else
    skip train-cuda-vs-host "fourway-train or fourway-train-cuda not built"
  fi
  # several GPUs: one process per GPU over NCCL, started the way torchrun starts them
  gpus=$(visible_gpus)
  if [ "$gpus" -lt 2 ]; then
    absent multi-gpu "$gpus GPU$([ "$gpus" -eq 1 ] || echo s) visible, needs 2"
  elif [ -x "$train_host" ] && [ -x "$train_cuda" ]; then
    step multi-gpu "$root/examples/train/multi_gpu_vs_host.sh" "$train_host" "$train_cuda" \
      "$logdir/multi-gpu" "$gpus"
    log=$logdir/multi-gpu.log
    note multi-gpu "$gpus GPUs, $(grep -c '^PASS' "$log") of $(grep -cE '^(PASS|FAIL)' "$log") cases passed"
    # the first three failures (every one is in the log), then the sizes left out
    while IFS= read -r line; do note multi-gpu "$line"; done < <(grep '^FAIL' "$log" | head -3)
    nfail=$(grep -c '^FAIL' "$log")
    [ "$nfail" -gt 3 ] && note multi-gpu "$((nfail - 3)) more FAIL lines in multi-gpu.log"
    while IFS= read -r line; do note multi-gpu "$line"; done < <(grep '^SKIP' "$log")
  else
    skip multi-gpu "fourway-train or fourway-train-cuda not built"
  fi
  # GPT-2 124M, fourway-train-cuda vs PyTorch on this GPU: tokens/s, MFU and the ratio as notes
  if [ -x "$train_cuda" ]; then
    # llm.c beside them when it was built (benchmarks/train/build_llmc.sh) or staged
    llmc=$(compgen -G "$build/llmc/train_gpt2cu*" | paste -sd, || true)
    # the blockwise step with and without its CUDA graph (the graph's own gain), and fused
    FW_ATTENTION=blockwise,blockwise-nograph,fused LLMC=$llmc \
      step train-vs-pytorch-gpu "$root/benchmarks/train/compare_pytorch_gpu.sh" "$build"
    while IFS= read -r f; do note train-vs-pytorch-gpu "${f#FIGURE train-vs-pytorch-gpu }"; done \
      < <(grep '^FIGURE train-vs-pytorch-gpu' "$logdir/train-vs-pytorch-gpu.log")
    # the larger batch: llm.c's B 64, the attentions a PyTorch user runs there
    B=64 ROUNDS=3 STEPS=4 WARMUP=2 ATTENTION=sdpa,compile LLMC=$llmc \
      step train-vs-pytorch-gpu-b64 "$root/benchmarks/train/compare_pytorch_gpu.sh" "$build"
    while IFS= read -r f; do note train-vs-pytorch-gpu-b64 "${f#FIGURE train-vs-pytorch-gpu }"; done \
      < <(grep '^FIGURE train-vs-pytorch-gpu' "$logdir/train-vs-pytorch-gpu-b64.log")
  else
    skip train-vs-pytorch-gpu "fourway-train-cuda not built"
    skip train-vs-pytorch-gpu-b64 "fourway-train-cuda not built"
  fi
  bench=$build/benchmarks/backend/bench_kernels_gpu
  if [ -x "$bench" ]; then
    step bench-kernels "$bench" --benchmark_min_time=0.05 \
      --benchmark_out="$logdir/bench-kernels.json" --benchmark_out_format=json
    # one note per benchmark: name, time per iteration and its rate counters
    while IFS= read -r line; do note bench-kernels "$line"; done \
      < <(grep -E '^(gemm|attention|adamw|layernorm|gelu|linear_gelu|column_sum|softmax|cross_entropy|device_copy)' "$logdir/bench-kernels.log" |
          awk '{ line = $1 " " $2 " " $3; for (i = 6; i <= NF; ++i) line = line " " $i; print line }')
  else
    skip bench-kernels "bench_kernels_gpu not built (no Google Benchmark in the kit?)"
  fi
  bench=$build/benchmarks/comm/bench_comm_gpu
  if [ -x "$bench" ]; then
    step bench-comm "$bench" --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true \
      --benchmark_out="$logdir/bench-comm.json" --benchmark_out_format=json
    # medians of the four variants; overlap = (compute + comm - comm_stream) / min(compute, comm)
    while IFS= read -r line; do note bench-comm "$line"; done \
      < <(grep -E '^step/variant:[0-9]+(/[a-z_]+)?_median' "$logdir/bench-comm.log" |
          awk '{ print $1 " " $2 " " $3 }')
  else
    skip bench-comm "bench_comm_gpu not built (no NCCL or no Google Benchmark?)"
  fi
  # last: one step's kernels under Nsight Compute (no ncu there: the script exits 77, a NOT RUN)
  if [ -x "$train_cuda" ]; then
    ATTENTION=fused step profile-step "$root/benchmarks/train/profile_step_gpu.sh" "$build" \
      "$logdir/profile-step"
    rc=$?
    [ $rc -eq 77 ] && note profile-step "no ncu or no GPU visible"
    while IFS= read -r f; do note profile-step "${f#FIGURE profile-step }"; done \
      < <(grep '^FIGURE profile-step' "$logdir/profile-step.log")
  else
    skip profile-step "fourway-train-cuda not built"
  fi
else
  for n in gpu-tests memcheck-kernels memcheck-localworld memcheck-graph racecheck-kernels \
           racecheck-localworld \
           gpt-step train-cuda-vs-host multi-gpu train-vs-pytorch-gpu train-vs-pytorch-gpu-b64 \
           bench-kernels bench-comm profile-step; do
    skip "$n" "build failed"
  done
fi

{
  echo
  echo "== device-check summary: $(($(date +%s) - t0)) s of ${budget} s, $(date -u +%FT%TZ)"
  printf '| %-24s | %-8s | %5s | %s\n' step status sec "figures / notes"
  printf '| %-24s | %-8s | %5s | %s\n' --- --- --- ---
  for r in "${rows[@]}"; do
    IFS='|' read -r n st dt nt <<< "$r"
    printf '| %-24s | %-8s | %5s | %s\n' "$n" "$st" "$dt" "$nt"
  done
  verdict=PASSED
  [ "$failed" -eq 0 ] || verdict=FAILED
  absent_text=$(IFS=';'; echo "${absent_steps[*]}")
  echo "device-check: $verdict${only:+ (only $only)}${absent_text:+ ($absent_text)}"
} | tee "$logdir/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then  # the device tool returns at most 8 files
  cp "$logdir/summary.txt" "$OUT/device-check-summary.txt" 2>/dev/null || true
  tar -czf "$OUT/device-check-logs.tgz" -C "$(dirname "$logdir")" "$(basename "$logdir")" \
    2>/dev/null || true
fi
exit "$failed"
