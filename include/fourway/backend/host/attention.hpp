//! Host causal multi-head self-attention, forward and backward, with materialised scores.
//!
//! Layout (GPT-2, llm.c): `qkv (B, T, 3C)` holds q, k, v side by side, head h owning columns
//! `[h*hs, (h+1)*hs)` of each third (`hs = C / NH`); `att (B, NH, T, T)` keeps the softmax
//! probabilities for the backward, with zeros above the diagonal; `out (B, T, C)` has the heads
//! side by side again. Scores use the scale `1/sqrt(hs)`, applied as the QKᵀ GEMM's alpha (in
//! fp32, before the scores are rounded to E), so 16-bit scores are the scaled ones: unscaled fp16
//! scores overflow 65504 at |q|·|k| that the scaled ones never reach. Per (batch, head) the work is
//! GEMMs (host::gemm) plus a row softmax, so it runs at GEMM speed; `att` doubles as the scores
//! buffer, so 16-bit types round the scores once before the softmax (as llm.c does).
//!
//! Backward writes `dqkv` (`=`); `datt` is scratch of `att`'s size that ends holding dS, the
//! gradient of the scaled scores.
#pragma once

#include <cmath>
#include <cstdint>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/gemm.hpp"
#include "fourway/backend/host/softmax.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway::host {

namespace detail {
inline std::int64_t head_size(std::int64_t C, std::int64_t NH) {
  check<ShapeError>(NH > 0 && C % NH == 0, "fourway: attention needs C divisible by NH, got C=", C,
                    " NH=", NH);
  return C / NH;
}
}  // namespace detail

/// out (B, T, C), att (B, NH, T, T) from qkv (B, T, 3C); causal.
template <floating_dtype E>
void attention_forward(const Context<Host>& ctx, E* out, E* att, const E* qkv, std::int64_t B,
                       std::int64_t T, std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = detail::head_size(C, NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (std::int64_t b = 0; b < B; ++b) {
    const E* q = qkv + b * T * 3 * C;
    for (std::int64_t h = 0; h < NH; ++h) {
      const E* qh = q + h * hs;
      const E* kh = q + C + h * hs;
      const E* vh = q + 2 * C + h * hs;
      E* p = att + (b * NH + h) * T * T;
      gemm(ctx, Trans::none, Trans::transpose, T, T, hs, scale, qh, 3 * C, kh, 3 * C, 0.0f, p, T);
      for (std::int64_t t = 0; t < T; ++t) {
        E* row = p + t * T;
        detail::softmax_row(row, row, t + 1, 1.0f);
        for (std::int64_t j = t + 1; j < T; ++j) row[j] = convert<E>(0.0f);
      }
      gemm(ctx, Trans::none, Trans::none, T, hs, T, 1.0f, p, T, vh, 3 * C, 0.0f,
           out + b * T * C + h * hs, C);
    }
  }
}

/// dqkv (B, T, 3C) = gradient of attention_forward; datt (B, NH, T, T) is scratch.
template <floating_dtype E>
void attention_backward(const Context<Host>& ctx, E* dqkv, E* datt, const E* dout, const E* qkv,
                        const E* att, std::int64_t B, std::int64_t T, std::int64_t C,
                        std::int64_t NH) {
  const std::int64_t hs = detail::head_size(C, NH);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (std::int64_t b = 0; b < B; ++b) {
    const E* q = qkv + b * T * 3 * C;
    E* dq = dqkv + b * T * 3 * C;
    const E* dob = dout + b * T * C;
    for (std::int64_t h = 0; h < NH; ++h) {
      const E* p = att + (b * NH + h) * T * T;
      E* dp = datt + (b * NH + h) * T * T;
      const E* doh = dob + h * hs;
      // dV = P^T dO;  dP = dO V^T
      gemm(ctx, Trans::transpose, Trans::none, T, hs, T, 1.0f, p, T, doh, C, 0.0f,
           dq + 2 * C + h * hs, 3 * C);
      gemm(ctx, Trans::none, Trans::transpose, T, T, hs, 1.0f, doh, C, q + 2 * C + h * hs, 3 * C,
           0.0f, dp, T);
      // dS = scale * P (dP - <dP, P>) on the causal part; zero above the diagonal
      for (std::int64_t t = 0; t < T; ++t) {
        E* row = dp + t * T;
        detail::softmax_backward_row(row, p + t * T, row, t + 1, scale);
        for (std::int64_t j = t + 1; j < T; ++j) row[j] = convert<E>(0.0f);
      }
      // dQ = dS K;  dK = dS^T Q
      gemm(ctx, Trans::none, Trans::none, T, hs, T, 1.0f, dp, T, q + C + h * hs, 3 * C, 0.0f,
           dq + h * hs, 3 * C);
      gemm(ctx, Trans::transpose, Trans::none, T, hs, T, 1.0f, dp, T, q + h * hs, 3 * C, 0.0f,
           dq + C + h * hs, 3 * C);
    }
  }
}

}  // namespace fourway::host
