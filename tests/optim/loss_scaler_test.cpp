#include "fourway/optim/loss_scaler.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace fw = fourway;

namespace {

// Exact scale sequences, written out by hand from the rule (x0.5 on overflow, x2 after
// growth_interval clean steps, the clean run restarting after either).
TEST(LossScaler, ExactScaleSequenceWithInjectedOverflows) {
  auto s = fw::LossScaler::dynamic({.init_scale = 1024.0f, .growth_interval = 3});
  const std::vector<bool> overflow = {false, false, true,  false, false, false, false,
                                      true,  true,  false, false, false, false, false};
  const std::vector<float> want = {1024, 1024, 512, 512, 512, 1024, 1024,
                                   512,  256,  256, 256, 512, 512,  512};
  const std::vector<int> run = {1, 2, 0, 1, 2, 0, 1, 0, 0, 1, 2, 0, 1, 2};
  for (std::size_t i = 0; i < overflow.size(); ++i) {
    EXPECT_EQ(s.update(overflow[i]), !overflow[i]) << "step " << i;
    EXPECT_EQ(s.scale(), want[i]) << "step " << i;
    EXPECT_EQ(s.clean_run(), run[i]) << "step " << i;
  }
  EXPECT_EQ(s.skipped_steps(), 3);
}

TEST(LossScaler, PyTorchDefaults) {
  auto s = fw::LossScaler::dynamic();
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.config().growth_interval, 2000);
  for (int i = 0; i < 1999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 65536.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0f);
}

TEST(LossScaler, FloorAndCeiling) {
  auto s = fw::LossScaler::dynamic({.init_scale = 4.0f, .growth_interval = 1, .min_scale = 1.0f});
  for (float want : {2.0f, 1.0f, 1.0f}) {
    s.update(true);
    EXPECT_EQ(s.scale(), want);
  }
  auto big = fw::LossScaler::dynamic({.init_scale = 0x1p127f, .growth_interval = 1});
  big.update(false);
  EXPECT_EQ(big.scale(), 0x1p127f);  // 2^128 is not a float: the scale stays finite
}

TEST(LossScaler, NoneIsOneForever) {
  auto s = fw::LossScaler::none();
  EXPECT_FALSE(s.enabled());
  for (bool inf : {false, true, false}) {
    s.update(inf);
    EXPECT_EQ(s.scale(), 1.0f);
  }
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(LossScaler, RejectsBadSettings) {
  EXPECT_THROW((void)fw::LossScaler::dynamic({.init_scale = 0.0f}), fw::ConfigError);
  EXPECT_THROW((void)fw::LossScaler::dynamic({.growth_factor = 1.0f}), fw::ConfigError);
  EXPECT_THROW((void)fw::LossScaler::dynamic({.backoff_factor = 1.0f}), fw::ConfigError);
  EXPECT_THROW((void)fw::LossScaler::dynamic({.growth_interval = 0}), fw::ConfigError);
  EXPECT_THROW((void)fw::LossScaler::dynamic({.init_scale = 2.0f, .min_scale = 4.0f}),
               fw::ConfigError);
}

}  // namespace
