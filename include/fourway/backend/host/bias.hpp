//! Host bias kernels: add a per-column bias to every row, and reduce its gradient over rows.
//!
//! `bias_add` updates `out` in place (it follows a GEMM that wrote `out`); `bias_backward`
//! accumulates (`+=`) into `dbias`, as every parameter gradient does. Column sums are fp32
//! whatever the element type, and are added to `dbias` once.
#pragma once

#include <cstdint>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

/// out[r, c] += bias[c] for out (rows, cols), bias (cols).
template <floating_dtype T>
void bias_add(const Context<Host>& /*ctx*/, T* out, const T* bias, std::int64_t rows,
              std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* o = out + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      o[c] = convert<T>(convert<float>(o[c]) + convert<float>(bias[c]));
    }
  }
}

/// dbias[c] += sum_r dout[r, c] for dout (rows, cols), dbias (cols).
template <floating_dtype T>
void bias_backward(const Context<Host>& /*ctx*/, T* dbias, const T* dout, std::int64_t rows,
                   std::int64_t cols) {
  std::vector<float> sum(static_cast<std::size_t>(cols), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* d = dout + r * cols;
    for (std::int64_t c = 0; c < cols; ++c) sum[c] += convert<float>(d[c]);
  }
  for (std::int64_t c = 0; c < cols; ++c) dbias[c] = convert<T>(convert<float>(dbias[c]) + sum[c]);
}

}  // namespace fourway::host
