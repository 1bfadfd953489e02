//! Host flash-style causal attention, forward and backward: the online softmax over key tiles
//! (Milakov & Gimelshein 2018; Dao et al., FlashAttention 1/2), with no (T, T) score matrix.
//!
//! Same layout as `host/attention.hpp`: `qkv (B, T, 3C)` holds q, k, v side by side, head h owning
//! columns `[h*hs, (h+1)*hs)` of each third; `out (B, T, C)` has the heads side by side. The
//! forward keeps only `lse (B, NH, T)` (fp32): each query row's log-sum-exp of its scaled scores,
//! `L = m + log ℓ`. The backward recomputes `P = exp(S − L)` tile by tile from q, k and `L`, with
//! `D = rowsum(dO ∘ O)` written into `delta (B, NH, T)` (fp32 scratch the caller owns).
//!
//! Tiling (the CUDA twin in `cuda/flash_attention.cuh` uses the same squares, 32 wide there):
//! query and key tiles of `flash_tile` rows, aligned, so a query tile meets the key tiles left of
//! and on the diagonal; the tiles above it are skipped (never computed), and in the diagonal tile
//! the keys after each query are masked. Forward, per (batch, head, query tile): for each key tile
//! `S = scale·Q Kᵀ`, the running max `m` and sum `ℓ` are updated, the accumulator is rescaled by
//! `exp(m_old − m_new)` and `P V` added. Backward, per (batch, head, key tile): for each query tile
//! from the diagonal down, `dV += Pᵀ dO`, `dS = P ∘ (dO Vᵀ − D)`, `dK += scale·dSᵀ Q` and
//! `dQ += scale·dS K` — key tiles in ascending order, so every sum has one fixed order (no
//! atomics; the result is the same run after run).
//!
//! Precision: q, k, v and dO of one head are read into fp32 once; scores, probabilities, the
//! statistics and every accumulator are fp32; `out` and `dqkv` are rounded to E once at the end.
//! The materialised kernels instead round the scores and P to E in 16-bit types, so the two agree
//! to a tolerance, not bit for bit (tests/backend/flash_attention_test.cpp). Tile GEMMs go through
//! `host::gemm` in fp32. The per-head fp32 copies and tiles are thread-local scratch of
//! O(T·hs + tile²) floats, like the GEMM's packing buffers: not counted by the memory accountant.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fourway/backend/host/attention.hpp"
#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/gemm.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

/// Query rows and key columns of one tile.
inline constexpr std::int64_t flash_tile = 64;

namespace detail {
struct FlashScratch {
  std::vector<float> q, k, v, dout, dq, acc, s, dp, dk, dv;
  std::vector<float> m, l;
};
/// One call's head size, scale and this thread's fp32 (T, hs) buffers for q, k and v.
struct FlashHead {
  std::int64_t hs;
  float scale;
  float *q, *k, *v;
};
inline FlashScratch& flash_scratch() {
  thread_local FlashScratch s;
  return s;
}
inline float* sized(std::vector<float>& v, std::int64_t n) {
  if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
  return v.data();
}
inline FlashHead flash_head(FlashScratch& sc, std::int64_t T, std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = head_size(C, NH);
  return FlashHead{hs, 1.0f / std::sqrt(static_cast<float>(hs)), sized(sc.q, T * hs),
                   sized(sc.k, T * hs), sized(sc.v, T * hs)};
}
/// dst (T, hs) = the fp32 values of T rows of `hs` elements, `ld` apart, from `src`.
template <class E>
void head_rows_to_float(float* dst, const E* src, std::int64_t T, std::int64_t hs,
                        std::int64_t ld) {
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i = 0; i < hs; ++i) dst[t * hs + i] = convert<float>(src[t * ld + i]);
  }
}
template <class E>
void head_rows_from_float(E* dst, const float* src, std::int64_t T, std::int64_t hs,
                          std::int64_t ld) {
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t i = 0; i < hs; ++i) dst[t * ld + i] = convert<E>(src[t * hs + i]);
  }
}
/// q, k and v of head h from the (T, 3C) rows `x` of one sequence, each into fp32 (T, hs).
template <class E>
void head_qkv_to_float(float* q, float* k, float* v, const E* x, std::int64_t T, std::int64_t C,
                       std::int64_t hs, std::int64_t h) {
  head_rows_to_float(q, x + h * hs, T, hs, 3 * C);
  head_rows_to_float(k, x + C + h * hs, T, hs, 3 * C);
  head_rows_to_float(v, x + 2 * C + h * hs, T, hs, 3 * C);
}
/// Keys of tile `j0` that query `t` may see: those at positions <= t, at most `cols`.
inline std::int64_t visible_keys(std::int64_t t, std::int64_t j0, std::int64_t cols) {
  return std::clamp<std::int64_t>(t - j0 + 1, 0, cols);
}
}  // namespace detail

/// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); causal, scale 1/sqrt(hs).
template <floating_dtype E>
void flash_attention_forward(const Context<Host>& ctx, E* out, float* lse, const E* qkv,
                             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  constexpr std::int64_t bt = flash_tile;
  auto& sc = detail::flash_scratch();
  const auto [hs, scale, q, k, v] = detail::flash_head(sc, T, C, NH);
  float* acc = detail::sized(sc.acc, bt * hs);
  float* s = detail::sized(sc.s, bt * bt);
  float* m = detail::sized(sc.m, bt);
  float* l = detail::sized(sc.l, bt);
  for (std::int64_t b = 0; b < B; ++b) {
    const E* x = qkv + b * T * 3 * C;
    for (std::int64_t h = 0; h < NH; ++h) {
      detail::head_qkv_to_float(q, k, v, x, T, C, hs, h);
      float* lse_h = lse + (b * NH + h) * T;
      for (std::int64_t i0 = 0; i0 < T; i0 += bt) {
        const std::int64_t rows = std::min(bt, T - i0);
        std::fill(acc, acc + rows * hs, 0.0f);
        std::fill(m, m + rows, -std::numeric_limits<float>::infinity());
        std::fill(l, l + rows, 0.0f);
        for (std::int64_t j0 = 0; j0 < i0 + rows; j0 += bt) {  // tiles above the diagonal skipped
          const std::int64_t cols = std::min(bt, T - j0);
          gemm(ctx, Trans::none, Trans::transpose, rows, cols, hs, scale, q + i0 * hs, hs,
               k + j0 * hs, hs, 0.0f, s, bt);
          for (std::int64_t r = 0; r < rows; ++r) {
            float* sr = s + r * bt;
            const std::int64_t n = detail::visible_keys(i0 + r, j0, cols);
            float mx = m[r];
            for (std::int64_t c = 0; c < n; ++c) mx = std::max(mx, sr[c]);
            const float corr = m[r] == -std::numeric_limits<float>::infinity()
                                   ? 0.0f
                                   : detail::exp_poly(m[r] - mx);
            float sum = 0.0f;
            for (std::int64_t c = 0; c < n; ++c) sum += (sr[c] = detail::exp_poly(sr[c] - mx));
            for (std::int64_t c = n; c < cols; ++c) sr[c] = 0.0f;
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            float* ar = acc + r * hs;
            for (std::int64_t i = 0; i < hs; ++i) ar[i] *= corr;
          }
          gemm(ctx, Trans::none, Trans::none, rows, hs, cols, 1.0f, s, bt, v + j0 * hs, hs, 1.0f,
               acc, hs);
        }
        for (std::int64_t r = 0; r < rows; ++r) {
          const float inv = 1.0f / l[r];
          E* o = out + (b * T + i0 + r) * C + h * hs;
          for (std::int64_t i = 0; i < hs; ++i) o[i] = convert<E>(acc[r * hs + i] * inv);
          lse_h[i0 + r] = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

/// dqkv (B, T, 3C) (`=`) from dout, qkv, out and lse of `flash_attention_forward`; `delta`
/// (B, NH, T) is scratch and ends holding D = rowsum(dO ∘ O).
template <floating_dtype E>
void flash_attention_backward(const Context<Host>& ctx, E* dqkv, float* delta, const E* dout,
                              const E* qkv, const E* out, const float* lse, std::int64_t B,
                              std::int64_t T, std::int64_t C, std::int64_t NH) {
  constexpr std::int64_t bt = flash_tile;
  auto& sc = detail::flash_scratch();
  const auto [hs, scale, q, k, v] = detail::flash_head(sc, T, C, NH);
  float* dob = detail::sized(sc.dout, T * hs);
  float* dq = detail::sized(sc.dq, T * hs);
  float* p = detail::sized(sc.s, bt * bt);
  float* dp = detail::sized(sc.dp, bt * bt);
  float* dk = detail::sized(sc.dk, bt * hs);
  float* dv = detail::sized(sc.dv, bt * hs);
  for (std::int64_t b = 0; b < B; ++b) {
    const E* x = qkv + b * T * 3 * C;
    E* dx = dqkv + b * T * 3 * C;
    for (std::int64_t h = 0; h < NH; ++h) {
      detail::head_qkv_to_float(q, k, v, x, T, C, hs, h);
      detail::head_rows_to_float(dob, dout + b * T * C + h * hs, T, hs, C);
      const float* lse_h = lse + (b * NH + h) * T;
      float* d = delta + (b * NH + h) * T;
      for (std::int64_t t = 0; t < T; ++t) {
        const E* o = out + (b * T + t) * C + h * hs;
        float sum = 0.0f;
        for (std::int64_t i = 0; i < hs; ++i) sum += dob[t * hs + i] * convert<float>(o[i]);
        d[t] = sum;
      }
      std::fill(dq, dq + T * hs, 0.0f);
      for (std::int64_t j0 = 0; j0 < T; j0 += bt) {
        const std::int64_t cols = std::min(bt, T - j0);
        std::fill(dk, dk + cols * hs, 0.0f);
        std::fill(dv, dv + cols * hs, 0.0f);
        for (std::int64_t i0 = j0; i0 < T; i0 += bt) {  // query tiles on and below the diagonal
          const std::int64_t rows = std::min(bt, T - i0);
          gemm(ctx, Trans::none, Trans::transpose, rows, cols, hs, scale, q + i0 * hs, hs,
               k + j0 * hs, hs, 0.0f, p, bt);
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::int64_t n = detail::visible_keys(i0 + r, j0, cols);
            float* pr = p + r * bt;
            for (std::int64_t c = 0; c < n; ++c) pr[c] = detail::exp_poly(pr[c] - lse_h[i0 + r]);
            for (std::int64_t c = n; c < cols; ++c) pr[c] = 0.0f;
          }
          // dV += Pᵀ dO;  dP = dO Vᵀ
          gemm(ctx, Trans::transpose, Trans::none, cols, hs, rows, 1.0f, p, bt, dob + i0 * hs, hs,
               1.0f, dv, hs);
          gemm(ctx, Trans::none, Trans::transpose, rows, cols, hs, 1.0f, dob + i0 * hs, hs,
               v + j0 * hs, hs, 0.0f, dp, bt);
          // dS = P ∘ (dP − D), in dp
          for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t c = 0; c < cols; ++c) {
              dp[r * bt + c] = p[r * bt + c] * (dp[r * bt + c] - d[i0 + r]);
            }
          }
          // dK += scale·dSᵀ Q;  dQ += scale·dS K
          gemm(ctx, Trans::transpose, Trans::none, cols, hs, rows, scale, dp, bt, q + i0 * hs, hs,
               1.0f, dk, hs);
          gemm(ctx, Trans::none, Trans::none, rows, hs, cols, scale, dp, bt, k + j0 * hs, hs, 1.0f,
               dq + i0 * hs, hs);
        }
        detail::head_rows_from_float(dx + j0 * 3 * C + C + h * hs, dk, cols, hs, 3 * C);
        detail::head_rows_from_float(dx + j0 * 3 * C + 2 * C + h * hs, dv, cols, hs, 3 * C);
      }
      detail::head_rows_from_float(dx + h * hs, dq, T, hs, 3 * C);
    }
  }
}

}  // namespace fourway::host
