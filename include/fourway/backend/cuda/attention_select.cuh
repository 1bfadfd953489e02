//! Which causal attention the layers run on a GPU — `flash_attention_forward` /
//! `flash_attention_backward`, the Ops entry points, in this order:
//!   - cuDNN's attention graph (`cudnn/sdpa.cuh`) when the context asks for it
//!     (`Context<Cuda>::set_cudnn_attention`), the unit was compiled with the `fourway::cudnn`
//!     component (FOURWAY_HAS_CUDNN; without it the request is a ConfigError, not a silent
//!     fallback) and cuDNN takes the shape (bf16 / fp16, its head sizes);
//!   - the fused tensor-core kernels of `fused_attention.cuh` when the context asks for them
//!     (`set_fused_attention`) and they take the call (bf16 / fp16, their head sizes, alignment);
//!   - else the blockwise path of `blockwise_attention.cuh`.
//! The forward and the backward decide alike from the same shape, types and flags. The fused and
//! blockwise paths keep the same stash (out and lse), so either backward follows either forward;
//! cuDNN's backward reads cuDNN's own statistics, which it pairs with its forward.
// fourway-requires: cuda
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/blockwise_attention.cuh"
#include "fourway/backend/cuda/fused_attention.cuh"
#include "fourway/config.hpp"
#include "fourway/core/error.hpp"
#if FOURWAY_HAS_CUDNN
#include "fourway/backend/cudnn/sdpa.cuh"
#endif

namespace fourway::cuda {

namespace detail {
/// True when cuDNN runs this attention (see the file comment); a request in a unit without the
/// component throws ConfigError.
template <floating_dtype E, class... Ptrs>
bool use_cudnn_attention(const Context<Cuda>& ctx, std::int64_t B, std::int64_t T, std::int64_t C,
                         std::int64_t NH, const Ptrs*... ptrs) {
  if (!ctx.cudnn_attention()) return false;
#if FOURWAY_HAS_CUDNN
  return cudnn_attention_supports<E>(ctx, B, T, C, NH, ptrs...);
#else
  ((void)ptrs, ...);
  (void)B, (void)T, (void)C, (void)NH;
  throw ConfigError(
      "fourway: cuDNN attention was asked for (Context<Cuda>::set_cudnn_attention, --attention "
      "cudnn), but this unit was compiled without the fourway::cudnn component; link it (its "
      "configure line says why it is off) or drop the request");
#endif
}
}  // namespace detail

template <floating_dtype E>
void flash_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  if (detail::use_cudnn_attention<E>(ctx, B, T, C, NH, out, qkv)) {
#if FOURWAY_HAS_CUDNN
    if constexpr (detail::cudnn_element<E>) {
      cudnn_attention_forward(ctx, out, lse, qkv, B, T, C, NH);
      return;
    }
#endif
  }
  if constexpr (detail::fused_element<E>) {
    if (ctx.fused_attention() && fused_attention_supports<E>(ctx, B, T, C, NH, out, qkv)) {
      detail::fused_forward_launch(ctx, out, lse, qkv, B, T, C, NH);  // checked just above
      return;
    }
  }
  blockwise_attention_forward(ctx, out, lse, qkv, B, T, C, NH);
}

template <floating_dtype E>
void flash_attention_backward(const Context<Cuda>& ctx, E* dqkv, float* delta, const E* dout,
                              const E* qkv, const E* out, const float* lse, std::int64_t B,
                              std::int64_t T, std::int64_t C, std::int64_t NH) {
  if (detail::use_cudnn_attention<E>(ctx, B, T, C, NH, dqkv, dout, qkv, out)) {
#if FOURWAY_HAS_CUDNN
    if constexpr (detail::cudnn_element<E>) {
      cudnn_attention_backward(ctx, dqkv, dout, qkv, out, lse, B, T, C, NH);
      return;
    }
#endif
  }
  if constexpr (detail::fused_element<E>) {
    if (ctx.fused_attention() &&
        fused_attention_supports<E>(ctx, B, T, C, NH, dqkv, dout, qkv, out)) {
      detail::fused_backward_launch(ctx, dqkv, delta, dout, qkv, out, lse, B, T, C, NH);
      return;
    }
  }
  blockwise_attention_backward(ctx, dqkv, delta, dout, qkv, out, lse, B, T, C, NH);
}

}  // namespace fourway::cuda
