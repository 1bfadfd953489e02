#!/usr/bin/env bash
# One GPT-2 124M training step on one GPU, fourway-train-cuda vs PyTorch (eager, SDPA and
# torch.compile, fused AdamW), side by side in one call: tokens/s and MFU of each and the ratios.
#
#   benchmarks/train/compare_pytorch_gpu.sh [build-dir]     (default build/cuda)
#
# Model: GPT-2 124M, 12 layers, width 768, 12 heads, vocab 50257, T = 1024 (124 439 808
# parameters), B = 8 (8192 tokens per step), random init, random tokens over the whole vocabulary.
# Step: forward, mean cross-entropy, backward, clip of the global gradient norm at 1.0, AdamW
# (lr 3e-4, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on 2-D weights).
# Precision: fourway-train-cuda --precision bf16 (bf16 weights, activations and gradients; fp32
# master weights and AdamW moments); PyTorch pytorch_step.py --device cuda --dtype bf16 (fp32
# parameters, forward under torch.autocast bf16, fp32 gradients and moments: what PyTorch users
# run). PyTorch's attention: eager (the (B, H, T, T) scores materialised, as tools/make_golden.py)
# and, when the installed PyTorch has them, F.scaled_dot_product_attention (flash) and that model
# under torch.compile (`compile`: what a PyTorch user who wants speed runs), all measured; AdamW
# fused (nanoGPT's choice) unless ADAMW says otherwise.
#
# Each run does WARMUP steps, then takes the median step time of STEPS timed steps (fourway: the
# step_ms of its --log-json, wall time of trainer.step, which reads the loss back to the host;
# PyTorch: wall time between torch.cuda.synchronize() calls). The two sides run ROUNDS times,
# interleaved (the side that starts alternates, and so does the order of PyTorch's attentions);
# every figure is min / median / max over the rounds, and the ratio divides the median tokens/s
# (fourway / PyTorch: > 1, fourway faster).
# MFU = tokens/s · (6·N + 12·L·T·C) / peak: N every parameter (wte once: it is the tied head),
# 12·L·T·C the attention's score and value products (not halved for the causal mask), peak
# PEAK_TFLOPS (default 989: the bf16 dense tensor-core figure of NVIDIA's H100/H200 SXM datasheet).
#
# Environment:
#   B (8), T (1024), LAYERS (12), DIM (768), HEADS (12), VOCAB (50257)
#   ROUNDS (3), STEPS (10 timed steps per run), WARMUP (3)
#   ATTENTION   PyTorch's variants, comma list of eager, sdpa, compile (default all three; eager
#               when PyTorch < 2.0)
#   FW_ATTENTION fourway-train-cuda's --attention values, comma list of blockwise, fused, cudnn
#               (default blockwise,fused); the blockwise run is labelled `fourway`, the others
#               `fourway-fused`, `fourway-cudnn`. Each runs with its step captured in a CUDA graph
#               (fourway-train-cuda's default); a value with `-nograph` (blockwise-nograph, ...)
#               runs it with --cuda-graph off, labelled `fourway-nograph`, `fourway-fused-nograph`:
#               the graph's own gain is the ratio of the two
#   ADAMW       default | foreach | fused: torch.optim.AdamW's implementation (default fused)
#   LLMC        llm.c's trainers to run beside them, comma list of built train_gpt2cu programs
#               (../shared/anchors/README.md has the build lines; labelled by file name, e.g.
#               train_gpt2cu, train_gpt2cu_cudnn): each round runs each at the same shape from a
#               fresh GPT-2 124M (-e d12 -b B -t T, lr 3e-4, weight decay 0.1, its own defaults
#               otherwise) on the same token file, and its step time is the median of the
#               `... | X ms | ...` lines it prints after the warm-up steps
#   FW_FLAGS    extra fourway-train-cuda flags (e.g. "--classifier-chunk 1024")
#   PYTHON      the interpreter with a CUDA PyTorch (default: python3, else /usr/bin/python3)
#   PEAK_TFLOPS (989)
#   MAX_SECONDS no round starts that would end past it (judged by the rounds so far); the figures
#               then cover the rounds done (default: STEP_LIMIT_S - 10 under
#               scripts/device-check.sh, which sets STEP_LIMIT_S to the step's limit; else none)
# Prints a line per round, then the summary and `FIGURE train-vs-pytorch-gpu ...` lines (the ones
# scripts/device-check.sh puts in its table).
# Exit: 0 measured; 1 a run failed (a failed fourway-train-cuda run of one --attention leaves
# the other's figures, then exits 1); 2 bad settings or fourway-train-cuda not built; 77 nothing
# measured because no GPU is visible or no PyTorch with CUDA is installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build/cuda}
source "$here/../stats.sh"  # stats, median, ratio, machine, load1
die() {
  echo "compare_pytorch_gpu: $1" >&2
  exit "${2:-2}"
}
B=${B:-8} T=${T:-1024} LAYERS=${LAYERS:-12} DIM=${DIM:-768} HEADS=${HEADS:-12} VOCAB=${VOCAB:-50257}
rounds=${ROUNDS:-3} steps=${STEPS:-10} warmup=${WARMUP:-3}
max_s=${MAX_SECONDS:-$([ -n "${STEP_LIMIT_S:-}" ] && echo $((STEP_LIMIT_S - 10)) || echo 0)}
peak=${PEAK_TFLOPS:-989} adamw=${ADAMW:-fused}
[[ "$max_s" =~ ^-?[0-9]+$ ]] || die "MAX_SECONDS must be a whole number, got '$max_s'"
for v in B T LAYERS DIM HEADS VOCAB rounds steps warmup; do
  if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [ "${!v}" -eq 0 ]; then
    die "$v must be a positive whole number, got '${!v}'"
  fi
