#include "fourway/core/dtype.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fw = fourway;

// The reference here never calls the code under test: 16-bit patterns are decoded field by field
// with std::ldexp in double, and rounding picks the nearer of the two bracketing representable
// values by comparing distances in double (ties to the even bit pattern).
namespace {

struct Format {
  int exp_bits;
  int man_bits;
  int bias;
};
constexpr Format kHalf{5, 10, 15};
constexpr Format kBfloat{8, 7, 127};

double decode(Format f, std::uint16_t bits) {
  const int sign = bits >> 15;
  const int e = (bits >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int m = bits & ((1 << f.man_bits) - 1);
  double v = 0;
  if (e == (1 << f.exp_bits) - 1) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>((1 << f.man_bits) + m), e - f.bias - f.man_bits);
  }
  return sign ? -v : v;
}

/// Positive finite values of the format in increasing order, then the value one step above the
/// largest finite one: that is where IEEE rounding sends overflow to infinity.
std::vector<double> positive_ladder(Format f) {
  std::vector<double> v;
  const int inf_bits = ((1 << f.exp_bits) - 1) << f.man_bits;
  for (int b = 0; b < inf_bits; ++b) v.push_back(decode(f, static_cast<std::uint16_t>(b)));
  v.push_back(std::ldexp(1.0, (1 << f.exp_bits) - 1 - f.bias));
  return v;
}

/// Round-to-nearest-even of a finite or infinite x into the format, as a bit pattern.
std::uint16_t round_reference(const std::vector<double>& ladder, double x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  const auto inf_bits = static_cast<std::uint16_t>(ladder.size() - 1);
  if (std::isinf(a) || a >= ladder.back()) return sign | inf_bits;
  const auto hi = std::upper_bound(ladder.begin(), ladder.end(), a) - ladder.begin();
  const auto lo = hi - 1;  // ladder[lo] <= a < ladder[hi]
  const double dlo = a - ladder[lo];
  const double dhi = ladder[hi] - a;
  std::uint16_t pick = 0;
  if (dlo < dhi) {
    pick = static_cast<std::uint16_t>(lo);
  } else if (dhi < dlo) {
    pick = static_cast<std::uint16_t>(hi);
  } else {
    pick = static_cast<std::uint16_t>((lo % 2 == 0) ? lo : hi);
  }
  return sign | pick;
}

template <class T>
std::uint16_t to_bits(float x) {
  return T(x).bits;
}

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

template <class T>
void check_decode_all(Format f) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float got = static_cast<float>(T::from_bits(bits));
    const double want = decode(f, bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "bits " << hex(b);
      ASSERT_EQ(std::signbit(got), (b & 0x8000) != 0) << "NaN sign, bits " << hex(b);
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << "bits " << hex(b);
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << "bits " << hex(b);
    }
  }
}

template <class T>
void check_round_trip_all() {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(T::from_bits(bits));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(static_cast<float>(T(f)))) << "bits " << hex(b);
    } else {
      ASSERT_EQ(to_bits<T>(f), bits) << "bits " << hex(b);
    }
  }
}

/// For every pair of adjacent representable values (both signs): the exact midpoint, the floats
/// just below and just above it, and both end points.
template <class T>
void check_rounding_at_midpoints(Format f) {
  const auto ladder = positive_ladder(f);
  int checked = 0;
  for (std::size_t i = 0; i + 1 < ladder.size(); ++i) {
    const double mid = (ladder[i] + ladder[i + 1]) / 2;
    const auto midf = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(midf), mid) << "midpoint not representable in float";
    const float probes[] = {static_cast<float>(ladder[i]), midf, std::nextafter(midf, 0.0f),
                            std::nextafter(midf, std::numeric_limits<float>::infinity())};
    for (float p : probes) {
      for (float x : {p, -p}) {
        const std::uint16_t want = round_reference(ladder, x);
        ASSERT_EQ(to_bits<T>(x), want)
            << "x = " << x << " (float bits " << hex(std::bit_cast<std::uint32_t>(x)) << ")";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 8 * 30000);
}

/// Uniformly random float bit patterns (all exponents, NaNs excluded) against the reference.
template <class T>
void check_rounding_random(Format f) {
  const auto ladder = positive_ladder(f);
  std::mt19937 rng(20261129);
  std::uniform_int_distribution<std::uint32_t> dist;
  for (int i = 0; i < 400000; ++i) {
    const float x = std::bit_cast<float>(dist(rng));
    if (std::isnan(x)) continue;
    ASSERT_EQ(to_bits<T>(x), round_reference(ladder, x))
        << "x = " << x << " (float bits " << hex(std::bit_cast<std::uint32_t>(x)) << ")";
  }
}

}  // namespace

