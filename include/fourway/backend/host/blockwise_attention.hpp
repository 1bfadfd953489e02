//! The blockwise causal attention on the host: the algorithm of `backend/blockwise_attention.hpp`
//! (what a GPU runs in the attention layers) with the host GEMM and the element passes below.
//! The host layers run the tiled flash twin (`host/flash_attention.hpp`) instead; this form is
//! here so CI runs the GPU path's block loop, GEMM shapes, plan and roundings against that twin
//! (tests/backend/blockwise_attention_test.cpp). Same contract as the twin: out (B, T, C) and
//! lse (B, NH, T) forward; dqkv (`=`) and delta (B, NH, T) = rowsum(dO ∘ O) backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "fourway/backend/blockwise_attention.hpp"
#include "fourway/backend/blockwise_plan.hpp"
#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/gemm.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

namespace detail {

/// The host kernels of the blockwise algorithm, one element at a time, fp32 inside.
struct HostBlockKernels {
  using Backend = Host;
  template <class... Args>
  static void gemm_strided_batched(Args&&... args) {
    host::gemm_strided_batched(std::forward<Args>(args)...);
  }
  /// Token-major ↔ head-major (`blockwise::head_major_at`).
  template <class To, class From>
  static void permute_heads(const Context<Host>& /*ctx*/, To* dst, const From* src, std::int64_t nb,
                            std::int64_t T, std::int64_t parts, std::int64_t C, std::int64_t hs,
                            bool to_heads) {
    for (std::int64_t i = 0; i < nb * T * parts * C; ++i) {
      const std::int64_t at = blockwise::head_major_at(i, nb, T, parts, C, hs);
      if (to_heads) {
        dst[at] = convert<To>(convert<float>(src[i]));
      } else {
        dst[i] = convert<To>(convert<float>(src[at]));
      }
    }
  }
  template <class E>
  static void block_softmax(const Context<Host>& /*ctx*/, const float* s, E* p, float* lse,
                            std::int64_t rows, std::int64_t rc, std::int64_t e, std::int64_t first,
                            std::int64_t T) {
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t t = first + row % rc;
      const float* x = s + row * e;
      E* y = p + row * e;
      float mx = -INFINITY;
      for (std::int64_t c = 0; c <= t; ++c) mx = std::max(mx, x[c]);
      float sum = 0.0f;
      for (std::int64_t c = 0; c <= t; ++c) sum += std::exp(x[c] - mx);
      const float inv = 1.0f / sum;
      const float L = mx + std::log(sum);
      for (std::int64_t c = 0; c <= t; ++c) y[c] = convert<E>(std::exp(x[c] - mx) * inv);
      for (std::int64_t c = t + 1; c < e; ++c) y[c] = convert<E>(0.0f);
      lse[(row / rc) * T + t] = L;
    }
  }
  template <class E>
  static void block_softmax_grad(const Context<Host>& /*ctx*/, const float* s, const float* dp,
                                 E* p, E* ds, const float* lse, const float* delta,
                                 std::int64_t rows, std::int64_t rc, std::int64_t e,
                                 std::int64_t first, std::int64_t T) {
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t t = first + row % rc;
      const std::int64_t at = (row / rc) * T + t;
      const float L = lse[at];
      const float D = delta[at];
      for (std::int64_t c = 0; c < e; ++c) {
        const std::int64_t o = row * e + c;
        const float sv = s[o];
        const float g = dp[o];
        const float pv = c <= t ? std::exp(sv - L) : 0.0f;
        p[o] = convert<E>(pv);
        ds[o] = convert<E>(pv * (g - D));
      }
    }
  }
  template <class E>
  static void row_delta(const Context<Host>& /*ctx*/, float* delta, const E* dout, const E* out,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
    const std::int64_t hs = C / NH;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < NH; ++h) {
        for (std::int64_t t = 0; t < T; ++t) {
          const std::int64_t at = (b * T + t) * C + h * hs;
          float sum = 0.0f;
          for (std::int64_t d = 0; d < hs; ++d) {
            sum += convert<float>(dout[at + d]) * convert<float>(out[at + d]);
          }
          delta[(b * NH + h) * T + t] = sum;
        }
      }
    }
  }
  static void zero(const Context<Host>& /*ctx*/, float* p, std::int64_t n) {
    std::fill(p, p + n, 0.0f);
  }
};

}  // namespace detail

/// The GPU's attention algorithm on the host (see the header comment); `chunk` and `budget` as
/// `blockwise_plan` takes them.
template <floating_dtype E>
void blockwise_attention_forward(const Context<Host>& ctx, E* out, float* lse, const E* qkv,
                                 std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                                 std::int64_t chunk = attention_query_chunk,
                                 std::int64_t budget = attention_score_budget) {
  blockwise::forward<detail::HostBlockKernels>(ctx, out, lse, qkv, B, T, C, NH, chunk, budget);
}

template <floating_dtype E>
void blockwise_attention_backward(const Context<Host>& ctx, E* dqkv, float* delta, const E* dout,
                                  const E* qkv, const E* out, const float* lse, std::int64_t B,
                                  std::int64_t T, std::int64_t C, std::int64_t NH,
                                  std::int64_t chunk = attention_query_chunk,
                                  std::int64_t budget = attention_score_budget) {
  blockwise::backward<detail::HostBlockKernels>(ctx, dqkv, delta, dout, qkv, out, lse, B, T, C, NH,
                                                chunk, budget);
}

}  // namespace fourway::host
