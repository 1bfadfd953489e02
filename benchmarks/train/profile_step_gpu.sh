#!/usr/bin/env bash
# Where one GPT-2 124M training step spends its GPU time: every kernel of one fourway-train-cuda
# step timed by Nsight Compute (ncu), summed by kernel function.
#
#   benchmarks/train/profile_step_gpu.sh [build-dir] [out-dir]   (defaults build/cuda, a temp dir)
#
# Model and step as benchmarks/train/compare_pytorch_gpu.sh (GPT-2 124M, bf16 with fp32 masters,
# B 8, T 1024, AdamW, clip 1.0), random tokens over the whole vocabulary; STEPS steps (2) of which
# only the last is recorded (fourway-train-cuda --profile-step, ncu --profile-from-start off): a
# steady-state step, without the set-up's kernels (random init, copies to the masters) or the
# first step's allocations.
# ncu replays each kernel alone (--cache-control none, --clock-control none: the clocks and caches
# as the program leaves them) and reads gpu__time_duration.sum: so the sum is the step's kernel
# time with no overlap and no launch gaps — measured per kernel, the step's wall time is not (the
# difference to compare_pytorch_gpu.sh's step time is host and launch overhead plus overlap).
# Then the kernel time by class (GEMM, attention, norm, loss, optimizer, communication,
# elementwise) as a share of the step, the GEMMs against their own roofline (the weight products'
# FLOPs at the GPU's peak) and the step's kernel time against the budget of 40% and 50% MFU, so
# the gap is attributed, not guessed.
# Environment: B (8), T (1024), LAYERS (12), DIM (768), HEADS (12), VOCAB (50257), STEPS (2),
#   TOP (10 kernel functions in the figures), ATTENTION (fourway-train-cuda's --attention:
#   blockwise, the default, or fused), NCU (ncu on PATH, else Nsight Compute's usual folders),
#   PYTHON (python3), PEAK_TFLOPS (the roofline's peak; default 989 on an H100 or H200, dense
#   bf16, plan/hardware.hpp; none elsewhere).
# Kernels are named by function (namespaces and template arguments dropped; one templated on a
# device lambda, as for_each and map are, also names the function holding the lambda).
# Prints the table and `FIGURE profile-step ...` lines (scripts/device-check.sh's table); the raw
# CSV is left in out-dir/ncu.csv.
# Exit: 0 profiled; 1 ncu or the trainer failed; 2 bad settings or not built; 77 no ncu or no GPU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build/cuda}
out=${2:-$(mktemp -d)}
die() {
  echo "profile_step_gpu: $1" >&2
  exit "${2:-2}"
}
B=${B:-8} T=${T:-1024} LAYERS=${LAYERS:-12} DIM=${DIM:-768} HEADS=${HEADS:-12} VOCAB=${VOCAB:-50257}
steps=${STEPS:-2} top=${TOP:-10} py=${PYTHON:-python3} attention=${ATTENTION:-blockwise}
[[ "$attention" =~ ^(blockwise|fused|cudnn)$ ]] ||
  die "ATTENTION takes blockwise, fused or cudnn, got '$attention'"
for v in B T LAYERS DIM HEADS VOCAB steps top; do
  if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [ "${!v}" -eq 0 ]; then
    die "$v must be a positive whole number, got '${!v}'"
  fi
done
exe=$build/examples/train/fourway-train-cuda
[ -x "$exe" ] ||
  die "no $exe: build it first (cmake --build --preset cuda --target fourway-train-cuda)"
ncu=${NCU:-}
if [ -z "$ncu" ]; then
  for c in "$(command -v ncu || true)" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    if [ -n "$c" ] && [ -x "$c" ]; then
      ncu=$c
      break
    fi
  done
fi
if [ -z "$ncu" ] || [ ! -x "$ncu" ]; then
  die "no Nsight Compute (ncu) here: nothing profiled" 77
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  die "no GPU visible: nothing profiled" 77
fi
mkdir -p "$out"
# the dense bf16 peak the roofline is drawn against: PEAK_TFLOPS, else the datasheet figure of an
# H100 or H200 (plan/hardware.hpp: 989), else none
peak_tflops=${PEAK_TFLOPS:-}
if [ -z "$peak_tflops" ]; then
  gpu_name=$(nvidia-smi -L 2>/dev/null | head -1)
  case "$gpu_name" in *H100* | *H200*) peak_tflops=989 ;; esac
fi

"$py" "$here/../random_tokens.py" "$out/tok.bin" "$VOCAB" "$((B * T * steps + 1))"

echo "profile_step_gpu: $ncu on $exe," \
  "GPT-2 L$LAYERS C$DIM NH$HEADS V$VOCAB B$B T$T bf16, $attention attention, step $steps of" \
  "$steps recorded"
if ! "$ncu" --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum \
    --csv --page raw --print-units base --print-kernel-base demangled --log-file "$out/ncu.csv" \
    "$exe" --layers "$LAYERS" --dim "$DIM" --heads "$HEADS" --vocab "$VOCAB" --seq "$T" \
    --batch "$B" --precision bf16 --data "$out/tok.bin" --steps "$steps" --lr 3e-4 --beta2 0.95 \
    --weight-decay 0.1 --grad-clip 1.0 --attention "$attention" --profile-step "$steps" --quiet \
    > "$out/train.out" 2>&1; then
  tail -20 "$out/train.out" >&2
  tail -5 "$out/ncu.csv" >&2 || true
  die "ncu or fourway-train-cuda failed (above)" 1
fi

# the CSV: ==PROF== lines, a header, a units row, one row per kernel launch
"$py" - "$out/ncu.csv" "$top" "L=$LAYERS,C=$DIM,V=$VOCAB,T=$T,B=$B" "$peak_tflops" <<'PY'
import csv, re, sys
from collections import defaultdict
path, top = sys.argv[1], int(sys.argv[2])


