//! Host SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"), the gated feed-forward
//! activation of Llama: each input row of 2F holds [gate | up], the output row of F is
//! `silu(gate) · up`, `silu(g) = g · σ(g)`. In fp32 for every element type; outputs and input
//! gradients are written (`=`).
#pragma once

#include <cmath>
#include <cstdint>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

namespace detail {
/// σ(g) = 1 / (1 + e^−g); exp overflows to inf for g < −88, giving exactly 0 (no NaN).
inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }
}  // namespace detail

/// out (rows, F) = silu(in[:, :F]) · in[:, F:], in (rows, 2F).
template <floating_dtype T>
void swiglu_forward(const Context<Host>& /*ctx*/, T* out, const T* in, std::int64_t rows,
                    std::int64_t F) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* gate = in + r * 2 * F;
    const T* up = gate + F;
    T* o = out + r * F;
    for (std::int64_t c = 0; c < F; ++c) {
      const float g = convert<float>(gate[c]);
      o[c] = convert<T>(g * detail::sigmoid(g) * convert<float>(up[c]));
    }
  }
}

/// din (rows, 2F) = [dgate | dup] from dout (rows, F) and the forward's input:
/// dgate = dout·up·σ(g)·(1 + g·(1 − σ(g))), dup = dout·silu(g).
template <floating_dtype T>
void swiglu_backward(const Context<Host>& /*ctx*/, T* din, const T* dout, const T* in,
                     std::int64_t rows, std::int64_t F) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* gate = in + r * 2 * F;
    const T* up = gate + F;
    const T* dy = dout + r * F;
    T* dgate = din + r * 2 * F;
    T* dup = dgate + F;
    for (std::int64_t c = 0; c < F; ++c) {
      const float g = convert<float>(gate[c]);
      const float u = convert<float>(up[c]);
      const float d = convert<float>(dy[c]);
      const float sig = detail::sigmoid(g);
      dgate[c] = convert<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
      dup[c] = convert<T>(d * g * sig);
    }
  }
}

}  // namespace fourway::host
