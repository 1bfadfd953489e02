// One precision of fourway-train-cuda in its own translation unit: CMake compiles this file once
// per precision with FOURWAY_TRAIN_PRECISION set to float, fw::bf16 or fw::fp16 (train_in in
// train_program.hpp says why).
#include "cuda_target.cuh"

#ifndef FOURWAY_TRAIN_PRECISION
#error \
    "fourway: compile train_cuda_precision.cu with -DFOURWAY_TRAIN_PRECISION=float|fw::bf16|fw::fp16"
#endif

template int fourway_train::train_in<fourway_train::CudaTarget, FOURWAY_TRAIN_PRECISION>(
    const fourway_train::Options&);
