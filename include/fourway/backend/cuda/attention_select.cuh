//! Which causal attention the layers run on a GPU — `flash_attention_forward` /
//! `flash_attention_backward`, the Ops entry points: the fused tensor-core kernels of
//! `fused_attention.cuh` when the context asks for them (`Context<Cuda>::set_fused_attention`)
//! and they take the call (bf16 / fp16, their head sizes and alignment), else the blockwise path
//! of `blockwise_attention.cuh`. The forward and the backward decide alike from the same shape
//! and types, and both paths keep the same stash (out and lse), so either backward follows
//! either forward.
// fourway-requires: cuda
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/blockwise_attention.cuh"
#include "fourway/backend/cuda/fused_attention.cuh"

namespace fourway::cuda {

template <floating_dtype E>
void flash_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
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
