//! `Ops<B>`: the kernel set of backend `B`, so that code written once (layers, optimizer,
//! strategies) calls `host::gemm` when instantiated on `Host` and `cuda::gemm` on `Cuda`.
//!
//! Pure forwarding, no arithmetic: each member passes its arguments unchanged to the kernel of the
//! same name in `fourway::host` (here) or `fourway::cuda` (`backend/ops.cuh`, included at the end
//! of this header when nvcc compiles the translation unit). A layer names its kernels as
//! `Ops<B>::gemm(ctx, ...)`; the lookup is dependent on `B`, so the CUDA specialisation only has
//! to be visible where a `Cuda` layer is instantiated. Every kernel of the contract table is
//! listed.
#pragma once

#include <cstdint>
#include <utility>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/kernels.hpp"

namespace fourway {

template <class B>
struct Ops;

// NOLINTNEXTLINE(cppcoreguidelines-macro-usage): one forwarding member per kernel name.
#define FOURWAY_BACKEND_FORWARD_KERNEL(ns, fn)  \
  template <class... Args>                      \
  static decltype(auto) fn(Args&&... args) {    \
    return ns::fn(std::forward<Args>(args)...); \
  }

#define FOURWAY_BACKEND_KERNEL_SET(ns)                           \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, copy)                       \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, fill)                       \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, to_host)                    \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, from_host)                  \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gemm)                       \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gemm_bias)                  \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gemm_bgrad)                 \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gemm_dgelu)                 \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, bias_add)                   \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, bias_backward)              \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, residual_forward)           \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gelu_forward)               \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gelu_backward)              \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, layernorm_forward)          \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, layernorm_backward)         \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, residual_layernorm_forward) \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, rmsnorm_forward)            \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, rmsnorm_backward)           \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, rope_forward)               \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, rope_backward)              \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, swiglu_forward)             \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, swiglu_backward)            \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gqa_pack)                   \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gqa_unpack_grad)            \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, attention_forward)          \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, attention_backward)         \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, flash_attention_forward)    \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, flash_attention_backward)   \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, cross_entropy_forward)      \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, cross_entropy_backward)     \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, embedding_forward)          \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, embedding_backward)         \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, vocab_embed_forward)        \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, vocab_embed_backward)       \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, gemm_strided_batched)       \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, softmax_forward)            \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, softmax_backward)           \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, vocab_local_max)            \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, vocab_local_sumexp)         \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, vocab_target_logit)         \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, vocab_loss)                 \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, vocab_local_grad)           \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, cast)                       \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, scale)                      \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, has_inf_nan)                \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, sum_squares)                \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, sum_squares_into)           \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, sum_into)                   \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, adamw_update)               \
  FOURWAY_BACKEND_FORWARD_KERNEL(ns, adamw_update_list)

template <>
struct Ops<Host> {
  FOURWAY_BACKEND_KERNEL_SET(::fourway::host)
};

}  // namespace fourway

#if defined(FOURWAY_CUDA_COMPILATION)
#include "fourway/backend/ops.cuh"  // Ops<Cuda>: every nvcc translation unit gets both backends
#endif
