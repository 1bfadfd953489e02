//! Shape: up to `Shape::max_rank` extents of a contiguous row-major tensor.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "fourway/core/error.hpp"

namespace fourway {

/// "(d0, d1, ...)": how messages print extents (Shape::str, checkpoint shapes).
inline std::string dims_string(std::span<const std::int64_t> dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

class Shape {
 public:
  static constexpr int max_rank = 6;

  constexpr Shape() = default;
  constexpr Shape(std::initializer_list<std::int64_t> dims) {
    if (dims.size() > static_cast<std::size_t>(max_rank)) {
      throw ShapeError(
          detail::cat("fourway: a Shape holds at most ", max_rank, " dims, got ", dims.size()));
    }
    for (std::int64_t d : dims) {
      if (d < 0) throw ShapeError(detail::cat("fourway: negative extent ", d, " in a Shape"));
      dims_[rank_++] = d;
    }
  }

  [[nodiscard]] constexpr int rank() const { return rank_; }
  [[nodiscard]] constexpr std::int64_t operator[](int i) const { return dims_[i]; }
  [[nodiscard]] constexpr std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  /// Row-major stride of dimension `i` in elements.
  [[nodiscard]] constexpr std::int64_t stride(int i) const {
    std::int64_t s = 1;
    for (int j = i + 1; j < rank_; ++j) s *= dims_[j];
    return s;
  }
  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i) {
      if (a.dims_[i] != b.dims_[i]) return false;
    }
    return true;
  }
  [[nodiscard]] std::string str() const {
    return dims_string(
        std::span<const std::int64_t>(dims_.data(), static_cast<std::size_t>(rank_)));
  }

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

}  // namespace fourway