def label(demangled):
    """The kernel's function name without namespaces or template arguments; a kernel templated on
    an extended __device__ lambda (for_each, map) also names the function the lambda is in."""
    head = re.sub(r"^void\s+", "", demangled)
    name = re.split(r"[<(]", head, maxsplit=1)[0].split("::")[-1]
    # the lambda's function: "...<void ns::f<...>(args)::[lambda..." (ncu's demangling) or
    # "__nv_dl_tag<..., &ns::f<...>, ...>" (the wrapper's tag)
    tag = (re.search(r"[<,]\s*(?:void\s+)?([A-Za-z_][\w:]*)(?:<[^()]*>)?\([^()]*\)::\[lambda",
                     demangled)
           or re.search(r"__nv_(?:h?dl)_tag<.*?&([A-Za-z_][\w:]*)", demangled))
    if tag:
        name += " [" + tag.group(1).split("::")[-1] + "]"
    return name

with open(path, newline="") as f:
    lines = [l for l in f if l.startswith('"')]
rows = list(csv.reader(lines))
if not rows:
    sys.exit("profile_step_gpu: no kernel rows in " + path)
head = rows[0]
name_col, time_col = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
units = {"ns": 1e-6, "nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}  # to ms
scale = units["ns"]  # base units unless the units row says otherwise
total, count = defaultdict(float), defaultdict(int)
for r in rows[1:]:
    if r[time_col] in units:
        scale = units[r[time_col]]
        continue
    try:
        t = float(r[time_col].replace(",", ""))
    except ValueError:
        continue
    total[label(r[name_col])] += t
    count[label(r[name_col])] += 1
all_ms = sum(total.values()) * scale
launches = sum(count.values())
print(f"{'ms':>9} {'%':>6} {'launches':>8}  kernel function")
ranked = sorted(total.items(), key=lambda kv: -kv[1])
for name, t in ranked:
    print(f"{t * scale:9.3f} {100 * t * scale / all_ms:6.1f} {count[name]:8d}  {name[:110]}")
print(f"FIGURE profile-step {launches} kernel launches, {len(total)} functions, "
      f"GPU time {all_ms:.2f} ms (each kernel alone, summed)")
for name, t in ranked[:top]:
    print(f"FIGURE profile-step {name[:60]} {t * scale:.2f} ms "
          f"({100 * t * scale / all_ms:.1f}%, {count[name]}x)")

# by class, in the order the issue's profile asks for; a kernel is classed by its function name
# (cuBLAS's kernels: nvjet / gemm / cutlass / xmma; the blockwise attention's products are cuBLAS
# GEMMs too, so they count as GEMM here)
classes = [
    ("GEMM", r"nvjet|gemm|gemv|cutlass|xmma|splitKreduce|cublas"),
    ("attention", r"attention|flash|sdpa|fmha|fused_(forward|backward)|softmax|ring"),
    ("norm", r"layernorm|rmsnorm"),
    ("loss", r"cross_entropy|vocab_|classifier"),
    ("optimizer", r"adamw|squares|inf_nan|clip"),
    ("communication", r"nccl|all_reduce|reduce_scatter|all_gather|broadcast|sendrecv"),
    ("elementwise", r"."),
]
by_class = defaultdict(float)
for name, t in total.items():
    for cls, pattern in classes:
        if re.search(pattern, name, re.IGNORECASE):
            by_class[cls] += t * scale
            break
print(f"\n{'ms':>9} {'%':>6}  class")
for cls, _ in classes:
    ms = by_class.get(cls, 0.0)
    print(f"{ms:9.3f} {100 * ms / all_ms:6.1f}  {cls}")
    print(f"FIGURE profile-step class {cls} {ms:.2f} ms ({100 * ms / all_ms:.1f}%)")

# the GEMMs against their own roofline, and the step against 40% and 50% MFU: the model FLOPs are
# fourway-train's (plan/step_time.hpp's flops_per_token: 6·(L·(12C² + 13C) + V·C) + 12·L·T·C
# per token), the GEMMs' the weight products alone (6·(12·L·C² + V·C) per token)
shape = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[3].split(","))}
peak = float(sys.argv[4]) * 1e12 if sys.argv[4] else 0.0
L, C, V, T, B = shape["L"], shape["C"], shape["V"], shape["T"], shape["B"]
tokens = B * T
model_flops = tokens * (6 * (L * (12 * C * C + 13 * C) + V * C) + 12 * L * T * C)
gemm_flops = tokens * 6 * (12 * L * C * C + V * C)
if peak > 0:
    gemm_ms = by_class.get("GEMM", 0.0)
    ideal_ms = gemm_flops / peak * 1e3
    print(f"FIGURE profile-step GEMM roofline: {gemm_flops / 1e12:.2f} TFLOP of weight products "
          f"need {ideal_ms:.2f} ms at {peak / 1e12:.0f} TFLOP/s; the GEMM kernels take "
          f"{gemm_ms:.2f} ms ({100 * ideal_ms / gemm_ms if gemm_ms > 0 else 0:.0f}% of the peak)")
    for mfu in (0.4, 0.5):
        budget = model_flops / (mfu * peak) * 1e3
        print(f"FIGURE profile-step at {100 * mfu:.0f}% MFU the step has {budget:.2f} ms; its "
              f"kernels take {all_ms:.2f} ms ({all_ms - budget:+.2f} ms), of which outside the "
              f"GEMMs {all_ms - by_class.get('GEMM', 0.0):.2f} ms")
else:
    print("FIGURE profile-step no peak for this GPU (PEAK_TFLOPS): no roofline")
PY
