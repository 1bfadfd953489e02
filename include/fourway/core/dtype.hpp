//! Element types: fp32 (`float`), and the 16-bit `fp16` (IEEE binary16) and `bf16` (bfloat16).
//!
//! The 16-bit types are two-byte structs usable in host code, with round-to-nearest-even
//! conversion from float (NaN stays NaN, overflow goes to infinity, fp16 subnormals are exact).
//! In device code `native_t<fp16>` is `__half` and `native_t<bf16>` is `__nv_bfloat16`; both have
//! the same size and bit layout, so buffers are shared by reinterpretation.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "fourway/config.hpp"

#if defined(FOURWAY_CUDA_COMPILATION)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace fourway {

namespace detail {
FOURWAY_HOST_DEVICE constexpr std::uint32_t float_bits(float f) {
#if defined(FOURWAY_DEVICE_CODE)
  return __float_as_uint(f);
#else
  return std::bit_cast<std::uint32_t>(f);
#endif
}
FOURWAY_HOST_DEVICE constexpr float bits_float(std::uint32_t u) {
#if defined(FOURWAY_DEVICE_CODE)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

/// float -> bfloat16 bits, round to nearest even; NaN is kept quiet and keeps its sign.
FOURWAY_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  const std::uint32_t bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + bias) >> 16);
}
FOURWAY_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t h) {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}

/// float -> IEEE half bits, round to nearest even, subnormals exact, overflow to infinity.
FOURWAY_HOST_DEVICE constexpr std::uint16_t float_to_fp16_bits(float f) {
  std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // infinity or NaN (NaN stays quiet, keeps its top payload bits)
    return static_cast<std::uint16_t>(sign | 0x7c00u |
                                      (x > 0x7f800000u ? (0x200u | ((x >> 13) & 0x3ffu)) : 0u));
  }
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 -> inf
  if (x < 0x38800000u) {  // below 2^-14: a half subnormal (or zero)
    if (x <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25 ties to zero
    const std::uint32_t e = x >> 23;
    const std::uint32_t m = (x & 0x7fffffu) | 0x800000u;  // value = m * 2^(e-150)
    const std::uint32_t shift = 126u - e;                 // in units of 2^-24
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t h = (((x >> 23) - 112u) << 10) | ((x & 0x7fffffu) >> 13);
  const std::uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach the exponent: fine
  return static_cast<std::uint16_t>(sign | h);
}
FOURWAY_HOST_DEVICE constexpr float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    std::uint32_t exp = 113;  // normalise the subnormal: value = m * 2^-24
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --exp;
    }
    return bits_float(sign | (exp << 23) | ((m & 0x3ffu) << 13));
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}
}  // namespace detail

/// bfloat16: 1 sign, 8 exponent, 7 mantissa bits.
struct bf16 {
  std::uint16_t bits = 0;
  bf16() = default;
  FOURWAY_HOST_DEVICE constexpr explicit bf16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  FOURWAY_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  FOURWAY_HOST_DEVICE constexpr explicit operator float() const {
    return detail::bf16_bits_to_float(bits);
  }
  /// Bitwise equality: NaN == NaN with the same bits, +0 != -0.
  friend FOURWAY_HOST_DEVICE constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

/// IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits.
struct fp16 {
  std::uint16_t bits = 0;
  fp16() = default;
  FOURWAY_HOST_DEVICE constexpr explicit fp16(float f) : bits(detail::float_to_fp16_bits(f)) {}
  FOURWAY_HOST_DEVICE static constexpr fp16 from_bits(std::uint16_t b) {
    fp16 r;
    r.bits = b;
    return r;
  }
  FOURWAY_HOST_DEVICE constexpr explicit operator float() const {
    return detail::fp16_bits_to_float(bits);
  }
  /// Bitwise equality: NaN == NaN with the same bits, +0 != -0.
  friend FOURWAY_HOST_DEVICE constexpr bool operator==(fp16 a, fp16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2 && std::is_trivially_copyable_v<bf16>);
using fp32 = float;

/// Any element type the library stores parameters, activations or gradients in.
template <class T>
concept floating_dtype =
    std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// Converts between float and any `floating_dtype` (identity for float).
template <class To, class From>
FOURWAY_HOST_DEVICE constexpr To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, float>) {
    return static_cast<float>(v);
  } else {
    return To(static_cast<float>(v));
  }
}

/// Runtime tag for a dtype (for messages, file formats and collectives).
enum class Dtype : std::uint8_t { f32, f16, bf16, f64, i32, i64, u8, u16 };

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr Dtype value = Dtype::f32;
};
template <>
struct dtype_of<fp16> {
  static constexpr Dtype value = Dtype::f16;
};
template <>
struct dtype_of<bf16> {
  static constexpr Dtype value = Dtype::bf16;
};
template <>
struct dtype_of<double> {
  static constexpr Dtype value = Dtype::f64;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr Dtype value = Dtype::i32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr Dtype value = Dtype::i64;
};
template <>
struct dtype_of<std::uint8_t> {
  static constexpr Dtype value = Dtype::u8;
};
template <>
struct dtype_of<std::uint16_t> {
  static constexpr Dtype value = Dtype::u16;
};
template <class T>
inline constexpr Dtype dtype_v = dtype_of<T>::value;

/// Any type a `Tensor` may hold: the types with a `dtype_of` (floating and integer).
template <class T>
concept element_type = requires {
  dtype_of<T>::value;
};

constexpr std::size_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::f64:
    case Dtype::i64: return 8;
    case Dtype::f32:
    case Dtype::i32: return 4;
    case Dtype::f16:
    case Dtype::bf16:
    case Dtype::u16: return 2;
    case Dtype::u8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(Dtype d) {
  switch (d) {
    case Dtype::f32: return "fp32";
    case Dtype::f16: return "fp16";
    case Dtype::bf16: return "bf16";
    case Dtype::f64: return "fp64";
    case Dtype::i32: return "int32";
    case Dtype::i64: return "int64";
    case Dtype::u8: return "uint8";
    case Dtype::u16: return "uint16";
  }
  return "?";
}

// The answer depends on the compilation mode: it lives in the mode's namespace (config.hpp).
FOURWAY_BEGIN_MODE_NAMESPACE

/// The type device code operates on: `__half` / `__nv_bfloat16` in CUDA builds, else the type.
template <class T>
struct native {
  using type = T;
};
#if defined(FOURWAY_CUDA_COMPILATION)
template <>
struct native<fp16> {
  using type = __half;
};
template <>
struct native<bf16> {
  using type = __nv_bfloat16;
};
static_assert(sizeof(__half) == sizeof(fp16) && sizeof(__nv_bfloat16) == sizeof(bf16));
#endif
template <class T>
using native_t = typename native<T>::type;
FOURWAY_END_MODE_NAMESPACE

}  // namespace fourway
