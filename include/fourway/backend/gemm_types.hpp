//! Types shared by the host and CUDA GEMMs: the transpose flag.
//!
//! All matrices are row-major. `Trans::transpose` means the operand is stored transposed, so
//! `op(A)` of shape (m, k) is read from a (k, m) array with leading dimension `lda >= m`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

enum class Trans : std::uint8_t { none, transpose };

namespace detail {
/// The accumulator type of C: fp32, or the operands' type (fp32 or 16-bit).
template <class T, class TC>
concept gemm_output = std::is_same_v<TC, float> || std::is_same_v<TC, T>;

/// Columns of the stored array behind `op(X)` of shape (rows, cols): the minimum leading dimension.
constexpr std::int64_t stored_cols(Trans t, std::int64_t rows, std::int64_t cols) {
  return t == Trans::none ? cols : rows;
}
/// Rows of the stored array behind `op(X)` of shape (rows, cols).
constexpr std::int64_t stored_rows(Trans t, std::int64_t rows, std::int64_t cols) {
  return t == Trans::none ? rows : cols;
}

/// Throws ShapeError unless the sizes are >= 0 and each leading dimension covers its rows.
inline void check_gemm_args(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                            std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
  check<ShapeError>(m >= 0 && n >= 0 && k >= 0, "fourway: gemm sizes must be >= 0, got m=", m,
                    " n=", n, " k=", k);
  const std::int64_t min_lda = std::max<std::int64_t>(1, stored_cols(ta, m, k));
  const std::int64_t min_ldb = std::max<std::int64_t>(1, stored_cols(tb, k, n));
  check<ShapeError>(lda >= min_lda, "fourway: gemm lda=", lda, " is below ", min_lda,
                    " (the row length of the stored A for m=", m, ", k=", k,
                    ta == Trans::none ? ", not transposed)" : ", transposed)");
  check<ShapeError>(ldb >= min_ldb, "fourway: gemm ldb=", ldb, " is below ", min_ldb,
                    " (the row length of the stored B for k=", k, ", n=", n,
                    tb == Trans::none ? ", not transposed)" : ", transposed)");
  check<ShapeError>(ldc >= std::max<std::int64_t>(1, n), "fourway: gemm ldc=", ldc,
                    " is below n=", n);
}

/// Throws ShapeError unless B of a bias-gradient GEMM (`gemm_bgrad`) is the dense, untransposed
/// (k, n) output gradient whose column sums are the bias gradient.
inline void check_bgrad_operand(Trans tb, std::int64_t k, std::int64_t n, std::int64_t ldb) {
  check<ShapeError>(tb == Trans::none && ldb == n,
                    "fourway: gemm_bgrad reduces the bias gradient over B's rows: B must be the "
                    "dense (k, n) = (",
                    k, ", ", n, ") output gradient, got ",
                    tb == Trans::none ? "untransposed" : "transposed", " with ldb ", ldb);
}

/// gemm_dgelu's bias gradient sums the rows of C, which must then be dense (ldc = n): both
/// backends' check.
template <class T>
void check_dgelu_output(const T* dbias, std::int64_t n, std::int64_t ldc) {
  check<ShapeError>(dbias == nullptr || ldc == n,
                    "fourway: gemm_dgelu's bias gradient reduces a "
                    "dense C: ldc ",
                    ldc, " for ", n, " columns");
}
}  // namespace detail

}  // namespace fourway