done
[[ "$peak" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "PEAK_TFLOPS must be a number, got '$peak'"
exe=$build/examples/train/fourway-train-cuda
[ -x "$exe" ] || die "no $exe: build it first (cmake --preset cuda && cmake --build --preset cuda \
--target fourway-train-cuda), or pass the build folder as the first argument"

# ---- the GPU and PyTorch ------------------------------------------------------------------------
py=
tried=()
for cand in ${PYTHON:-python3 /usr/bin/python3}; do
  tried+=("$cand")
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import torch' >/dev/null 2>&1; then
    py=$cand
    break
  fi
done
[ -n "$py" ] || die "no Python with PyTorch (tried: ${tried[*]}; set PYTHON)" 77
torch_info=$("$py" - <<'PY'
import torch, torch.nn.functional as F
ok = torch.cuda.is_available()
print(torch.__version__, torch.version.cuda or "none", int(ok),
      int(hasattr(F, "scaled_dot_product_attention") and hasattr(torch, "compile")),
      torch.cuda.get_device_name(0) if ok else "-")
PY
) || die "$py could not query PyTorch" 1
read -r torch_version torch_cuda torch_ok has_sdpa gpu_name <<< "$torch_info"
if [ "$torch_ok" != 1 ]; then
  die "PyTorch $torch_version ($py, built for CUDA $torch_cuda) reports no GPU \
(torch.cuda.is_available() is False): run this on a GPU machine with a CUDA build of PyTorch" 77
fi
attention=${ATTENTION:-$([ "$has_sdpa" = 1 ] && echo eager,sdpa,compile || echo eager)}
IFS=, read -r -a atts <<< "$attention"
fw_attention=${FW_ATTENTION:-blockwise,fused}
IFS=, read -r -a fw_atts <<< "$fw_attention"
for a in "${fw_atts[@]}"; do
  case "${a%-nograph}" in
    blockwise | fused | cudnn) ;;
    *) die "FW_ATTENTION takes blockwise, fused, cudnn, each also with -nograph (comma list), \
got '$a'" ;;
  esac
