#!/usr/bin/env bash
# benchmarks/train/profile_step_gpu.sh without a GPU: a stand-in ncu checks that recording starts
# off and that fourway-train-cuda is asked to open its window on the last step (--profile-step
# STEPS) with the chosen --attention, then writes a CSV of kernel rows as ncu does (header, units
# row, one row per launch); the script's summary must sum them by function, name a device
# lambda's enclosing function, and print the FIGURE lines. The real profile needs a GPU and Nsight
# Compute (scripts/device-check.sh, step profile-step).
#   profile_step_gpu_stubbed.sh SCRIPT WORKDIR
set -uo pipefail
# shellcheck source=tests/device_check/stub_checks.sh
source "$(dirname "$0")/stub_checks.sh"
script=$1
work=$2
rm -rf "$work" && mkdir -p "$work/build/examples/train" "$work/bin"
cat > "$work/build/examples/train/fourway-train-cuda" <<'STUB'
#!/usr/bin/env bash
echo "fourway-train-cuda $*" > "$STUB_ARGS"
STUB
printf '#!/usr/bin/env bash\necho "GPU 0: StubGPU"\n' > "$work/bin/nvidia-smi"
cat > "$work/ncu" <<'STUB'
#!/usr/bin/env bash
log=
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  [ "${args[i]}" = --log-file ] && log=${args[i + 1]}
done
echo "ncu ${args[*]}" > "$STUB_NCU_ARGS"
# the program: the first argument that is an executable path
for ((i = 0; i < ${#args[@]}; ++i)); do
  if [ -x "${args[i]}" ] && [ -f "${args[i]}" ]; then
    "${args[@]:i}" || exit 1
    break
  fi
done
{
  echo '==PROF== Connected to process 1'
  echo '"ID","Kernel Name","gpu__time_duration.sum"'
  echo '"","","nsecond"'
  echo '"0","void fourway::cuda::detail::fused_forward_kernel<fourway::bf16, 64>(fourway::bf16*, float*, const fourway::bf16*, fourway::cuda::detail::FusedShape)","1,000,000"'
  echo '"1","nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT","2,500,000"'
  echo '"2","void fourway::cuda::detail::fused_forward_kernel<fourway::bf16, 64>(fourway::bf16*, float*, const fourway::bf16*, fourway::cuda::detail::FusedShape)","1,000,000"'
  echo '"3","void fourway::cuda::detail::for_each_kernel<void fourway::cuda::cast<float, fourway::bf16>(const fourway::Context<fourway::Cuda>&, fourway::bf16*, const float*, long)::[lambda(long) (instance 1)]>(long, T1)","500,000"'
} > "$log"
STUB
chmod +x "$work/build/examples/train/fourway-train-cuda" "$work/bin/nvidia-smi" "$work/ncu"
export STUB_ARGS=$work/train-args.txt STUB_NCU_ARGS=$work/ncu-args.txt NCU=$work/ncu
export PATH=$work/bin:$PATH PYTHON=${PYTHON:-python3}

out=$(ATTENTION=fused bash "$script" "$work/build" "$work/out" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc"
grep -q -- "--profile-from-start off" "$STUB_NCU_ARGS" 2>/dev/null ||
  fail "ncu was not started with its recording off: $(cat "$STUB_NCU_ARGS" 2>/dev/null)"
for want in "--steps 2" "--profile-step 2" "--attention fused" "--precision bf16"; do
  grep -q -- "$want" "$STUB_ARGS" 2>/dev/null ||
    fail "fourway-train-cuda not given '$want': $(cat "$STUB_ARGS" 2>/dev/null)"
done
expect_in_out "" "FIGURE profile-step 4 kernel launches, 3 functions, GPU time 5.00 ms" \
  "FIGURE profile-step nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT 2.50 ms (50.0%, 1x)" \
  "FIGURE profile-step fused_forward_kernel 2.00 ms (40.0%, 2x)" \
  "FIGURE profile-step for_each_kernel [cast] 0.50 ms (10.0%, 1x)" \
  "FIGURE profile-step class GEMM 2.50 ms (50.0%)" \
  "FIGURE profile-step class attention 2.00 ms (40.0%)" \
  "FIGURE profile-step class norm 0.00 ms (0.0%)" \
  "FIGURE profile-step class elementwise 0.50 ms (10.0%)" \
  "FIGURE profile-step no peak for this GPU (PEAK_TFLOPS): no roofline"

# the roofline at a given peak: GPT-2 124M's weight products, 6·(12·L·C² + V·C) FLOPs per token
# over 8192 tokens = 6.07 TFLOP, 6.14 ms at 989 TFLOP/s; the model's FLOPs (6·(L·(12C² + 13C) +
# V·C) + 12·L·T·C per token) give 14.17 ms of budget at 50% MFU
out=$(PEAK_TFLOPS=989 ATTENTION=cudnn bash "$script" "$work/build" "$work/out" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with PEAK_TFLOPS=989"
grep -q -- "--attention cudnn" "$STUB_ARGS" || fail "ATTENTION=cudnn not passed on"
expect_in_out "" "FIGURE profile-step GEMM roofline: 6.07 TFLOP of weight products need 6.14 ms at \
989 TFLOP/s; the GEMM kernels take 2.50 ms (246% of the peak)" \
  "FIGURE profile-step at 40% MFU the step has 17.71 ms; its kernels take 5.00 ms (-12.71 ms), \
of which outside the GEMMs 2.50 ms" \
  "FIGURE profile-step at 50% MFU the step has 14.17 ms; its kernels take 5.00 ms (-9.17 ms), \
of which outside the GEMMs 2.50 ms"

out=$(STEPS=3 bash "$script" "$work/build" "$work/out" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "exit $rc with STEPS=3"
for want in "--steps 3" "--profile-step 3" "--attention blockwise"; do
  grep -q -- "$want" "$STUB_ARGS" || fail "STEPS=3: fourway-train-cuda not given '$want'"
done

out=$(ATTENTION=tiled bash "$script" "$work/build" "$work/out" 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "exit $rc for ATTENTION=tiled, want 2"
grep -qF "ATTENTION takes blockwise, fused or cudnn, got 'tiled'" <<< "$out" ||
  fail "no clear message for ATTENTION=tiled"

finish profile_step_gpu_stubbed
