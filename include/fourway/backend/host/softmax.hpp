//! Host row softmax, forward and backward.
//!
//! Forward subtracts the row maximum before exponentiating (no overflow for any finite input).
//! Backward needs only the forward output: `din = out * (dout - sum_j dout_j out_j)`; `din` may
//! alias `dout`.
#pragma once

#include <cstdint>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

namespace detail {
/// out[0, cols) = softmax(scale * in[0, cols)); the arithmetic of every softmax on the host.
template <class TO, class TI>
void softmax_row(TO* out, const TI* in, std::int64_t cols, float scale) {
  const float mx = max_lanes(cols, [&](std::int64_t c) { return scale * convert<float>(in[c]); });
  const float sum =
      sum_lanes(cols, [&](std::int64_t c) { return exp_poly(scale * convert<float>(in[c]) - mx); });
  const float inv = 1.0f / sum;
  for (std::int64_t c = 0; c < cols; ++c) {
    out[c] = convert<TO>(exp_poly(scale * convert<float>(in[c]) - mx) * inv);
  }
}
/// din[0, cols) = out * (dout - <dout, out>), scaled by `scale`.
template <class T>
void softmax_backward_row(T* din, const T* out, const T* dout, std::int64_t cols, float scale) {
  const float dot = sum_lanes(
      cols, [&](std::int64_t c) { return convert<float>(dout[c]) * convert<float>(out[c]); });
  for (std::int64_t c = 0; c < cols; ++c) {
    din[c] = convert<T>(scale * convert<float>(out[c]) * (convert<float>(dout[c]) - dot));
  }
}
}  // namespace detail

/// out (rows, cols) = softmax of each row of in (rows, cols); out may alias in.
template <floating_dtype T>
void softmax_forward(const Context<Host>& /*ctx*/, T* out, const T* in, std::int64_t rows,
                     std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    detail::softmax_row(out + r * cols, in + r * cols, cols, 1.0f);
}

/// din (rows, cols) = out * (dout - rowsum(dout * out)).
template <floating_dtype T>
void softmax_backward(const Context<Host>& /*ctx*/, T* din, const T* out, const T* dout,
                      std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    detail::softmax_backward_row(din + r * cols, out + r * cols, dout + r * cols, cols, 1.0f);
  }
}

}  // namespace fourway::host
