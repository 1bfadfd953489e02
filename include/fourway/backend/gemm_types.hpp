//! Types shared by the host and CUDA GEMMs: the transpose flag.
//!
//! All matrices are row-major. `Trans::transpose` means the operand is stored transposed, so
//! `op(A)` of shape (m, k) is read from a (k, m) array with leading dimension `lda >= m`.
#pragma once

#include <cstdint>

#include "fourway/config.hpp"

namespace fourway {

enum class Trans : std::uint8_t { none, transpose };

namespace detail {
/// Columns of the stored array behind `op(X)` of shape (rows, cols): the minimum leading dimension.
constexpr std::int64_t stored_cols(Trans t, std::int64_t rows, std::int64_t cols) {
  return t == Trans::none ? cols : rows;
}
/// Rows of the stored array behind `op(X)` of shape (rows, cols).
constexpr std::int64_t stored_rows(Trans t, std::int64_t rows, std::int64_t cols) {
  return t == Trans::none ? rows : cols;
}
}  // namespace detail

}  // namespace fourway
