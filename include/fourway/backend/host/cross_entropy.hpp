//! Host fused softmax + cross-entropy over the vocabulary, and its vocabulary-sharded pieces.
//!
//! `losses[r] = logsumexp(logits[r]) - logits[r][targets[r]]` (fp32). The backward writes
//! `dlogits = dloss * (softmax - onehot)` and may run in place on `logits` (each row is read
//! whole before it is written). `dloss` is one scalar for all rows (e.g. 1 / rows for a mean).
//!
//! Vocabulary-parallel form (Megatron-LM, Shoeybi et al. 2019): rank i holds the columns
//! `[vocab_start, vocab_start + Vlocal)`. Per row, with all-reduces between the steps:
//! ```
//!   vocab_local_max     -> all-reduce MAX -> maxes
//!   vocab_local_sumexp  -> all-reduce SUM -> sumexp        (relative to the global max)
//!   vocab_target_logit  -> all-reduce SUM -> target_logit  (0 where the target is elsewhere)
//!   vocab_loss(maxes, sumexp, target_logit)                -> losses (same on every rank)
//!   vocab_local_grad(maxes, sumexp)                        -> this shard's dlogits
//! ```
//! Targets must lie in [0, V) (unsharded) — a bad target is a ShapeError, not a silent zero.
//!
//! A padded vocabulary (the LM head of a model whose wte has Vp >= V rows, the padding zero):
//! the unsharded pair takes the row stride `ld` = Vp and reads only the first V columns of each
//! row, so the padded logits are masked out of the softmax exactly; the backward writes 0 to
//! columns [V, ld), so nothing flows into the padding rows of wte.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway::host {

namespace detail {
template <class T>
float row_max(const T* x, std::int64_t n) {
  return max_lanes(n, [x](std::int64_t c) { return convert<float>(x[c]); });
}
template <class T>
float row_sumexp(const T* x, std::int64_t n, float mx) {
  return sum_lanes(n, [x, mx](std::int64_t c) { return exp_poly(convert<float>(x[c]) - mx); });
}
/// dlogits[0, n) = dloss * (exp(x - mx) / sum - [c == target_local]); in place allowed.
template <class T>
void row_softmax_grad(T* dx, const T* x, std::int64_t n, float mx, float sum,
                      std::int64_t target_local, float dloss) {
  const float inv = 1.0f / sum;
  for (std::int64_t c = 0; c < n; ++c) {
    const float pr = exp_poly(convert<float>(x[c]) - mx) * inv;
    dx[c] = convert<T>(dloss * (pr - (c == target_local ? 1.0f : 0.0f)));
  }
}
/// The row stride of a logits buffer: `ld`, or V when ld is 0; never below V.
inline std::int64_t row_stride(std::int64_t V, std::int64_t ld) {
  if (ld == 0) return V;
  check<ShapeError>(ld >= V, "fourway: cross-entropy row stride ld=", ld, " is below V=", V,
                    "; pass ld >= V (a padded vocabulary) or 0");
  return ld;
}

inline void check_target(std::int32_t t, std::int64_t r, std::int64_t V) {
  check<ShapeError>(t >= 0 && t < V, "fourway: target ", t, " of row ", r,
                    " is outside the vocabulary [0, ", V, ")");
}
}  // namespace detail

/// losses (rows) = -log softmax(logits (rows, V))[targets].
template <floating_dtype T>
void cross_entropy_forward(const Context<Host>& /*ctx*/, float* losses, const T* logits,
                           const std::int32_t* targets, std::int64_t rows, std::int64_t V,
                           std::int64_t ld = 0) {
  ld = detail::row_stride(V, ld);
  for (std::int64_t r = 0; r < rows; ++r) {
    detail::check_target(targets[r], r, V);
    const T* x = logits + r * ld;
    const float mx = detail::row_max(x, V);
    const float sum = detail::row_sumexp(x, V, mx);
    losses[r] = std::log(sum) + mx - convert<float>(x[targets[r]]);
  }
}

/// dlogits (rows, V) = dloss * (softmax(logits) - onehot(targets)); dlogits may alias logits.
/// With a row stride ld > V (a padded vocabulary), columns [V, ld) of dlogits are set to 0.
template <floating_dtype T>
void cross_entropy_backward(const Context<Host>& /*ctx*/, T* dlogits, const T* logits,
                            const std::int32_t* targets, std::int64_t rows, std::int64_t V,
                            float dloss, std::int64_t ld = 0) {
  ld = detail::row_stride(V, ld);
  for (std::int64_t r = 0; r < rows; ++r) {
    detail::check_target(targets[r], r, V);
    const T* x = logits + r * ld;
    const float mx = detail::row_max(x, V);
    const float sum = detail::row_sumexp(x, V, mx);
    detail::row_softmax_grad(dlogits + r * ld, x, V, mx, sum, targets[r], dloss);
    std::fill(dlogits + r * ld + V, dlogits + (r + 1) * ld, convert<T>(0.0f));
  }
}

/// maxes (rows) = max over this shard's logits (rows, Vlocal).
template <floating_dtype T>
void vocab_local_max(const Context<Host>& /*ctx*/, float* maxes, const T* logits, std::int64_t rows,
                     std::int64_t Vlocal) {
  for (std::int64_t r = 0; r < rows; ++r) maxes[r] = detail::row_max(logits + r * Vlocal, Vlocal);
}

/// sumexp (rows) = sum over this shard of exp(logit - maxes[r]) (maxes: the global maxima).
template <floating_dtype T>
void vocab_local_sumexp(const Context<Host>& /*ctx*/, float* sumexp, const T* logits,
                        const float* maxes, std::int64_t rows, std::int64_t Vlocal) {
  for (std::int64_t r = 0; r < rows; ++r) {
    sumexp[r] = detail::row_sumexp(logits + r * Vlocal, Vlocal, maxes[r]);
  }
}

/// target_logits (rows) = logits[r][targets[r] - vocab_start] if the target is in this shard,
/// else 0 (so a SUM all-reduce gives the target's logit everywhere).
template <floating_dtype T>
void vocab_target_logit(const Context<Host>& /*ctx*/, float* target_logits, const T* logits,
                        const std::int32_t* targets, std::int64_t rows, std::int64_t Vlocal,
                        std::int64_t vocab_start) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = targets[r] - vocab_start;
    target_logits[r] = (t >= 0 && t < Vlocal) ? convert<float>(logits[r * Vlocal + t]) : 0.0f;
  }
}

/// losses (rows) = log(sumexp) + maxes - target_logits, from the all-reduced pieces.
inline void vocab_loss(const Context<Host>& /*ctx*/, float* losses, const float* maxes,
                       const float* sumexp, const float* target_logits, std::int64_t rows) {
  for (std::int64_t r = 0; r < rows; ++r) {
    losses[r] = std::log(sumexp[r]) + maxes[r] - target_logits[r];
  }
}

/// dlogits (rows, Vlocal) = dloss * (softmax - onehot) on this shard, from the global maxes and
/// sumexp; dlogits may alias logits.
template <floating_dtype T>
void vocab_local_grad(const Context<Host>& /*ctx*/, T* dlogits, const T* logits,
                      const std::int32_t* targets, const float* maxes, const float* sumexp,
                      std::int64_t rows, std::int64_t Vlocal, std::int64_t vocab_start,
                      float dloss) {
  for (std::int64_t r = 0; r < rows; ++r) {
    detail::row_softmax_grad(dlogits + r * Vlocal, logits + r * Vlocal, Vlocal, maxes[r], sumexp[r],
                             targets[r] - vocab_start, dloss);
  }
}

}  // namespace fourway::host
