//! Host RMSNorm over the last dimension (Zhang & Sennrich 2019), forward and backward.
//!
//! `out = x · rstd · weight` with `rstd = 1/sqrt(mean_c(x²) + eps)` per row, saved (fp32) for
//! the backward. No centring and no bias, as in Llama. Backward writes `din` (`=`) and
//! accumulates `dweight` (`+=`): its row sums are fp32 and reach the parameter gradient once,
//! as in `layernorm_backward`. Rows are read in place (fp16 converted once per row).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/layernorm.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

/// out (rows, C) = in · rstd · weight; rstd (rows) fp32 = 1/sqrt(mean(in²) + eps).
template <floating_dtype T>
void rmsnorm_forward(const Context<Host>& /*ctx*/, T* out, float* rstd, const T* in,
                     const T* weight, std::int64_t rows, std::int64_t C, float eps) {
  std::vector<float> xbuf, wbuf;
  const float* w = detail::as_float(weight, C, wbuf);
  eps = detail::canonical_nan(eps);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto x = detail::row_reader(in + r * C, C, xbuf);
    const float ss = detail::sum_lanes(C, [&x](std::int64_t c) { return x(c) * x(c); });
    const float s = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    T* o = out + r * C;
    for (std::int64_t c = 0; c < C; ++c) o[c] = detail::convert_computed<T>(x(c) * s * w[c]);
    rstd[r] = s;
  }
}

/// din (rows, C) =, dweight (C) += from dout (rows, C) and the saved rstd:
/// din = rstd · (w·dy − x · rstd² · mean_c(w·dy·x)), dweight[c] += Σ_r dy · x · rstd.
template <floating_dtype T>
void rmsnorm_backward(const Context<Host>& /*ctx*/, T* din, T* dweight, const T* dout, const T* in,
                      const T* weight, const float* rstd, std::int64_t rows, std::int64_t C) {
  std::vector<float> dw(static_cast<std::size_t>(C), 0.0f);
  std::vector<float> xbuf, gbuf, wbuf;
  const float* w = detail::as_float(weight, C, wbuf);
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto x = detail::row_reader(in + r * C, C, xbuf);
    const auto dy = detail::row_reader(dout + r * C, C, gbuf);
    const float s = detail::canonical_nan(rstd[r]);
    for (std::int64_t c = 0; c < C; ++c) dw[c] += dy(c) * x(c) * s;
    const float dot = detail::sum_lanes(C, [&](std::int64_t c) { return w[c] * dy(c) * x(c); });
    const float k = dot * inv_c * s * s;
    T* dx = din + r * C;
    for (std::int64_t c = 0; c < C; ++c) {
      dx[c] = detail::convert_computed<T>((w[c] * dy(c) - x(c) * k) * s);
    }
  }
  for (std::int64_t c = 0; c < C; ++c) {
    dweight[c] = convert<T>(convert<float>(dweight[c]) + dw[c]);
  }
}

}  // namespace fourway::host
