//! `Ops<Cuda>`: the CUDA kernel set for layers instantiated on `Cuda` — the same forwarding
//! members as `Ops<Host>` (layers/ops.hpp), to `fourway::cuda`. layers/ops.hpp includes it in
//! every nvcc translation unit, so a `.cu` file including any layer header gets it.
// fourway-requires: cuda
#pragma once

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/backend/cuda/kernels.cuh"
#include "fourway/layers/ops.hpp"

namespace fourway {

template <>
struct Ops<Cuda> {
  FOURWAY_LAYERS_KERNEL_SET(::fourway::cuda)
};

}  // namespace fourway
