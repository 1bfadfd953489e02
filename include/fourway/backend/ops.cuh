//! `Ops<Cuda>`: the CUDA kernel set — the same forwarding members as `Ops<Host>`
//! (backend/ops.hpp), to `fourway::cuda`. backend/ops.hpp includes it in every nvcc translation
//! unit, so a `.cu` file including any header that dispatches through `Ops<B>` gets it — and
//! `StepGraph<Cuda>` (backend/cuda/graph.cuh), which the Trainer holds on every backend.
// fourway-requires: cuda
#pragma once

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/backend/cuda/graph.cuh"
#include "fourway/backend/cuda/kernels.cuh"
#include "fourway/backend/ops.hpp"

namespace fourway {

template <>
struct Ops<Cuda> {
  FOURWAY_BACKEND_KERNEL_SET(::fourway::cuda)
};

}  // namespace fourway
