//! Host element-wise kernels: residual add, tanh-GELU forward and backward, and the precision
//! helpers (cast, scale in place, inf/NaN detection, sum of squares for the global L2 norm).
//!
//! GELU is GPT-2's tanh approximation, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
//! (Hendrycks & Gimpel 2016). Outputs and activation gradients are written (`=`), never
//! accumulated. `sum_squares` accumulates in double, so the norm of a billion fp32 values keeps
//! its digits; `has_inf_nan` looks at the bits, so it works on all three element types alike.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

namespace detail {
inline constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float gelu_cubic = 0.044715f;

/// gelu(x) in its sigmoid form: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), one exp and one divide.
inline float gelu(float x) {
  const float u = gelu_scale * (x + gelu_cubic * x * x * x);
  return x / (1.0f + exp_poly(-2.0f * u));
}
/// d gelu / dx = sig + 2 x sig (1 - sig) u', with sig = 1 / (1 + exp(-2u)).
inline float gelu_grad(float x) {
  const float u = gelu_scale * (x + gelu_cubic * x * x * x);
  const float sig = 1.0f / (1.0f + exp_poly(-2.0f * u));
  const float du = gelu_scale * (1.0f + 3.0f * gelu_cubic * x * x);
  return sig + 2.0f * x * sig * (1.0f - sig) * du;
}
}  // namespace detail

/// out = a + b over n elements (out may alias a or b).
template <floating_dtype T>
void residual_forward(const Context<Host>& /*ctx*/, T* out, const T* a, const T* b,
                      std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = convert<T>(convert<float>(a[i]) + convert<float>(b[i]));
  }
}

/// out = gelu(in) over n elements.
template <floating_dtype T>
void gelu_forward(const Context<Host>& /*ctx*/, T* out, const T* in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = convert<T>(detail::gelu(convert<float>(in[i])));
}

/// din = gelu'(in) * dout over n elements (din may alias dout).
template <floating_dtype T>
void gelu_backward(const Context<Host>& /*ctx*/, T* din, const T* in, const T* dout,
                   std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    din[i] = convert<T>(detail::gelu_grad(convert<float>(in[i])) * convert<float>(dout[i]));
  }
}

/// dst = src converted (round to nearest even) over n elements.
/// The x86 F16C instructions convert 8 values at once with the same round-to-nearest-even and
/// NaN quieting as `convert` (the software conversion does not vectorise).
template <floating_dtype To, floating_dtype From>
void cast(const Context<Host>& /*ctx*/, To* dst, const From* src, std::int64_t n) {
  std::int64_t vectorised = 0;
#if defined(__F16C__)
  if constexpr (std::is_same_v<To, fp16> && std::is_same_v<From, float>) {
    vectorised = n / 8 * 8;
    for (std::int64_t i = 0; i < vectorised; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
  } else if constexpr (std::is_same_v<To, float> && std::is_same_v<From, fp16>) {
    vectorised = n / 8 * 8;
    for (std::int64_t i = 0; i < vectorised; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
  }
#endif
  for (std::int64_t i = vectorised; i < n; ++i) dst[i] = convert<To>(convert<float>(src[i]));
}

/// p *= s over n elements.
template <floating_dtype T>
void scale(const Context<Host>& /*ctx*/, T* p, std::int64_t n, float s) {
  for (std::int64_t i = 0; i < n; ++i) p[i] = convert<T>(convert<float>(p[i]) * s);
}

/// True when any of the n elements is an infinity or a NaN.
template <floating_dtype T>
bool has_inf_nan(const Context<Host>& /*ctx*/, const T* p, std::int64_t n) {
  bool found = false;
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      found |= (std::bit_cast<std::uint32_t>(p[i]) & 0x7f800000u) == 0x7f800000u;
    } else if constexpr (std::is_same_v<T, bf16>) {
      found |= (p[i].bits & 0x7f80u) == 0x7f80u;
    } else {
      found |= (p[i].bits & 0x7c00u) == 0x7c00u;
    }
  }
  return found;
}

/// Sum of p[i]^2 over n elements, accumulated in double.
template <floating_dtype T>
double sum_squares(const Context<Host>& /*ctx*/, const T* p, std::int64_t n) {
  return detail::sum_lanes<double>(n, [p](std::int64_t i) {
    const double x = convert<float>(p[i]);
    return x * x;
  });
}

}  // namespace fourway::host