done
fw_label() {  # blockwise -> fourway, fused -> fourway-fused, blockwise-nograph -> fourway-nograph
  local base=${1%-nograph}
  local label=fourway
  [ "$base" = blockwise ] || label+="-$base"
  [ "$base" = "$1" ] || label+=-nograph
  echo "$label"
}
llmcs=()
if [ -n "${LLMC:-}" ]; then
  IFS=, read -r -a llmcs <<< "$LLMC"
  for p in "${llmcs[@]}"; do
    [ -x "$p" ] || die "LLMC names $p, which is not an executable (llm.c's train_gpt2cu: \
../shared/anchors/README.md has the build lines)"
  done
fi
for a in "${atts[@]}"; do
  case "$a" in
    eager) ;;
    sdpa | compile) [ "$has_sdpa" = 1 ] || die "ATTENTION has $a but PyTorch $torch_version lacks \
F.scaled_dot_product_attention or torch.compile (PyTorch >= 2.0)" ;;
    *) die "ATTENTION takes eager, sdpa, compile (comma list), got '$a'" ;;
  esac
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# fourway-train-cuda sees the GPU too (a tiny model, no step)
if ! "$exe" --layers 1 --dim 64 --heads 4 --seq 32 --steps 0 --quiet > "$tmp/probe.txt" 2>&1; then
  cat "$tmp/probe.txt" >&2
  grep -q "no CUDA device is visible" "$tmp/probe.txt" &&
    die "fourway-train-cuda sees no GPU (above)" 77
  die "fourway-train-cuda --steps 0 failed (above)" 1
fi

# random tokens over the whole vocabulary (as the PyTorch side draws), in an llm.c file
"$py" "$here/../random_tokens.py" "$tmp/tok.bin" "$VOCAB" "$((B * T * (steps + warmup) + 1))"

model="--layers $LAYERS --dim $DIM --heads $HEADS --vocab $VOCAB --seq $T --batch $B"
tokens=$((B * T))
params=$((VOCAB * DIM + T * DIM + LAYERS * (12 * DIM * DIM + 13 * DIM) + 2 * DIM))
flops_token=$((6 * params + 12 * LAYERS * T * DIM))

fourway_ms() {  # fourway_ms ATTENTION[-nograph]: median step_ms of one fourway-train-cuda run
  local att=${1%-nograph} graph=auto
  [ "$att" = "$1" ] || graph=off
  # shellcheck disable=SC2086
  if ! "$exe" $model --precision bf16 --data "$tmp/tok.bin" --steps $((steps + warmup)) --lr 3e-4 \
      --beta2 0.95 --weight-decay 0.1 --grad-clip 1.0 --log-json "$tmp/log.jsonl" --quiet \
      --attention "$att" --cuda-graph "$graph" ${FW_FLAGS:-} > "$tmp/fw.out" 2>&1; then
    tail -5 "$tmp/fw.out" >&2
    echo "compare_pytorch_gpu: fourway-train-cuda failed (above)" >&2
    return 1
  fi
  # a captured run that fell back says why (its figure is then the uncaptured step's)
  if grep -q '^cuda graph: not captured' "$tmp/fw.out"; then
    echo "compare_pytorch_gpu: $(fw_label "$1"): $(grep '^cuda graph:' "$tmp/fw.out")" >&2
  fi
  [ -s "$tmp/fw.params" ] ||
    sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' "$tmp/fw.out" > "$tmp/fw.params"
  awk -v w="$warmup" -F'"step_ms":' 'NR > w { split($2, a, ","); print a[1] }' "$tmp/log.jsonl" |
    median
}
pytorch_run() {  # one pytorch_step.py process, attentions in the order given; a line each
  local out
  # shellcheck disable=SC2086
  if ! out=$("$py" "$here/pytorch_step.py" --device cuda --dtype bf16 --attention "$1" $model \
      --steps "$steps" --warmup "$warmup" --adamw "$adamw" --peak-tflops "$peak" 2>&1); then
    echo "$out" | tail -5 >&2
    echo "compare_pytorch_gpu: pytorch_step.py failed (above)" >&2
    return 1
  fi
  echo "$out" | grep '^pytorch '
}
llmc_ms() {  # llmc_ms PROGRAM: median step ms of one llm.c run (after warm-up)
  if ! "$1" -e d12 -b "$B" -t "$T" -i "$tmp/tok.bin" -j "$tmp/tok.bin" -x $((steps + warmup)) \
      -l 3e-4 -c 0.1 -v 1000000 -s 1000000 > "$tmp/llmc.out" 2>&1; then
    tail -5 "$tmp/llmc.out" >&2
    echo "compare_pytorch_gpu: $1 failed (above)" >&2
    return 1
  fi
  sed -nE 's/^step +[0-9]+\/[0-9]+ \|.*\| ([0-9.]+) ms \|.*/\1/p' "$tmp/llmc.out" |
    awk -v w="$warmup" 'NR > w' | median
}
llmc_round() {  # one run of each LLMC program: "LABEL MS" or "LABEL failed" lines
  for p in "${llmcs[@]}"; do
    if llmc_ms "$p" > "$tmp/llmc.now" && [ -s "$tmp/llmc.now" ]; then
      echo "$(basename "$p") $(cat "$tmp/llmc.now")"
    else
      echo "$(basename "$p") failed"
    fi
  done
}
field() { sed -E "s/.* $1 ([^ ]+).*/\\1/"; }  # field NAME < line: the value after NAME
tps() { awk -v t="$tokens" '{ printf "%.0f\n", t * 1000 / $1 }'; }  # step ms -> tokens/s
mfu() { awk -v f="$flops_token" -v p="$peak" '{ printf "%.1f", 100 * $1 * f / (p * 1e12) }'; }

