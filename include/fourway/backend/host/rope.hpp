//! Host rotary position embedding (Su et al. 2021, RoFormer), in place, in the "rotate half"
//! convention of GPT-NeoX and Hugging Face Llama.
//!
//! Row r (0 ≤ r < rows) starts at `x + r·row_stride` and holds `heads` consecutive heads of
//! `head_size` elements; its position is `t = first_position + r % seq` (rows are (batch, time)
//! flattened; `first_position` > 0 for a run of rows in the middle of the sequence, as a context-
//! parallel rank holds). In
//! each head, element i of the first half pairs with element i + head_size/2 and the pair turns
//! by the angle `t · inv_freq[i]`, `inv_freq[i] = 1 / theta^(2i/head_size)` (fp32, as HF):
//! `a' = a·cos − b·sin`, `b' = b·cos + a·sin`. The backward applies the transpose (the turn by
//! −angle) to the gradient. The strided rows let one call rotate the q and k heads of a packed
//! q|k|v buffer (`heads = 2·NH`, `row_stride = 3·C`) and leave v alone.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway::host {

namespace detail {
/// Checks the rope arguments (`who` names the kernel) and returns the inverse frequencies,
/// `1 / theta^(2i/head_size)` for i in [0, head_size/2), computed in fp32 as HF Llama does.
inline std::vector<float> rope_inv_freq(std::int64_t rows, std::int64_t seq,
                                        std::int64_t row_stride, std::int64_t heads,
                                        std::int64_t head_size, float theta, const char* who,
                                        std::int64_t first_position = 0) {
  check<ShapeError>(head_size > 0 && head_size % 2 == 0, "fourway: ", who,
                    " needs an even head_size > 0, got head_size=", head_size);
  check<ShapeError>(
      rows >= 0 && seq > 0 && heads > 0 && row_stride >= heads * head_size, "fourway: ", who,
      " needs rows >= 0, seq > 0, heads > 0 and row_stride >= ", "heads*head_size, got rows=", rows,
      " seq=", seq, " heads=", heads, " head_size=", head_size, " row_stride=", row_stride);
  check<ShapeError>(first_position >= 0, "fourway: ", who, " needs first_position >= 0, got ",
                    first_position);
  std::vector<float> f(static_cast<std::size_t>(head_size / 2));
  for (std::int64_t i = 0; i < head_size / 2; ++i) {
    f[static_cast<std::size_t>(i)] =
        1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(head_size));
  }
  return f;
}

/// Turns every (a, b) pair of x by the angle t·inv_freq[i] (sign = +1, forward) or by its
/// negative (sign = -1, the transpose, backward).
template <class T>
void rope_apply(T* x, std::int64_t rows, std::int64_t seq, std::int64_t row_stride,
                std::int64_t heads, std::int64_t head_size, const std::vector<float>& inv_freq,
                float sign, std::int64_t first_position) {
  const std::int64_t half = head_size / 2;
  std::vector<float> cs(static_cast<std::size_t>(half)), sn(cs.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    const float t = static_cast<float>(first_position + r % seq);
    for (std::int64_t i = 0; i < half; ++i) {
      const float angle = t * inv_freq[static_cast<std::size_t>(i)];
      cs[static_cast<std::size_t>(i)] = std::cos(angle);
      sn[static_cast<std::size_t>(i)] = sign * std::sin(angle);
    }
    for (std::int64_t h = 0; h < heads; ++h) {
      T* p = x + r * row_stride + h * head_size;
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = convert<float>(p[i]);
        const float b = convert<float>(p[i + half]);
        const float c = cs[static_cast<std::size_t>(i)], s = sn[static_cast<std::size_t>(i)];
        p[i] = convert<T>(a * c - b * s);
        p[i + half] = convert<T>(b * c + a * s);
      }
    }
  }
}
}  // namespace detail

/// x (rows, row_stride) rotated in place: the first heads·head_size elements of each row, head
/// by head, at position t = first_position + r % seq (see the file comment).
template <floating_dtype T>
void rope_forward(const Context<Host>& /*ctx*/, T* x, std::int64_t rows, std::int64_t seq,
                  std::int64_t row_stride, std::int64_t heads, std::int64_t head_size, float theta,
                  std::int64_t first_position = 0) {
  const auto f = detail::rope_inv_freq(rows, seq, row_stride, heads, head_size, theta,
                                       "rope_forward", first_position);
  detail::rope_apply(x, rows, seq, row_stride, heads, head_size, f, 1.0f, first_position);
}

/// dx in place: the gradient through rope_forward (the transpose rotation),
/// da = ga·cos + gb·sin, db = gb·cos − ga·sin.
template <floating_dtype T>
void rope_backward(const Context<Host>& /*ctx*/, T* dx, std::int64_t rows, std::int64_t seq,
                   std::int64_t row_stride, std::int64_t heads, std::int64_t head_size, float theta,
                   std::int64_t first_position = 0) {
  const auto f = detail::rope_inv_freq(rows, seq, row_stride, heads, head_size, theta,
                                       "rope_backward", first_position);
  detail::rope_apply(dx, rows, seq, row_stride, heads, head_size, f, -1.0f, first_position);
}

}  // namespace fourway::host