TEST(Dtype, Fp16DecodesAll65536Patterns) { check_decode_all<fw::fp16>(kHalf); }
TEST(Dtype, Bf16DecodesAll65536Patterns) { check_decode_all<fw::bf16>(kBfloat); }

TEST(Dtype, Fp16RoundTripsAll65536Patterns) { check_round_trip_all<fw::fp16>(); }
TEST(Dtype, Bf16RoundTripsAll65536Patterns) { check_round_trip_all<fw::bf16>(); }

TEST(Dtype, Fp16RoundsToNearestEvenAtEveryMidpoint) {
  check_rounding_at_midpoints<fw::fp16>(kHalf);
}
TEST(Dtype, Bf16RoundsToNearestEvenAtEveryMidpoint) {
  check_rounding_at_midpoints<fw::bf16>(kBfloat);
}
TEST(Dtype, Fp16RoundsRandomFloats) { check_rounding_random<fw::fp16>(kHalf); }
TEST(Dtype, Bf16RoundsRandomFloats) { check_rounding_random<fw::bf16>(kBfloat); }

TEST(Dtype, Fp16SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float fmax = std::numeric_limits<float>::max();
  EXPECT_EQ(to_bits<fw::fp16>(inf), 0x7c00);
  EXPECT_EQ(to_bits<fw::fp16>(-inf), 0xfc00);
  EXPECT_EQ(to_bits<fw::fp16>(65504.0f), 0x7bff);  // largest finite half
  EXPECT_EQ(to_bits<fw::fp16>(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(to_bits<fw::fp16>(65520.0f), 0x7c00);  // tie between 65504 (odd) and 2^16: even
  EXPECT_EQ(to_bits<fw::fp16>(-65520.0f), 0xfc00);
  EXPECT_EQ(to_bits<fw::fp16>(fmax), 0x7c00);
  EXPECT_EQ(to_bits<fw::fp16>(-fmax), 0xfc00);
  EXPECT_EQ(to_bits<fw::fp16>(0.0f), 0x0000);
  EXPECT_EQ(to_bits<fw::fp16>(-0.0f), 0x8000);
  EXPECT_EQ(to_bits<fw::fp16>(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(to_bits<fw::fp16>(std::ldexp(1.0f, -25)), 0x0000);  // tie with 0: even
  EXPECT_EQ(to_bits<fw::fp16>(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(to_bits<fw::fp16>(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 ulp: tie to even (2)
  EXPECT_EQ(to_bits<fw::fp16>(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(to_bits<fw::fp16>(std::ldexp(1023.5f, -24)), 0x0400);  // carries into normal
  EXPECT_EQ(to_bits<fw::fp16>(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(to_bits<fw::fp16>(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(to_bits<fw::fp16>(1.0f), 0x3c00);
  EXPECT_EQ(to_bits<fw::fp16>(-2.0f), 0xc000);
}

TEST(Dtype, Bf16SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float fmax = std::numeric_limits<float>::max();
  EXPECT_EQ(to_bits<fw::bf16>(inf), 0x7f80);
  EXPECT_EQ(to_bits<fw::bf16>(-inf), 0xff80);
  EXPECT_EQ(to_bits<fw::bf16>(fmax), 0x7f80);  // above max bf16 + half ulp
  EXPECT_EQ(to_bits<fw::bf16>(std::bit_cast<float>(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(to_bits<fw::bf16>(std::bit_cast<float>(0x7f7f8000u)), 0x7f80);  // tie, odd: up
  EXPECT_EQ(to_bits<fw::bf16>(-0.0f), 0x8000);
  EXPECT_EQ(to_bits<fw::bf16>(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(to_bits<fw::bf16>(std::bit_cast<float>(0x00018000u)), 0x0002);  // tie: to even
  EXPECT_EQ(to_bits<fw::bf16>(std::bit_cast<float>(0x00008000u)), 0x0000);  // tie: to even
  EXPECT_EQ(to_bits<fw::bf16>(1.0f), 0x3f80);
  EXPECT_EQ(to_bits<fw::bf16>(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie: to even
  EXPECT_EQ(to_bits<fw::bf16>(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie: to even
}

TEST(Dtype, NanStaysNanWithItsSign) {
  const std::uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7f800100u,
                                0x7fffffffu, 0x7fa00000u, 0x7f802000u, 0x7f810000u};
  for (std::uint32_t n : nans) {
    for (std::uint32_t s : {0u, 0x80000000u}) {
      const float x = std::bit_cast<float>(n | s);
      ASSERT_TRUE(std::isnan(x));
      const float h = static_cast<float>(fw::fp16(x));
      const float b = static_cast<float>(fw::bf16(x));
      EXPECT_TRUE(std::isnan(h)) << hex(n | s);
      EXPECT_TRUE(std::isnan(b)) << hex(n | s);
      EXPECT_EQ(std::signbit(h), s != 0) << hex(n | s);
      EXPECT_EQ(std::signbit(b), s != 0) << hex(n | s);
      // A NaN whose payload sits only in bits that are cut off must not become infinity.
      EXPECT_NE(fw::fp16(x).bits & 0x7fff, 0x7c00) << hex(n | s);
      EXPECT_NE(fw::bf16(x).bits & 0x7fff, 0x7f80) << hex(n | s);
    }
  }
}

TEST(Dtype, ConversionsAreConstexpr) {
  static_assert(fw::bf16(1.0f).bits == 0x3f80);
  static_assert(fw::fp16(-2.0f).bits == 0xc000);
  static_assert(static_cast<float>(fw::fp16::from_bits(0x3555)) == 0.333251953125f);
  static_assert(fw::bf16::from_bits(0x7fc0) == fw::bf16::from_bits(0x7fc0));
  static_assert(!(fw::fp16(0.0f) == fw::fp16(-0.0f)));  // bitwise equality
  SUCCEED();
}

TEST(Dtype, ConvertGoesThroughFloat) {
  EXPECT_EQ(fw::convert<float>(fw::bf16(3.0f)), 3.0f);
  EXPECT_EQ(fw::convert<fw::fp16>(0.1f).bits, fw::fp16(0.1f).bits);
  EXPECT_EQ(fw::convert<float>(2.5f), 2.5f);
  // bf16 -> fp16 rounds 1 + 2^-7 (exact in both) unchanged, and 2^20 overflows fp16 to inf.
  EXPECT_EQ(fw::convert<fw::fp16>(fw::bf16(1.0078125f)).bits, 0x3c08);
  EXPECT_EQ(fw::convert<fw::fp16>(fw::bf16(1048576.0f)).bits, 0x7c00);
}

TEST(Dtype, RuntimeTags) {
  static_assert(fw::dtype_v<float> == fw::Dtype::f32);
  static_assert(fw::dtype_v<fw::fp16> == fw::Dtype::f16);
  static_assert(fw::dtype_v<fw::bf16> == fw::Dtype::bf16);
  static_assert(fw::dtype_v<std::int32_t> == fw::Dtype::i32);
  static_assert(fw::floating_dtype<fw::bf16> && !fw::floating_dtype<double>);
  static_assert(fw::element_type<std::int64_t> && !fw::element_type<char>);
  static_assert(std::is_same_v<fw::native_t<fw::bf16>, fw::bf16>);  // host build: no __nv types
  EXPECT_EQ(fw::dtype_size(fw::Dtype::f32), sizeof(float));
  EXPECT_EQ(fw::dtype_size(fw::Dtype::f16), sizeof(fw::fp16));
  EXPECT_EQ(fw::dtype_size(fw::Dtype::bf16), sizeof(fw::bf16));
  EXPECT_EQ(fw::dtype_size(fw::Dtype::f64), sizeof(double));
  EXPECT_EQ(fw::dtype_size(fw::Dtype::i64), sizeof(std::int64_t));
  EXPECT_EQ(fw::dtype_size(fw::Dtype::u8), 1u);
  EXPECT_EQ(fw::dtype_name(fw::Dtype::bf16), "bf16");
  EXPECT_EQ(fw::dtype_name(fw::Dtype::f16), "fp16");
  EXPECT_EQ(fw::dtype_name(fw::Dtype::f32), "fp32");
}