echo "machine: $(machine); GPU: $gpu_name; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "PyTorch $torch_version (CUDA $torch_cuda) from $py; fourway-train-cuda $exe"
echo "model: $model (GPT-2 124M at the defaults: $params parameters), bf16 with fp32 masters," \
  "AdamW, clip 1.0; $tokens tokens per step; $steps timed steps after $warmup warm-up, $rounds" \
  "rounds; fourway attention ${fw_atts[*]}; PyTorch attention ${atts[*]}, AdamW" \
  "$adamw${FW_FLAGS:+; fourway flags $FW_FLAGS}${LLMC:+; llm.c $LLMC}"
echo "MFU = tokens/s x (6 N + 12 L T C) / $peak TFLOP/s = tokens/s x $flops_token FLOP / peak"
# one fourway-train-cuda run per attention of fw_order: "ATTENTION MS" lines, "ATTENTION failed"
# for a run that failed (its log above); the other attentions still run and are reported, and the
# script exits 1 at the end
fourway_round() {
  for a in "${fw_order[@]}"; do
    if fourway_ms "$a" > "$tmp/fw.now"; then
      echo "$a $(cat "$tmp/fw.now")"
    else
      echo "$a failed"
    fi
  done
}
t0=$(date +%s)
done_rounds=0
for i in $(seq "$rounds"); do
  spent=$(($(date +%s) - t0))
  if [ "$max_s" -gt 0 ] && [ "$i" -gt 1 ] && [ $((spent + spent / (i - 1))) -gt "$max_s" ]; then
    echo "stopping after $((i - 1)) of $rounds rounds: another would end past MAX_SECONDS=$max_s" \
      "($spent s spent)"
    break
  fi
  order=$attention
  (( i % 2 )) || order=$(printf '%s\n' "${atts[@]}" | tac | paste -sd,)
  fw_order=("${fw_atts[@]}")
  (( i % 2 )) || mapfile -t fw_order < <(printf '%s\n' "${fw_atts[@]}" | tac)
  if (( i % 2 )); then
    fw=$(fourway_round)
    pt=$(pytorch_run "$order") || exit 1
    lc=$(llmc_round)
  else
    lc=$(llmc_round)
    pt=$(pytorch_run "$order") || exit 1
    fw=$(fourway_round)
  fi
  line="round $i (load $(load1)):"
  for a in "${fw_atts[@]}"; do
    ms=$(echo "$fw" | awk -v a="$a" '$1 == a { print $2 }')
    if [ "$ms" = failed ]; then
      echo "$a" >> "$tmp/fw.failed"
      line+=" $(fw_label "$a") FAILED,"
    else
      echo "$ms" >> "$tmp/fw-$a.ms"
      line+=" $(fw_label "$a") $ms ms,"
    fi
  done
  line=${line%,}
  for a in "${atts[@]}"; do
    l=$(echo "$pt" | grep " attention $a ") || die "pytorch_step.py printed no line for $a" 1
    ms=$(echo "$l" | field step_ms)
    echo "$ms" >> "$tmp/pt-$a.ms"
    echo "$l" | field params > "$tmp/pt.params"
    line+=", pytorch-$a $ms ms"
  done
  for p in "${llmcs[@]}"; do
    n=$(basename "$p")
    ms=$(echo "$lc" | awk -v a="$n" '$1 == a { print $2 }')
    if [ "$ms" = failed ] || [ -z "$ms" ]; then
      echo "$n" >> "$tmp/llmc.failed"
      line+=", $n FAILED"
    else
      echo "$ms" >> "$tmp/llmc-$n.ms"
      line+=", $n $ms ms"
    fi
  done
  echo "$line"
  done_rounds=$i
