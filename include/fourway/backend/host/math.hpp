//! Scalar float functions the host kernels use in their inner loops: exp and tanh.
//!
//! They are branch-free (clamps, a polynomial and an exponent shift) so the compiler vectorises
//! the loops that call them; the libm versions would keep those loops scalar. `exp_poly` is
//! Cephes' `expf` (range reduction by ln 2 split in two parts, degree-6 polynomial), accurate to
//! about 2 ulp for x in [-87, 88]; outside it saturates (about 1e-38 below, 1.6e38 above) — callers never
//! feed it masked-out entries. The CUDA kernels use the device's `expf`/`tanhf`, so host and
//! device agree to a few ulp, never bitwise.
#pragma once

#include <bit>
#include <cstdint>

#include "fourway/config.hpp"

namespace fourway::host::detail {

inline float exp_poly(float x) {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f;  // exactly representable: n * ln2_hi has no rounding
  constexpr float ln2_lo = -2.12194440e-4f;
  x = x > 88.0f ? 88.0f : x;  // keeps 2^n finite (n <= 127)
  x = x < -87.3365447504f ? -87.3365447504f : x;
  const float n = static_cast<float>(static_cast<std::int32_t>(x * log2e + (x >= 0 ? 0.5f : -0.5f)));
  const float r = x - n * ln2_hi - n * ln2_lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const auto e = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  return y * std::bit_cast<float>(e);
}

/// tanh(x) = 1 - 2 / (exp(2x) + 1); absolute error below 1e-7, exact limits +-1.
inline float tanh_poly(float x) { return 1.0f - 2.0f / (exp_poly(2.0f * x) + 1.0f); }

}  // namespace fourway::host::detail
