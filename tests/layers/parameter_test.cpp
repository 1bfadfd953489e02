#include "fourway/layers/parameter.hpp"

#include <gtest/gtest.h>

#include "fourway/backend/host/backend.hpp"

namespace fw = fourway;
using Host = fw::Host;

TEST(Parameter, AllocatesWeightAndZeroGradUnderTheirTags) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Parameter<fw::bf16, Host> p(ctx, "h.0.mlp.c_fc.weight", {3, 5});
  EXPECT_EQ(mem.current(fw::MemTag::weights), 30u);
  EXPECT_EQ(mem.current(fw::MemTag::grads), 30u);
  EXPECT_TRUE(p.decay);
  for (std::int64_t i = 0; i < p.numel(); ++i) EXPECT_EQ(fw::convert<float>(p.grad[i]), 0.0f);
  fw::Parameter<float, Host> b(ctx, "h.0.mlp.c_fc.bias", {5});
  EXPECT_FALSE(b.decay);
}

TEST(Parameter, InitDependsOnSeedAndNameOnly) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Parameter<float, Host> a(ctx, "x.weight", {64});
  fw::Parameter<float, Host> b(ctx, "x.weight", {64});
  fw::Parameter<float, Host> c(ctx, "y.weight", {64});
  fw::init_normal(ctx, a, 42, 0.02f);
  fw::init_normal(ctx, c, 42, 0.02f);
  fw::init_normal(ctx, b, 42, 0.02f);
  int differ = 0;
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(a.weight[i], b.weight[i]);
    differ += a.weight[i] != c.weight[i];
  }
  EXPECT_EQ(differ, 64);
}

TEST(Parameter, InitIsNormalWithTheRequestedStd) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Parameter<float, Host> a(ctx, "w", {40000});
  fw::init_normal(ctx, a, 1, 0.5f);
  double s1 = 0.0, s2 = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    s1 += a.weight[i];
    s2 += double(a.weight[i]) * a.weight[i];
  }
  const double mean = s1 / 40000.0, sd = std::sqrt(s2 / 40000.0 - mean * mean);
  // Standard errors: mean 0.5/200 = 0.0025, std about 0.5/283 = 0.0018; bounds are 4 of them.
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sd, 0.5, 0.007);
}
