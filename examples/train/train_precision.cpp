// One precision of fourway-train in its own translation unit: CMake compiles this file once per
// precision with FOURWAY_TRAIN_PRECISION set to float, fw::bf16 or fw::fp16 (train_in in
// train_program.hpp says why).
#include "host_target.hpp"

#ifndef FOURWAY_TRAIN_PRECISION
#error "fourway: compile train_precision.cpp with -DFOURWAY_TRAIN_PRECISION=float|fw::bf16|fw::fp16"
#endif

template int fourway_train::train_in<fourway_train::HostTarget, FOURWAY_TRAIN_PRECISION>(
    const fourway_train::Options&);
