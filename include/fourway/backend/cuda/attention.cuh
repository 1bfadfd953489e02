//! CUDA causal self-attention with materialised scores, twin of `host/attention.hpp` (same
//! layout, same rounding points): per batch, strided-batched cuBLAS GEMMs over the heads
//! (the heads of one batch are `hs` columns apart in `qkv`) and warp-per-row causal softmax.
//!
//! `att (B, NH, T, T)` holds the probabilities (zero above the diagonal) and is the scores
//! buffer first: the QKᵀ GEMM writes the *scaled* scores (alpha = 1/√hs), so fp16 scores do not
//! overflow where the scaled ones are in range; backward writes `dqkv` (`=`) and uses `datt` as dP,
//! then dS.
// fourway-requires: cuda
#pragma once

#include <cmath>
#include <cstdint>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/gemm.cuh"
#include "fourway/backend/cuda/softmax.cuh"
#include "fourway/backend/host/attention.hpp"

namespace fourway::cuda {

/// out (B, T, C), att (B, NH, T, T) from qkv (B, T, 3C); causal.
template <floating_dtype E>
void attention_forward(const Context<Cuda>& ctx, E* out, E* att, const E* qkv, std::int64_t B,
                       std::int64_t T, std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = host::detail::head_size(C, NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (std::int64_t b = 0; b < B; ++b) {
    const E* q = qkv + b * T * 3 * C;
    E* p = att + b * NH * T * T;
    gemm_strided_batched(ctx, Trans::none, Trans::transpose, T, T, hs, scale, q, 3 * C, hs, q + C,
                         3 * C, hs, 0.0f, p, T, T * T, NH);
  }
  detail::softmax_rows(ctx, att, att, B * NH * T, T, 1.0f, T);
  for (std::int64_t b = 0; b < B; ++b) {
    gemm_strided_batched(ctx, Trans::none, Trans::none, T, hs, T, 1.0f, att + b * NH * T * T, T,
                         T * T, qkv + b * T * 3 * C + 2 * C, 3 * C, hs, 0.0f, out + b * T * C, C,
                         hs, NH);
  }
}

/// dqkv (B, T, 3C) = gradient of attention_forward; datt (B, NH, T, T) is scratch.
template <floating_dtype E>
void attention_backward(const Context<Cuda>& ctx, E* dqkv, E* datt, const E* dout, const E* qkv,
                        const E* att, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t NH) {
  const std::int64_t hs = host::detail::head_size(C, NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (std::int64_t b = 0; b < B; ++b) {
    const E* q = qkv + b * T * 3 * C;
    E* dq = dqkv + b * T * 3 * C;
    const E* p = att + b * NH * T * T;
    E* dp = datt + b * NH * T * T;
    const E* dob = dout + b * T * C;
    // dV = P^T dO;  dP = dO V^T
    gemm_strided_batched(ctx, Trans::transpose, Trans::none, T, hs, T, 1.0f, p, T, T * T, dob, C,
                         hs, 0.0f, dq + 2 * C, 3 * C, hs, NH);
    gemm_strided_batched(ctx, Trans::none, Trans::transpose, T, T, hs, 1.0f, dob, C, hs, q + 2 * C,
                         3 * C, hs, 0.0f, dp, T, T * T, NH);
  }
  detail::softmax_backward_rows(ctx, datt, att, datt, B * NH * T, T, scale, T);
  for (std::int64_t b = 0; b < B; ++b) {
    const E* q = qkv + b * T * 3 * C;
    E* dq = dqkv + b * T * 3 * C;
    const E* dp = datt + b * NH * T * T;
    // dQ = dS K;  dK = dS^T Q
    gemm_strided_batched(ctx, Trans::none, Trans::none, T, hs, T, 1.0f, dp, T, T * T, q + C, 3 * C,
                         hs, 0.0f, dq, 3 * C, hs, NH);
    gemm_strided_batched(ctx, Trans::transpose, Trans::none, T, hs, T, 1.0f, dp, T, T * T, q, 3 * C,
                         hs, 0.0f, dq + C, 3 * C, hs, NH);
  }
}

}  // namespace fourway::cuda
