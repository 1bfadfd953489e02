//! Host GEMM with a bias (and GELU) epilogue, twin of `cuda/gemm_epilogue.cuh`:
//!
//!   c = op(A)·op(B) + bias                     (pre_gelu null)
//!   pre_gelu = op(A)·op(B) + bias, c = gelu(pre_gelu)
//!
//! row-major, C (m, n) with leading dimension ldc (pre_gelu too), bias (n). It is exactly the
//! unfused sequence — `gemm`, the bias added row by row, `gelu_forward` — so a layer that calls it
//! gives the host results it gave before, bit for bit; the CUDA twin does the same arithmetic in
//! one cuBLASLt call (rounding once where the host rounds after each step).
#pragma once

#include <cstdint>

#include "fourway/backend/gemm_types.hpp"
#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/elementwise.hpp"
#include "fourway/backend/host/gemm.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

template <floating_dtype T>
void gemm_bias(const Context<Host>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
               std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
               const T* bias, T* c, std::int64_t ldc, T* pre_gelu = nullptr) {
  T* y = pre_gelu != nullptr ? pre_gelu : c;
  gemm(ctx, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, y, ldc);
  for (std::int64_t r = 0; r < m; ++r) {
    T* row = y + r * ldc;
    for (std::int64_t j = 0; j < n; ++j) {
      row[j] = convert<T>(convert<float>(row[j]) + convert<float>(bias[j]));
    }
    if (pre_gelu != nullptr) gelu_forward(ctx, c + r * ldc, row, n);
  }
}

}  // namespace fourway::host
