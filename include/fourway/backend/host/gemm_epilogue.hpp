//! Host GEMMs with an epilogue, twins of `cuda/gemm_epilogue.cuh`:
//!
//!   gemm_bias   c = op(A)·op(B) + bias                            (pre_gelu null)
//!               pre_gelu = op(A)·op(B) + bias, c = gelu(pre_gelu)
//!   gemm_bgrad  c += op(A)·op(B), dbias += Σ over the k rows of B   (a weight gradient and its
//!                                                                  bias's: B is the output grad)
//!   gemm_dgelu  c = gelu'(pre_gelu) ⊙ (op(A)·op(B)), dbias += Σ over c's rows (dbias optional)
//!
//! row-major, C (m, n) with leading dimension ldc (pre_gelu too), bias and dbias (n). Each is
//! exactly the unfused sequence — `gemm`, the bias added (or its gradient reduced by
//! `bias_backward`) row by row, `gelu_forward` / `gelu_backward` — so a layer that calls it gives
//! the host results it gave before, bit for bit; the CUDA twin does the same arithmetic in one
//! cuBLASLt call (rounding once where the host rounds after each step).
#pragma once

#include <cstdint>

#include "fourway/backend/gemm_types.hpp"
#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/bias.hpp"
#include "fourway/backend/host/elementwise.hpp"
#include "fourway/backend/host/gemm.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

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

/// c (m, n) += op(A)·op(B) and dbias (n) += the column sums of B (k, n), which must be stored
/// untransposed and dense (ldb = n): a weight gradient Xᵀ·dY and its bias's Σ_rows dY.
template <floating_dtype T>
void gemm_bgrad(const Context<Host>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c,
                std::int64_t ldc, T* dbias) {
  fourway::detail::check_bgrad_operand(tb, k, n, ldb);
  gemm(ctx, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
  bias_backward(ctx, dbias, b, k, n);
}

/// c (m, n) = gelu'(pre_gelu) ⊙ (op(A)·op(B)) — the gradient of GELU's input from its output's
/// — and, when `dbias` is given, dbias (n) += Σ over c's rows (c dense: ldc = n).
template <floating_dtype T>
void gemm_dgelu(const Context<Host>& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                std::int64_t k, const T* a, std::int64_t lda, const T* b, std::int64_t ldb,
                const T* pre_gelu, T* c, std::int64_t ldc, T* dbias = nullptr) {
  fourway::detail::check_dgelu_output(dbias, n, ldc);
  gemm(ctx, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
  for (std::int64_t r = 0; r < m; ++r) {
    gelu_backward(ctx, c + r * ldc, pre_gelu + r * ldc, c + r * ldc, n);
  }
  if (dbias != nullptr) bias_backward(ctx, dbias, c, m, n);
}

}  // namespace fourway::host
