//! `Ops<B>`: the kernel set of backend `B`, so that a layer written once calls `host::gemm` when
//! instantiated on `Host` and `cuda::gemm` on `Cuda`.
//!
//! Pure forwarding, no arithmetic: each member passes its arguments unchanged to the kernel of the
//! same name in `fourway::host` (here) or `fourway::cuda` (`layers/ops.cuh`, nvcc builds). A
//! layer names its kernels as `Ops<B>::gemm(ctx, ...)`; the lookup is dependent on `B`, so the
//! CUDA specialisation only has to be visible where a `Cuda` layer is instantiated.
#pragma once

#include <cstdint>
#include <utility>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/kernels.hpp"

namespace fourway {

template <class B>
struct Ops;

// NOLINTNEXTLINE(cppcoreguidelines-macro-usage): one forwarding member per kernel name.
#define FOURWAY_LAYERS_FORWARD_KERNEL(ns, fn)                \
  template <class... Args>                                   \
  static decltype(auto) fn(Args&&... args) {                 \
    return ns::fn(std::forward<Args>(args)...);              \
  }

#define FOURWAY_LAYERS_KERNEL_SET(ns)                                   \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, copy)                               \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, fill)                               \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, to_host)                            \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, from_host)                          \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, gemm)                               \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, bias_add)                           \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, bias_backward)                      \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, residual_forward)                   \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, gelu_forward)                       \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, gelu_backward)                      \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, layernorm_forward)                  \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, layernorm_backward)                 \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, attention_forward)                  \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, attention_backward)                 \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, cross_entropy_forward)              \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, cross_entropy_backward)             \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, embedding_forward)                  \
  FOURWAY_LAYERS_FORWARD_KERNEL(ns, embedding_backward)

template <>
struct Ops<Host> {
  FOURWAY_LAYERS_KERNEL_SET(::fourway::host)
};

}  // namespace fourway
