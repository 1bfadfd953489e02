//! The float building blocks of the host kernels' inner loops: exp, exp2, tanh, sqrt over a
//! block, sums / maxima with interleaved partial results, and a branch-free bf16 rounding.
//!
//! They exist so that the compiler vectorises the loops: libm's `expf`/`tanhf` are opaque calls,
//! `std::sqrt` carries an errno branch, and a plain `s += x[i]` is a serial dependency chain the
//! compiler may not reorder. `exp_poly`/`exp2_poly`/`tanh_poly` are branch-free (a
//! polynomial, an exponent shift, clamps). `sum_lanes` keeps 16 partial sums and combines
//! them pairwise — a fixed order, so results stay deterministic (and slightly more accurate than a
//! serial sum). `exp_poly` is Cephes' `expf` (range reduction by ln 2 split in two parts, degree-6
//! polynomial), accurate to about 2 ulp for x in [-87, 88]; outside it saturates (about 1e-38
//! below, 1.6e38 above) — callers never feed it masked-out entries. The CUDA kernels use the
//! device's `expf`/`tanhf`, so host and device agree to a few ulp, never bitwise.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "fourway/config.hpp"
#include "fourway/core/dtype.hpp"

#if defined(__SSE__)
#include <immintrin.h>
#endif

namespace fourway::host::detail {

inline float exp_poly(float x) {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f;  // exactly representable: n * ln2_hi has no rounding
  constexpr float ln2_lo = -2.12194440e-4f;
  x = x > 88.0f ? 88.0f : x;  // keeps 2^n finite (n <= 127)
  x = x < -87.3365447504f ? -87.3365447504f : x;
  const float n = std::nearbyint(x * log2e);  // round to nearest; a vectorisable rounding
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

/// |v| limited to `limit` (>= 0), sign kept, by an unsigned min on the bit pattern (magnitudes of
/// floats order like their bits). A float `?:` clamp would do, but GCC turns it into one code
/// path per clamp outcome (each with its own divide when a divide follows); this stays one
/// vector min. A NaN becomes +-limit: callers keep the NaN alive through another operand.
inline float clamp_magnitude(float v, float limit) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t mag = std::min(bits & 0x7fffffffu, std::bit_cast<std::uint32_t>(limit));
  return std::bit_cast<float>((bits & 0x80000000u) | mag);
}

/// 2^x for |x| <= 126 (callers clamp). x = n + f with n the nearest integer, found by adding
/// 1.5 * 2^23 (the sum's last bits are n, so no float -> int conversion), and f = x - n exact;
/// 2^f on [-1/2, 1/2] is Cephes' `exp2f` polynomial (relative error ~1.7e-7, about 2 ulp) and
/// 2^n goes straight into the exponent bits. Cheaper than `exp_poly` (no ln 2 reduction); for
/// e^t, fold log2(e) into t's own constants.
inline float exp2_poly(float x) {
  constexpr float round_shift = 12582912.0f;  // 1.5 * 2^23
  const float shifted = x + round_shift;
  const float f = x - (shifted - round_shift);
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  const std::uint32_t two_n = (std::bit_cast<std::uint32_t>(shifted) + 127u) << 23;
  return (p * f + 1.0f) * std::bit_cast<float>(two_n);
}

/// tanh(x) = 1 - 2 / (exp(2x) + 1); absolute error below 1e-7, exact limits +-1.
inline float tanh_poly(float x) { return 1.0f - 2.0f / (exp_poly(2.0f * x) + 1.0f); }

/// float -> bfloat16 bits, round to nearest even, for any `v` except a signalling NaN or a NaN
/// with non-zero low 16 bits; then it equals `bf16(v).bits`. Every NaN that arithmetic computes
/// from bf16 values and non-NaN constants qualifies: an operation returns one operand's NaN,
/// quieted, or the default NaN, and a bf16's low 16 bits are zero. Kernels pass their fp32
/// scalar arguments through `canonical_nan`. Dropping `bf16(v)`'s NaN select makes a bf16 GELU
/// loop a quarter faster.
inline std::uint16_t bf16_bits_rne(float v) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(v);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// convert<T>(v) for a v computed from T values only, fp32 scalars passed through
/// `canonical_nan` and non-NaN constants: for bf16 the branch-free `bf16_bits_rne`.
template <floating_dtype T>
T convert_computed(float v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16::from_bits(bf16_bits_rne(v));
  } else {
    return convert<T>(v);
  }
}

/// v, or the default quiet NaN (low 16 bits zero) when v is a NaN: for fp32 scalars that feed a
/// result rounded with `bf16_bits_rne`.
inline float canonical_nan(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::quiet_NaN() : v;
}

/// x[i] = sqrt(x[i]) for i in [0, n), correctly rounded (IEEE), with vector instructions where
/// the target has them.
inline void sqrt_block(float* x, std::int64_t n) {
  std::int64_t i = 0;
#if defined(__AVX__)  // also on AVX-512: 256-bit sqrt keeps up with memory, 512-bit gains nothing
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#elif defined(__SSE__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

inline constexpr int lanes = 16;

/// Sum of f(i) over i in [0, n): 16 interleaved partial sums, combined pairwise, then the tail.
template <class Acc = float, class F>
Acc sum_lanes(std::int64_t n, F&& f) {
  Acc acc[lanes] = {};
  const std::int64_t full = n / lanes * lanes;
  for (std::int64_t i = 0; i < full; i += lanes) {
    for (int l = 0; l < lanes; ++l) acc[l] += f(i + l);
  }
  for (int w = lanes / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  Acc tail = 0;
  for (std::int64_t i = full; i < n; ++i) tail += f(i);
  return acc[0] + tail;
}

/// The two sums of f(i) = {a, b} over i in [0, n) in one pass, each added in `sum_lanes`' order.
template <class F>
std::pair<float, float> sum2_lanes(std::int64_t n, F&& f) {
  float a[lanes] = {}, b[lanes] = {};
  const std::int64_t full = n / lanes * lanes;
  for (std::int64_t i = 0; i < full; i += lanes) {
    for (int l = 0; l < lanes; ++l) {
      const std::pair<float, float> v = f(i + l);
      a[l] += v.first;
      b[l] += v.second;
    }
  }
  for (int w = lanes / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) {
      a[l] += a[l + w];
      b[l] += b[l + w];
    }
  }
  float ta = 0, tb = 0;
  for (std::int64_t i = full; i < n; ++i) {
    const std::pair<float, float> v = f(i);
    ta += v.first;
    tb += v.second;
  }
  return {a[0] + ta, b[0] + tb};
}

/// Max of f(i) over i in [0, n) (-3.4e38 for n = 0), with 16 interleaved partial maxima.
template <class F>
float max_lanes(std::int64_t n, F&& f) {
  float acc[lanes];
  for (float& a : acc) a = -3.4e38f;
  const std::int64_t full = n / lanes * lanes;
  for (std::int64_t i = 0; i < full; i += lanes) {
    for (int l = 0; l < lanes; ++l) {
      const float v = f(i + l);
      acc[l] = v > acc[l] ? v : acc[l];
    }
  }
  for (std::int64_t i = full; i < n; ++i) {
    const float v = f(i);
    acc[0] = v > acc[0] ? v : acc[0];
  }
  float mx = acc[0];
  for (int l = 1; l < lanes; ++l) mx = acc[l] > mx ? acc[l] : mx;
  return mx;
}

}  // namespace fourway::host::detail
