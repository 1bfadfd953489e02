#include "fourway/optim/lr_schedule.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace fw = fourway;

namespace {

TEST(LrSchedule, ConstantIsTheDefault) {
  const auto s = fw::LrSchedule::constant(6e-4f);
  for (long i : {0L, 1L, 999L, 123456L}) EXPECT_EQ(s.at(i), 6e-4f);
  EXPECT_EQ(s.kind(), fw::LrSchedule::Kind::constant);
}

// Against the formula, evaluated independently in long double at every iteration.
TEST(LrSchedule, WarmupThenCosineFollowsTheFormula) {
  const float max_lr = 6e-4f, min_lr = 6e-5f;
  const int warmup = 7, total = 31;
  const auto s = fw::LrSchedule::warmup_cosine(max_lr, warmup, total, min_lr);
  const long double pi = std::acos(-1.0L);
  for (int i = 0; i < total + 5; ++i) {
    long double want;
    if (i < warmup) {
      want = static_cast<long double>(max_lr) * (i + 1) / warmup;
    } else if (i >= total) {
      want = min_lr;
    } else {
      const long double r = static_cast<long double>(i - warmup) / (total - warmup);
      want =
          min_lr + 0.5L * (1.0L + std::cos(pi * r)) * (static_cast<long double>(max_lr) - min_lr);
    }
    // One float rounding of the result: half an ulp of 6e-4 is ~3e-11.
    EXPECT_NEAR(s.at(i), static_cast<double>(want), 1e-10) << "iteration " << i;
  }
  EXPECT_FLOAT_EQ(s.at(warmup - 1), max_lr);  // warm-up ends at the peak
  EXPECT_FLOAT_EQ(s.at(warmup), max_lr);      // cosine starts at the peak
  EXPECT_FLOAT_EQ(s.at(total), min_lr);
  // Monotone decay after warm-up.
  for (int i = warmup; i < total; ++i) EXPECT_GE(s.at(i), s.at(i + 1));
}

TEST(LrSchedule, NoWarmupStartsAtThePeak) {
  const auto s = fw::LrSchedule::warmup_cosine(1.0f, 0, 4);
  EXPECT_FLOAT_EQ(s.at(0), 1.0f);
  EXPECT_FLOAT_EQ(s.at(2), 0.5f);
  EXPECT_FLOAT_EQ(s.at(4), 0.0f);
}

TEST(LrSchedule, RejectsBadSettingsWithTheNumbers) {
  try {
    (void)fw::LrSchedule::warmup_cosine(1e-3f, 10, 10);
    FAIL() << "warmup == total accepted";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("warmup 10 and total 10"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)fw::LrSchedule::warmup_cosine(1e-3f, 2, 10, 1e-2f), fw::ConfigError);
  EXPECT_THROW((void)fw::LrSchedule::constant(-1.0f), fw::ConfigError);
  EXPECT_THROW((void)fw::LrSchedule::constant(NAN), fw::ConfigError);
  EXPECT_THROW((void)fw::LrSchedule::warmup_cosine(1.0f, 1, 5).at(-1), fw::ConfigError);
}

}  // namespace
