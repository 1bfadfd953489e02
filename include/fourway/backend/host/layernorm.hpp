//! Host LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), forward and backward.
//!
//! Forward saves per-row `mean` and `rstd = 1/sqrt(var + eps)` (fp32, biased variance, as
//! PyTorch) for the backward. Backward writes `din` (`=`) and accumulates `dweight`, `dbias`
//! (`+=`); their row sums are fp32 and reach the parameter gradient once. Forward reads each
//! row three times (mean, centred variance, output) rather than using one E[x^2] - E[x]^2 pass,
//! whose cancellation would cost digits; bf16 rows are read in place, not copied to fp32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/elementwise.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

namespace detail {
/// `p[0, n)` as fp32: `p` itself for float, else `buf` holding the converted values (16-bit
/// rows are converted once instead of once per pass).
template <class T>
const float* as_float(const T* p, std::int64_t n, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return p;
  } else {
    buf.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) buf[i] = convert<float>(p[i]);
    return buf.data();
  }
}

/// row[c] as fp32 through a callable: float and bf16 rows are read in place (widening a bf16 is
/// a shift, which vectorises), fp16 rows are converted into buf once.
template <class T>
auto row_reader(const T* row, std::int64_t C, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, fp16>) {
    const float* p = as_float(row, C, buf);
    return [p](std::int64_t c) { return p[c]; };
  } else {
    return [row](std::int64_t c) { return convert<float>(row[c]); };
  }
}

}  // namespace detail

/// out (rows, C) = (in - mean) * rstd * weight + bias; mean, rstd (rows) fp32.
template <floating_dtype T>
void layernorm_forward(const Context<Host>& /*ctx*/, T* out, float* mean, float* rstd, const T* in,
                       const T* weight, const T* bias, std::int64_t rows, std::int64_t C,
                       float eps) {
  std::vector<float> xbuf, wbuf, bbuf;
  const float* w = detail::as_float(weight, C, wbuf);
  const float* b = detail::as_float(bias, C, bbuf);
  eps = detail::canonical_nan(eps);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto x = detail::row_reader(in + r * C, C, xbuf);
    const float m = detail::sum_lanes(C, x) / static_cast<float>(C);
    const float var = detail::sum_lanes(C, [&x, m](std::int64_t c) {
      const float d = x(c) - m;
      return d * d;
    });
    const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
    T* o = out + r * C;
    for (std::int64_t c = 0; c < C; ++c) {
      o[c] = detail::convert_computed<T>((x(c) - m) * s * w[c] + b[c]);
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

/// The residual add and the LayerNorm after it in one pass over the rows: r (rows, C) = a + b,
/// rounded to T, then out = layernorm(r) exactly as `layernorm_forward` computes it from the
/// stored r. A transformer block's `x + attn`, then ln_2. Blocks of rows stay in cache between
/// the two steps (the CUDA twin reads a and b once and r only from registers' row).
template <floating_dtype T>
void residual_layernorm_forward(const Context<Host>& ctx, T* r, T* out, float* mean, float* rstd,
                                const T* a, const T* b, const T* weight, const T* bias,
                                std::int64_t rows, std::int64_t C, float eps) {
  constexpr std::int64_t block = 16;
  for (std::int64_t r0 = 0; r0 < rows; r0 += block) {
    const std::int64_t n = std::min(block, rows - r0);
    residual_forward(ctx, r + r0 * C, a + r0 * C, b + r0 * C, n * C);
    layernorm_forward(ctx, out + r0 * C, mean + r0, rstd + r0, r + r0 * C, weight, bias, n, C, eps);
  }
}

/// din (rows, C) =, dweight (C) +=, dbias (C) += from dout (rows, C) and the saved mean, rstd.
/// With `dresid` (rows, C), din is that plus the residual branch's gradient: exactly
/// `residual_forward(din, din, dresid)` after it (the CUDA twin adds it before rounding, in the
/// same pass).
template <floating_dtype T>
void layernorm_backward(const Context<Host>& ctx, T* din, T* dweight, T* dbias, const T* dout,
                        const T* in, const T* weight, const float* mean, const float* rstd,
                        std::int64_t rows, std::int64_t C, const T* dresid = nullptr) {
  std::vector<float> dw(static_cast<std::size_t>(C), 0.0f);
  std::vector<float> db(static_cast<std::size_t>(C), 0.0f);
  std::vector<float> xbuf, gbuf, wbuf;
  const float* w = detail::as_float(weight, C, wbuf);
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto x = detail::row_reader(in + r * C, C, xbuf);
    const auto dy = detail::row_reader(dout + r * C, C, gbuf);
    const float m = detail::canonical_nan(mean[r]);
    const float s = detail::canonical_nan(rstd[r]);
    for (std::int64_t c = 0; c < C; ++c) {
      db[c] += dy(c);
      dw[c] += (x(c) - m) * s * dy(c);
    }
    const auto [sum_g, sum_g_norm] = detail::sum2_lanes(C, [&](std::int64_t c) {
      const float g = w[c] * dy(c);
      return std::pair<float, float>(g, g * (x(c) - m) * s);
    });
    const float dnorm_mean = inv_c * sum_g;
    const float dnorm_norm_mean = inv_c * sum_g_norm;
    T* dx = din + r * C;
    for (std::int64_t c = 0; c < C; ++c) {
      const float norm = (x(c) - m) * s;
      dx[c] = detail::convert_computed<T>((w[c] * dy(c) - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
  }
  for (std::int64_t c = 0; c < C; ++c) {
    dweight[c] = convert<T>(convert<float>(dweight[c]) + dw[c]);
    dbias[c] = convert<T>(convert<float>(dbias[c]) + db[c]);
  }
  if (dresid != nullptr) residual_forward(ctx, din, din, dresid, rows * C);
}

}  // namespace fourway::host
