#!/usr/bin/env bash
# benchmarks/train/compare_pytorch_gpu.sh without a GPU: stand-ins for fourway-train-cuda (its
# --log-json step times: 99 ms for the warm-up steps, then 30 ms blockwise, 22 fused; the warm-up
# must not count) and for a CUDA Python
# (PyTorch eager 78 ms, SDPA 43 ms, torch.compile 35 ms) let the script's own logic run — the interleaved order of the
# sides, the round lines, the min / median / max, the tokens/s, MFU and ratio figures, and the
# failure of one --attention leaving the other's figures. The real comparison needs a GPU
# (scripts/device-check.sh, step train-vs-pytorch-gpu).
#   compare_pytorch_gpu_stubbed.sh SCRIPT WORKDIR
set -uo pipefail
# shellcheck source=tests/device_check/stub_checks.sh
source "$(dirname "$0")/stub_checks.sh"
script=$1
work=$2
rm -rf "$work" && mkdir -p "$work/build/examples/train"
cat > "$work/build/examples/train/fourway-train-cuda" <<'STUB'
#!/usr/bin/env bash
log=; att=blockwise; steps=0; graph=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --log-json) log=$2; shift ;;
    --attention) att=$2; shift ;;
    --cuda-graph) graph=$2; shift ;;
    --steps) steps=$2; shift ;;
  esac
  shift
done
echo "model: 124439808 parameters"
[ -n "$log" ] || exit 0
echo "fourway $att" >> "$STUB_ORDER"
echo "graph $graph" >> "$STUB_ORDER.graph"
if [ "$att" = fused ] && [ -n "${STUB_FAIL_FUSED:-}" ]; then
  echo "stub: fused attention failed" >&2
  exit 3
fi
base=30
[ "$att" = fused ] && base=22
[ "$graph" = off ] && base=$((base + 10))
[ "$graph" != off ] && [ -n "${STUB_UNCAPTURED:-}" ] && echo "cuda graph: not captured (stub)"
: > "$log"
for i in $(seq "$steps"); do
  ms=$base
  [ "$i" -le "$STUB_WARMUP" ] && ms=99
  echo "{\"step\":$i,\"step_ms\":$ms,\"loss\":1}" >> "$log"
