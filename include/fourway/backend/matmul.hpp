//! Named GEMMs over matrix views, so that the products of a layer read as their math:
//! ```
//!   matmul(ctx, Y, X, W);             // Y  = X·W
//!   matmul(ctx, dX, dY, W.t());       // dX = dY·Wᵀ
//!   matmul_add(ctx, dW, X.t(), dY);   // dW += Xᵀ·dY
//! ```
//! A `Matrix<T>` is a row-major (rows, cols) array with leading dimension `ld >= cols`; `.t()` is
//! the same array read as its transpose (cols, rows). `matmul` and `matmul_add` check that the
//! shapes agree (a ShapeError names them) and then make exactly one `Ops<B>::gemm` call whose
//! m, n, k, transposes and leading dimensions are read off the views — the call a hand-written
//! GEMM would make, so results are bitwise those of `Ops<B>::gemm` on both backends.
//! Only the operand layout is described here; the element types and the fp32 accumulation are
//! the backend GEMM's (backend/host/gemm.hpp, backend/cuda/gemm.cuh).
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "fourway/backend/gemm_types.hpp"
#include "fourway/backend/ops.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

/// A (rows, cols) operand: `data` holds it row-major with leading dimension `ld`, or, when
/// `trans` is Trans::transpose, holds its transpose (cols, rows) with leading dimension `ld`.
template <class T>
struct Matrix {
  T* data;
  std::int64_t rows;
  std::int64_t cols;
  std::int64_t ld;
  Trans trans = Trans::none;

  /// The same storage read as the (cols, rows) transpose.
  [[nodiscard]] Matrix t() const {
    return Matrix{data, cols, rows, ld, trans == Trans::none ? Trans::transpose : Trans::none};
  }
};

/// The dense row-major (rows, cols) matrix at `data` (leading dimension `cols`).
template <class T>
Matrix<T> matrix(T* data, std::int64_t rows, std::int64_t cols) {
  return Matrix<T>{data, rows, cols, cols};
}
/// The (rows, cols) matrix at `data` whose rows are `ld` elements apart (a column block of a
/// wider array, e.g. one head of a fused q|k|v).
template <class T>
Matrix<T> matrix(T* data, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return Matrix<T>{data, rows, cols, ld};
}
/// A tensor (..., n) as the matrix (product of the leading extents, n).
template <class T, class B>
Matrix<T> matrix(const Tensor<T, B>& t) {
  const Shape& s = t.shape();
  check<ShapeError>(s.rank() >= 1, "fourway: a rank-0 tensor is not a matrix");
  std::int64_t rows = 1;
  for (int i = 0; i + 1 < s.rank(); ++i) rows *= s[i];
  return matrix(t.data(), rows, s[s.rank() - 1]);
}

namespace detail {
template <class TA, class TB, class TC>
concept matmul_operands =
    std::same_as<std::remove_const_t<TA>, std::remove_const_t<TB>> && !std::is_const_v<TC>;

template <class TA, class TB, class TC>
void check_matmul(const Matrix<TC>& c, const Matrix<TA>& a, const Matrix<TB>& b) {
  check<ShapeError>(c.trans == Trans::none,
                    "fourway: matmul writes a row-major output; pass the output untransposed "
                    "(swap the operands and transpose them instead: Cᵀ = Bᵀ·Aᵀ)");
  check<ShapeError>(a.cols == b.rows, "fourway: matmul (", a.rows, ", ", a.cols, ") · (", b.rows,
                    ", ", b.cols, "): the inner sizes ", a.cols, " and ", b.rows, " differ");
  check<ShapeError>(c.rows == a.rows && c.cols == b.cols, "fourway: matmul (", a.rows, ", ", a.cols,
                    ") · (", b.rows, ", ", b.cols, ") is (", a.rows, ", ", b.cols,
                    "), the output is (", c.rows, ", ", c.cols, ")");
}
}  // namespace detail

/// C = alpha·A·B (C is not read).
template <class B, class TA, class TB, class TC>
requires detail::matmul_operands<TA, TB, TC>
void matmul(const Context<B>& ctx, Matrix<TC> c, Matrix<TA> a, Matrix<TB> b, float alpha = 1.0f) {
  detail::check_matmul(c, a, b);
  Ops<B>::gemm(ctx, a.trans, b.trans, c.rows, c.cols, a.cols, alpha, a.data, a.ld, b.data, b.ld,
               0.0f, c.data, c.ld);
}

/// C += alpha·A·B.
/// c = a·b + bias (bias: c.cols values), or with `pre_gelu` (c's shape and leading dimension):
/// pre_gelu = a·b + bias and c = gelu(pre_gelu) — one call, cuBLASLt's epilogue on CUDA
/// (backend/cuda/gemm_epilogue.cuh), the unfused sequence on the host.
template <class B, class TA, class TB, class TC>
requires detail::matmul_operands<TA, TB, TC>
void matmul_bias(const Context<B>& ctx, Matrix<TC> c, Matrix<TA> a, Matrix<TB> b, const TC* bias,
                 TC* pre_gelu = nullptr) {
  detail::check_matmul(c, a, b);
  Ops<B>::gemm_bias(ctx, a.trans, b.trans, c.rows, c.cols, a.cols, a.data, a.ld, b.data, b.ld, bias,
                    c.data, c.ld, pre_gelu);
}

template <class B, class TA, class TB, class TC>
requires detail::matmul_operands<TA, TB, TC>
void matmul_add(const Context<B>& ctx, Matrix<TC> c, Matrix<TA> a, Matrix<TB> b,
                float alpha = 1.0f) {
  detail::check_matmul(c, a, b);
  Ops<B>::gemm(ctx, a.trans, b.trans, c.rows, c.cols, a.cols, alpha, a.data, a.ld, b.data, b.ld,
               1.0f, c.data, c.ld);
}

/// C += A·B and dbias += the column sums of B, the dense untransposed output gradient: a weight
/// gradient Xᵀ·dY and its bias's Σ_rows dY in one call (`gemm_bgrad`: cuBLASLt's BGRAD epilogue
/// on CUDA, the unfused `gemm` + `bias_backward` on the host).
template <class B, class TA, class TB, class TC>
requires detail::matmul_operands<TA, TB, TC>
void matmul_add_bias_grad(const Context<B>& ctx, Matrix<TC> c, Matrix<TA> a, Matrix<TB> b,
                          TC* dbias) {
  detail::check_matmul(c, a, b);
  Ops<B>::gemm_bgrad(ctx, a.trans, b.trans, c.rows, c.cols, a.cols, a.data, a.ld, b.data, b.ld,
                     c.data, c.ld, dbias);
}

/// C = gelu'(pre_gelu) ⊙ (A·B) — GELU's input gradient from the product that gives its output's —
/// and, with `dbias`, dbias += Σ_rows C (`gemm_dgelu`: cuBLASLt's DGELU(_BGRAD) epilogue on CUDA,
/// the unfused `gemm` + `gelu_backward` (+ `bias_backward`) on the host). pre_gelu has C's shape
/// and leading dimension.
template <class B, class TA, class TB, class TC>
requires detail::matmul_operands<TA, TB, TC>
void matmul_dgelu(const Context<B>& ctx, Matrix<TC> c, Matrix<TA> a, Matrix<TB> b,
                  const TC* pre_gelu, TC* dbias = nullptr) {
  detail::check_matmul(c, a, b);
  Ops<B>::gemm_dgelu(ctx, a.trans, b.trans, c.rows, c.cols, a.cols, a.data, a.ld, b.data, b.ld,
                     pre_gelu, c.data, c.ld, dbias);
}

}  // namespace fourway
