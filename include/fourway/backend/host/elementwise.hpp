//! Host element-wise kernels: residual add, tanh-GELU forward and backward, and the precision
//! helpers (cast, scale in place, inf/NaN detection, sum of squares for the global L2 norm) and
//! the two step reductions that stay in backend memory (`sum_squares_into` over a list of
//! tensors, `sum_into` for the loss).
//!
//! GELU is GPT-2's tanh approximation, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
//! (Hendrycks & Gimpel 2016), computed in fp32 for every element type; a 16-bit result is that
//! fp32 value rounded, bit for bit (docs/kernels.md has the measured error). Outputs and
//! activation gradients are written (`=`), never accumulated. `sum_squares` accumulates in double,
//! so the norm of a billion fp32 values keeps its digits; `has_inf_nan` looks at the bits, so it
//! works on all three element types alike.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

namespace detail {
inline constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float gelu_cubic = 0.044715f;
// -2 sqrt(2/pi) log2(e) and its product with 0.044715: exp(-2u) = 2^(x (a + b x^2)), rounded once
inline constexpr float gelu_exp2_a =
    static_cast<float>(-2.0 * 0.7978845608028654 * 1.4426950408889634);
inline constexpr float gelu_exp2_b =
    static_cast<float>(-2.0 * 0.7978845608028654 * 0.044715 * 1.4426950408889634);

/// exp(-2u) with u = sqrt(2/pi) (x + 0.044715 x^3), as 2^(x (a + b x^2)); the exponent is
/// clamped to +-126, where gelu is already x or 0 to fp32 precision.
inline float gelu_exp(float x) {
  return exp2_poly(clamp_magnitude(x * (gelu_exp2_a + gelu_exp2_b * x * x), 126.0f));
}
/// gelu(x) in its sigmoid form: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), one exp2 and one divide
/// (no cancellation for negative x, unlike 1 + tanh).
inline float gelu(float x) { return x / (1.0f + gelu_exp(x)); }
/// d gelu / dx = sig + 2 x sig (1 - sig) u', with sig = 1 / (1 + e), 1 - sig = e sig.
inline float gelu_grad(float x) {
  const float e = gelu_exp(x);
  const float sig = 1.0f / (1.0f + e);
  const float du = gelu_scale * (1.0f + 3.0f * gelu_cubic * x * x);
  return sig + 2.0f * x * sig * (e * sig) * du;  // e * sig first: e alone may be 2^126
}

/// fp16 kernels convert blocks of this many values with `cast` (F16C where the target has it;
/// the scalar fp16 conversion branches and does not vectorise) and compute in fp32 between.
inline constexpr std::int64_t fp16_block = 256;

/// Sum of p[i]^2 over n elements in double, in `sum_lanes`' fixed order.
template <class T>
double squares(const T* p, std::int64_t n) {
  return sum_lanes<double>(n, [p](std::int64_t i) {
    const double x = convert<float>(p[i]);
    return x * x;
  });
}

/// out[i] = bf16(f(float(src[i])...)) for i in [0, n): two bf16 values are read as one 32-bit
/// word, the first widened by `w << 16`, the second by `w & 0xffff0000` — no shuffles, so the
/// loop vectorises over plain 32-bit lanes (pmovzx / pack cost a fifth of a GELU otherwise).
/// f sees only bf16 values, so its NaNs fit `bf16_bits_rne`. out may alias a source.
template <class F, class... Src>
void map_bf16_pairs(bf16* out, std::int64_t n, F f, const Src*... src) {
  static_assert((std::is_same_v<Src, bf16> && ...));
  const auto word = [](const bf16* p) {
    std::uint32_t w;
    std::memcpy(&w, p, sizeof w);
    return w;
  };
  std::int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const std::uint32_t first = bf16_bits_rne(f(std::bit_cast<float>(word(src + i) << 16)...));
    const std::uint32_t second =
        bf16_bits_rne(f(std::bit_cast<float>(word(src + i) & 0xffff0000u)...));
    const std::uint32_t packed = first | second << 16;
    std::memcpy(static_cast<void*>(out + i), &packed, sizeof packed);
  }
  if (i < n) out[i] = bf16::from_bits(bf16_bits_rne(f(convert<float>(src[i])...)));
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

/// out = gelu(in) over n elements.
template <floating_dtype T>
void gelu_forward(const Context<Host>& ctx, T* out, const T* in, std::int64_t n) {
  const auto gelu = [](float x) { return detail::gelu(x); };
  if constexpr (std::is_same_v<T, bf16>) {
    detail::map_bf16_pairs(out, n, gelu, in);
  } else if constexpr (std::is_same_v<T, fp16>) {
    float x[detail::fp16_block];
    for (std::int64_t i = 0; i < n; i += detail::fp16_block) {
      const std::int64_t m = std::min(n - i, detail::fp16_block);
      cast(ctx, x, in + i, m);
      for (std::int64_t j = 0; j < m; ++j) x[j] = gelu(x[j]);
      cast(ctx, out + i, x, m);
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = gelu(in[i]);
  }
}

/// din = gelu'(in) * dout over n elements (din may alias dout).
template <floating_dtype T>
void gelu_backward(const Context<Host>& ctx, T* din, const T* in, const T* dout, std::int64_t n) {
  const auto chain = [](float x, float dy) { return detail::gelu_grad(x) * dy; };
  if constexpr (std::is_same_v<T, bf16>) {
    detail::map_bf16_pairs(din, n, chain, in, dout);
  } else if constexpr (std::is_same_v<T, fp16>) {
    float x[detail::fp16_block], dy[detail::fp16_block];
    for (std::int64_t i = 0; i < n; i += detail::fp16_block) {
      const std::int64_t m = std::min(n - i, detail::fp16_block);
      cast(ctx, x, in + i, m);
      cast(ctx, dy, dout + i, m);
      for (std::int64_t j = 0; j < m; ++j) dy[j] = chain(x[j], dy[j]);
      cast(ctx, din + i, dy, m);
    }
  } else {
    for (std::int64_t i = 0; i < n; ++i) din[i] = chain(in[i], dout[i]);
  }
}

/// p *= s over n elements.
template <floating_dtype T>
void scale(const Context<Host>& /*ctx*/, T* p, std::int64_t n, float s) {
  for (std::int64_t i = 0; i < n; ++i) p[i] = convert<T>(convert<float>(p[i]) * s);
}

/// True when any of the n elements is an infinity or a NaN (a value for the host: counted as a
/// synchronising call, as on the device).
template <floating_dtype T>
bool has_inf_nan(const Context<Host>& ctx, const T* p, std::int64_t n) {
  ctx.note_sync("has_inf_nan (a value read back)");
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

/// Sum of p[i]^2 over n elements, accumulated in double (a value for the host: counted as a
/// synchronising call, as on the device).
template <floating_dtype T>
double sum_squares(const Context<Host>& ctx, const T* p, std::int64_t n) {
  ctx.note_sync("sum_squares (a value read back)");
  return detail::squares(p, n);
}

/// *acc += sum over the list of every element squared, in double, tensor by tensor in list order
/// (each tensor's sum as `sum_squares` forms it). acc is backend memory: nothing returns to the
/// host, so a step's gradient norm costs no synchronisation until its scalars are read. An
/// infinity or NaN anywhere makes *acc non-finite, which is how the fp16 step detects overflow.
template <floating_dtype T>
void sum_squares_into(const Context<Host>& /*ctx*/, double* acc,
                      const std::vector<std::span<const T>>& list) {
  double total = 0.0;
  for (const auto& t : list)
    total += detail::squares(t.data(), static_cast<std::int64_t>(t.size()));
  *acc += total;
}

/// *acc += scale * sum of x[0, n), in double; acc is backend memory (the step's loss sum, kept
/// on the device until the step's scalars are read).
template <floating_dtype T>
void sum_into(const Context<Host>& /*ctx*/, double* acc, const T* x, std::int64_t n, double scale) {
  *acc += scale * detail::sum_lanes<double>(
                      n, [x](std::int64_t i) { return static_cast<double>(convert<float>(x[i])); });
}

}  // namespace fourway::host
