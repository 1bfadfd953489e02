//! Gradient clipping by global L2 norm, with the semantics of PyTorch's
//! `torch.nn.utils.clip_grad_norm_`:
//!
//!   norm = sqrt(sum over all gradient elements of g^2)
//!   coef = min(max_norm / (norm + 1e-6), 1)        every gradient *= coef
//!
//! The norm is global: in a parallel run every rank contributes the sum of squares of the
//! gradient elements it owns and the sums are all-reduced before the square root (the strategy
//! does that; this header is the arithmetic). Sums are accumulated in double. `max_norm <= 0`
//! disables clipping (coefficient 1). A non-finite norm gives a NaN coefficient, as in PyTorch,
//! so an overflow is never clipped into something that looks finite.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "fourway/backend/ops.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

/// PyTorch's `clip_grad_norm_` epsilon.
inline constexpr double clip_epsilon = 1e-6;

/// The factor gradients are multiplied by, from the global norm `norm`.
[[nodiscard]] inline float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  if (!std::isfinite(norm)) return std::numeric_limits<float>::quiet_NaN();
  const double coef = max_norm / (norm + clip_epsilon);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

/// Sum of squares of every gradient of `model` (parameters visited with `visit_parameters`).
template <class Model, class B>
[[nodiscard]] double grad_sum_squares(const Context<B>& ctx, Model& model) {
  double total = 0.0;
  model.visit_parameters(
      [&](auto& p) { total += Ops<B>::sum_squares(ctx, p.grad.data(), p.grad.numel()); });
  return total;
}

/// Clips the gradients of `model` in place to global norm `max_norm` (the one-rank version of
/// `clip_grad_norm_`); returns the norm before clipping.
template <class Model, class B>
double clip_grad_norm(const Context<B>& ctx, Model& model, double max_norm) {
  const double norm = std::sqrt(grad_sum_squares(ctx, model));
  const float coef = clip_coefficient(norm, max_norm);
  if (coef != 1.0f) {
    model.visit_parameters(
        [&](auto& p) { Ops<B>::scale(ctx, p.grad.data(), p.grad.numel(), coef); });
  }
  return norm;
}

}  // namespace fourway
