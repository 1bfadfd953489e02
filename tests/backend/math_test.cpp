#include "fourway/backend/host/math.hpp"

#include <gtest/gtest.h>

#include <cmath>

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
