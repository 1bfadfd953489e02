//! Host LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), forward and backward.
//!
//! Forward saves per-row `mean` and `rstd = 1/sqrt(var + eps)` (fp32, biased variance, as
//! PyTorch) for the backward. Backward writes `din` (`=`) and accumulates `dweight`, `dbias`
//! (`+=`); their row sums are fp32 and reach the parameter gradient once.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

/// out (rows, C) = (in - mean) * rstd * weight + bias; mean, rstd (rows) fp32.
template <floating_dtype T>
void layernorm_forward(const Context<Host>& /*ctx*/, T* out, float* mean, float* rstd, const T* in,
                       const T* weight, const T* bias, std::int64_t rows, std::int64_t C,
                       float eps) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * C;
    const float m = detail::sum_lanes(C, [x](std::int64_t c) { return convert<float>(x[c]); }) /
                    static_cast<float>(C);
    const float var = detail::sum_lanes(C, [x, m](std::int64_t c) {
      const float d = convert<float>(x[c]) - m;
      return d * d;
    });
    const float s = 1.0f / std::sqrt(var / static_cast<float>(C) + eps);
    T* o = out + r * C;
    for (std::int64_t c = 0; c < C; ++c) {
      o[c] = convert<T>((convert<float>(x[c]) - m) * s * convert<float>(weight[c]) +
                        convert<float>(bias[c]));
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

/// din (rows, C) =, dweight (C) +=, dbias (C) += from dout (rows, C) and the saved mean, rstd.
template <floating_dtype T>
void layernorm_backward(const Context<Host>& /*ctx*/, T* din, T* dweight, T* dbias, const T* dout,
                        const T* in, const T* weight, const float* mean, const float* rstd,
                        std::int64_t rows, std::int64_t C) {
  std::vector<float> dw(static_cast<std::size_t>(C), 0.0f);
  std::vector<float> db(static_cast<std::size_t>(C), 0.0f);
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * C;
    const T* dy = dout + r * C;
    const float m = mean[r];
    const float s = rstd[r];
    for (std::int64_t c = 0; c < C; ++c) {
      const float g = convert<float>(dy[c]);
      db[c] += g;
      dw[c] += (convert<float>(x[c]) - m) * s * g;
    }
    const float dnorm_mean = inv_c * detail::sum_lanes(C, [&](std::int64_t c) {
                               return convert<float>(weight[c]) * convert<float>(dy[c]);
                             });
    const float dnorm_norm_mean =
        inv_c * detail::sum_lanes(C, [&](std::int64_t c) {
          return convert<float>(weight[c]) * convert<float>(dy[c]) * (convert<float>(x[c]) - m) * s;
        });
    T* dx = din + r * C;
    for (std::int64_t c = 0; c < C; ++c) {
      const float norm = (convert<float>(x[c]) - m) * s;
      const float dnorm = convert<float>(weight[c]) * convert<float>(dy[c]);
      dx[c] = convert<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
  }
  for (std::int64_t c = 0; c < C; ++c) {
    dweight[c] = convert<T>(convert<float>(dweight[c]) + dw[c]);
    dbias[c] = convert<T>(convert<float>(dbias[c]) + db[c]);
  }
}

}  // namespace fourway::host
