#include "fourway/backend/host/math.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace fw = fourway;

TEST(HostMath, ExpPolyIsWithinFourUlpOfLibm) {
  // Cephes expf is accurate to about 2 ulp on [-87, 88]; 4 ulp (2^-21 relative) leaves margin
  // for the float rounding of the argument reduction.
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 200000.0f;
    const double ref = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(fw::host::detail::exp_poly(x) - ref) / ref);
  }
  EXPECT_LT(worst, 0x1p-21);
  EXPECT_EQ(fw::host::detail::exp_poly(0.0f), 1.0f);
  EXPECT_TRUE(std::isfinite(fw::host::detail::exp_poly(1000.0f)));
  EXPECT_LT(fw::host::detail::exp_poly(-1000.0f), 1e-37f);
}

TEST(HostMath, TanhPolyAbsoluteErrorBelow2e7) {
  // 1 - 2/(e^{2x}+1): the absolute error is a few float ulps of 1 (1.2e-7 each).
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -20.0f + 40.0f * static_cast<float>(i) / 200000.0f;
    worst = std::max(worst,
                     std::abs(fw::host::detail::tanh_poly(x) - std::tanh(static_cast<double>(x))));
  }
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(fw::host::detail::tanh_poly(100.0f), 1.0f);
  EXPECT_EQ(fw::host::detail::tanh_poly(-100.0f), -1.0f);
}

TEST(HostMath, Exp2PolyIsWithinTwoUlpOfLibm) {
  // Cephes exp2f's polynomial is good to ~1.7e-7 on [-1/2, 1/2] and the reduction x = n + f is
  // exact, so the error is the polynomial's plus its fp32 rounding: 2 ulp (2^-22) with margin
  // (measured 2^-23.6). Includes every integer and half-integer (the rounding ties).
  double worst = 0.0;
  const auto check = [&](float x) {
    const double ref = std::exp2(static_cast<double>(x));
    worst = std::max(worst, std::abs(fw::host::detail::exp2_poly(x) - ref) / ref);
  };
  for (int i = 0; i <= 400000; ++i) check(-126.0f + 252.0f * static_cast<float>(i) / 400000.0f);
  for (int i = -252; i <= 252; ++i) check(0.5f * static_cast<float>(i));
  EXPECT_LT(worst, 0x1p-22);
  EXPECT_EQ(fw::host::detail::exp2_poly(0.0f), 1.0f);
  EXPECT_EQ(fw::host::detail::exp2_poly(-126.0f), 0x1p-126f);
  EXPECT_EQ(fw::host::detail::exp2_poly(126.0f), 0x1p126f);
}

TEST(HostMath, ClampMagnitudeKeepsSignAndLimitsMagnitude) {
  using fw::host::detail::clamp_magnitude;
  EXPECT_EQ(clamp_magnitude(3.5f, 126.0f), 3.5f);
  EXPECT_EQ(clamp_magnitude(-3.5f, 126.0f), -3.5f);
  EXPECT_EQ(clamp_magnitude(200.0f, 126.0f), 126.0f);
  EXPECT_EQ(clamp_magnitude(-200.0f, 126.0f), -126.0f);
  EXPECT_EQ(clamp_magnitude(std::numeric_limits<float>::infinity(), 126.0f), 126.0f);
  EXPECT_EQ(clamp_magnitude(-std::numeric_limits<float>::infinity(), 126.0f), -126.0f);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(clamp_magnitude(-0.0f, 1.0f)), 0x80000000u);
  EXPECT_EQ(std::abs(clamp_magnitude(std::numeric_limits<float>::quiet_NaN(), 126.0f)), 126.0f);
}

TEST(HostMath, Bf16BitsRneEqualsTheConversion) {
  // sampled non-NaN floats, every bf16 pattern widened (the quiet NaNs among them, the
  // infinities), and each with low halves at the rounding edges: ties, overflow to infinity
  using fw::host::detail::bf16_bits_rne;
  std::mt19937 gen(7);
  for (int i = 0; i < 1000000; ++i) {
    const float v = std::bit_cast<float>(static_cast<std::uint32_t>(gen()));
    if (std::isnan(v)) continue;
    ASSERT_EQ(bf16_bits_rne(v), fw::bf16(v).bits) << std::bit_cast<std::uint32_t>(v);
  }
  for (std::uint32_t hi = 0; hi < 65536; ++hi) {
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float v = std::bit_cast<float>(hi << 16 | lo);
      const bool quiet_zero_low = lo == 0 && (hi & 0x40u) != 0;
      if (std::isnan(v) && !quiet_zero_low) continue;  // outside the precondition
      ASSERT_EQ(bf16_bits_rne(v), fw::bf16(v).bits) << (hi << 16 | lo);
    }
  }
  EXPECT_EQ(std::bit_cast<std::uint32_t>(
                fw::host::detail::canonical_nan(std::bit_cast<float>(0xffc00001u))) &
                0xffffu,
            0u);
  EXPECT_EQ(fw::host::detail::canonical_nan(1.5f), 1.5f);
}

TEST(HostMath, Sum2LanesAddsInSumLanesOrder) {
  // bitwise equal to two sum_lanes calls: the one-pass form changes no result
  for (std::int64_t n : {0, 1, 15, 16, 17, 768, 1023}) {
    std::vector<float> a(static_cast<std::size_t>(n)), b(a.size());
    std::mt19937 gen(static_cast<std::uint32_t>(n));
    std::uniform_real_distribution<float> d(-3.0f, 3.0f);
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = d(gen);
      b[i] = d(gen);
    }
    const auto [sa, sb] = fw::host::detail::sum2_lanes(
        n, [&](std::int64_t i) { return std::pair<float, float>(a[i], b[i]); });
    EXPECT_EQ(sa, fw::host::detail::sum_lanes(n, [&](std::int64_t i) { return a[i]; })) << n;
    EXPECT_EQ(sb, fw::host::detail::sum_lanes(n, [&](std::int64_t i) { return b[i]; })) << n;
  }
}