done
STUB
cat > "$work/python" <<'STUB'
#!/usr/bin/env bash
[ "$1" = -c ] && exit 0
if [ "$1" = - ]; then echo "2.5.0 12.4 1 1 StubGPU"; exit 0; fi  # version, CUDA, GPU, sdpa+compile
case "$1" in *random_tokens.py) exit 0 ;; esac
att=; adamw=
while [ $# -gt 0 ]; do
  [ "$1" = --attention ] && { att=$2; shift; }
  [ "$1" = --adamw ] && { adamw=$2; shift; }
  shift
done
echo "pytorch $att" >> "$STUB_ORDER"
echo "$adamw" >> "$STUB_ORDER.adamw"
IFS=, read -r -a a <<< "$att"
for x in "${a[@]}"; do
  ms=78
  [ "$x" = sdpa ] && ms=43
  [ "$x" = compile ] && ms=35
  echo "pytorch step_ms $ms device cuda dtype bf16 attention $x adamw $adamw params 124439808"
done
STUB
chmod +x "$work/build/examples/train/fourway-train-cuda" "$work/python"
export PYTHON=$work/python STEPS=1 WARMUP=2 STUB_WARMUP=2 ROUNDS=2

# 1. both attentions, the three PyTorch variants (fused AdamW): every figure, the order of the
# sides alternating
export STUB_ORDER=$work/order.txt
: > "$STUB_ORDER"
: > "$STUB_ORDER.adamw"
out=$(bash "$script" "$work/build" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with every side working"
# tokens/s = 8192 tokens / step time: 273067 (30 ms), 372364 (22), 105026 (78), 190512 (43),
# 234057 (35)
expect_in_out "" \
  "round 1 (load" \
  "fourway 30 ms, fourway-fused 22 ms, pytorch-eager 78 ms, pytorch-sdpa 43 ms, pytorch-compile 35 ms" \
  "FIGURE train-vs-pytorch-gpu pytorch-compile bf16 B8 T1024: tokens/s 234057" \
  "fourway / pytorch-compile 1.167, fourway-fused / pytorch-compile 1.591" \
  "FIGURE train-vs-pytorch-gpu fourway bf16 B8 T1024: tokens/s 273067 / 273067 / 273067" \
  "FIGURE train-vs-pytorch-gpu fourway-fused bf16 B8 T1024: tokens/s 372364 / 372364 / 372364" \
  "FIGURE train-vs-pytorch-gpu pytorch-eager bf16 B8 T1024: tokens/s 105026" \
  "fourway / pytorch-eager 2.600, fourway-fused / pytorch-eager 3.545" \
  "fourway / pytorch-sdpa 1.433, fourway-fused / pytorch-sdpa 1.955"
order=$(paste -sd'|' "$STUB_ORDER")
want_order="fourway blockwise|fourway fused|pytorch eager,sdpa,compile|pytorch compile,sdpa,eager|fourway fused|fourway blockwise"
[ "$order" = "$want_order" ] || fail "sides ran in the order '$order', want '$want_order'"
[ "$(sort -u "$STUB_ORDER.adamw")" = fused ] ||
  fail "PyTorch's AdamW was not the fused one: $(sort -u "$STUB_ORDER.adamw" | paste -sd,)"

# 1b. llm.c beside them (LLMC): a stand-in prints llm.c's step lines, 99 ms for the warm-up
# steps, then 25 ms (327680 tokens/s); the arguments are the same shape and data
cat > "$work/train_gpt2cu" <<'STUB'
#!/usr/bin/env bash
echo "$*" > "$STUB_LLMC_ARGS"
n=0
while [ $# -gt 0 ]; do
  [ "$1" = -x ] && { n=$2; shift; }
  shift
done
for i in $(seq "$n"); do
  ms=25.00
  [ "$i" -le "$STUB_WARMUP" ] && ms=99.00
  printf 'step %4d/%d | loss 10.9 (+0.00z)| norm 1.0 (+0.00z)| lr 3.00e-04 | %s ms | 20.1%% bf16 MFU | 1000 tok/s\n' "$i" "$n" "$ms"
done
echo "val loss 10.9"
STUB
chmod +x "$work/train_gpt2cu"
export STUB_LLMC_ARGS=$work/llmc-args.txt
out=$(LLMC=$work/train_gpt2cu bash "$script" "$work/build" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with LLMC"
expect_in_out " with LLMC" "pytorch-compile 35 ms, train_gpt2cu 25.00 ms" \
  "FIGURE train-vs-pytorch-gpu train_gpt2cu bf16 B8 T1024: tokens/s 327680 / 327680 / 327680" \
  "fourway / train_gpt2cu 0.833, fourway-fused / train_gpt2cu 1.136"
for want in "-e d12" "-b 8" "-t 1024" "-x 3" "tok.bin"; do
  grep -q -- "$want" "$STUB_LLMC_ARGS" || fail "llm.c not given '$want': $(cat "$STUB_LLMC_ARGS")"
done
out=$(LLMC=$work/missing bash "$script" "$work/build" 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "exit $rc for LLMC naming no program, want 2"
grep -qF "LLMC names $work/missing, which is not an executable" <<< "$out" ||
  fail "no clear message for a missing LLMC program"

# 2. the fused run fails: the blockwise and PyTorch figures stay, the script exits 1 naming it
: > "$STUB_ORDER"
out=$(STUB_FAIL_FUSED=1 bash "$script" "$work/build" 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc when the fused run fails, want 1"
expect_in_out " when the fused run fails" "fourway 30 ms, fourway-fused FAILED, pytorch-eager 78 ms" \
  "FIGURE train-vs-pytorch-gpu fourway bf16 B8 T1024" \
  "ratio of the median tokens/s: fourway / pytorch-eager 2.600, fourway / pytorch-sdpa 1.433, fourway / pytorch-compile 1.167 (" \
  "failed with --attention fused"
grep -q "FIGURE train-vs-pytorch-gpu fourway-fused" <<< "$out" &&
  fail "a fourway-fused figure although every fused run failed"

# 3. a bad FW_ATTENTION is refused before anything runs
out=$(FW_ATTENTION=flash bash "$script" "$work/build" 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "exit $rc for FW_ATTENTION=flash, want 2"
grep -qF "FW_ATTENTION takes blockwise, fused, cudnn, each also with -nograph (comma list), \
got 'flash'" <<< "$out" ||
  fail "no clear message for FW_ATTENTION=flash"

# 4. one attention only: its figures and no other fourway side
: > "$STUB_ORDER"
out=$(FW_ATTENTION=fused ATTENTION=eager bash "$script" "$work/build" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with FW_ATTENTION=fused"
grep -qF "ratio of the median tokens/s: fourway-fused / pytorch-eager 3.545 (" <<< "$out" ||
  fail "FW_ATTENTION=fused ATTENTION=eager: wrong ratio line"
grep -q "fourway blockwise" "$STUB_ORDER" && fail "FW_ATTENTION=fused ran the blockwise attention"

# 5. the step with and without its CUDA graph (the stand-in takes 10 ms longer with --cuda-graph
# off): each labelled, the graph's side asking for auto, the other for off; a captured side that
# fell back says so
: > "$STUB_ORDER"
: > "$STUB_ORDER.graph"
out=$(FW_ATTENTION=blockwise,blockwise-nograph ATTENTION=eager STUB_UNCAPTURED=1 \
  bash "$script" "$work/build" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with FW_ATTENTION=blockwise,blockwise-nograph"
# 8192 tokens: 273067 tokens/s at 30 ms, 204800 at 40 ms; PyTorch eager 105026 at 78 ms
expect_in_out " with and without the graph" \
  "FIGURE train-vs-pytorch-gpu fourway bf16 B8 T1024: tokens/s 273067 / 273067 / 273067" \
  "FIGURE train-vs-pytorch-gpu fourway-nograph bf16 B8 T1024: tokens/s 204800 / 204800 / 204800" \
  "fourway / pytorch-eager 2.600, fourway-nograph / pytorch-eager 1.950" \
  "compare_pytorch_gpu: fourway: cuda graph: not captured (stub)"
[ "$(grep -c '^graph auto$' "$STUB_ORDER.graph")" -eq 2 ] &&
  [ "$(grep -c '^graph off$' "$STUB_ORDER.graph")" -eq 2 ] ||
  fail "not 2 rounds each of --cuda-graph auto and off: $(sort "$STUB_ORDER.graph" | uniq -c)"
grep -q "fourway-nograph: cuda graph" <<< "$out" &&
  fail "the uncaptured side was reported as a fallen-back capture"

finish compare_pytorch_gpu_stubbed