done

fw_params=$(cat "$tmp/fw.params" 2>/dev/null || true)
pt_params=$(cat "$tmp/pt.params" 2>/dev/null || true)
if [ "$fw_params" != "$params" ] || [ "$pt_params" != "$params" ]; then
  echo "warning: parameter counts differ: formula $params, fourway ${fw_params:-?}," \
    "PyTorch ${pt_params:-?}; the MFU uses the formula's"
fi
summary() {  # summary NAME FILE: tokens/s min / median / max, MFU at the median; FIGURE line
  local t_stats t_med
  tps < "$2" > "$2.tps"
  t_stats=$(stats < "$2.tps" | sed 's/\.000//g')
  t_med=$(median < "$2.tps")
  printf '%-14s step_ms min / median / max %s; tokens/s %s; MFU at the median %s%%\n' "$1" \
    "$(stats < "$2")" "$t_stats" "$(echo "$t_med" | mfu)"
  echo "FIGURE train-vs-pytorch-gpu $1 bf16 B$B T$T: tokens/s $t_stats (min / median / max," \
    "$done_rounds rounds), MFU $(echo "$t_med" | mfu)% at the median"
}
measured=()  # the fourway attentions with a run that succeeded
for f in "${fw_atts[@]}"; do
  if [ -s "$tmp/fw-$f.ms" ]; then
    summary "$(fw_label "$f")" "$tmp/fw-$f.ms"
    measured+=("$f")
  fi
done
ratios=()
anchor() {  # anchor NAME FILE: an anchor's summary, and each measured fourway run's ratio to it
  summary "$1" "$2"
  for f in "${measured[@]}"; do
    ratios+=("$(fw_label "$f") / $1 $(ratio "$(median < "$tmp/fw-$f.ms.tps")" \
      "$(median < "$2.tps")")")
  done
}
for a in "${atts[@]}"; do
  anchor "pytorch-$a" "$tmp/pt-$a.ms"
done
for p in "${llmcs[@]}"; do
  n=$(basename "$p")
  if [ -s "$tmp/llmc-$n.ms" ]; then anchor "$n" "$tmp/llmc-$n.ms"; fi
done
echo "FIGURE train-vs-pytorch-gpu ratio of the median tokens/s: $(printf '%s, ' "${ratios[@]}" |
  sed 's/, $//') (PyTorch $torch_version, $gpu_name)"
if [ -s "$tmp/llmc.failed" ]; then
  echo "compare_pytorch_gpu: llm.c failed: $(sort -u "$tmp/llmc.failed" | paste -sd,)" \
    "(its output above)" >&2
  exit 1
fi
if [ -s "$tmp/fw.failed" ]; then
  echo "compare_pytorch_gpu: fourway-train-cuda failed with --attention" \
    "$(sort -u "$tmp/fw.failed" | paste -sd, -) (the runs' logs above)" >&2
  exit 1
fi
