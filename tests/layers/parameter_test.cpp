#include "fourway/layers/parameter.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

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

TEST(Parameter, InitIsAPureFunctionOfSeedNameAndIndexSoAnySliceComputesAlone) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Parameter<float, Host> whole(ctx, "h.1.attn.c_attn.weight", {37, 11});
  fw::init_normal(ctx, whole, 7, 0.02f);
  // An independent reference of the rule: Box-Muller on numbers 2i, 2i+1 of SplitMix64 over
  // the counter, keyed by seed and name (written out here, not called).
  std::uint64_t key = 7 ^ 0x9e3779b97f4a7c15ull;
  for (char c : std::string("h.1.attn.c_attn.weight")) {
    key = (key ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  auto uni = [&](std::uint64_t k) {
    return (static_cast<double>(mix(key + (k + 1) * 0x9e3779b97f4a7c15ull) >> 11) + 0.5) *
           0x1.0p-53;
  };
  for (std::int64_t i = 0; i < whole.numel(); ++i) {
    const auto k = static_cast<std::uint64_t>(2 * i);
    const double z = std::sqrt(-2.0 * std::log(uni(k))) * std::cos(6.283185307179586 * uni(k + 1));
    ASSERT_EQ(whole.weight[i], static_cast<float>(0.02f * z)) << "element " << i;
  }
  // Deferred: no storage, and any slice written on its own equals the same elements bitwise.
  const std::size_t before = mem.total_current();
  fw::Parameter<float, Host> lazy;
  {
    const fw::DeferredInit scope;
    lazy = fw::Parameter<float, Host>(ctx, "h.1.attn.c_attn.weight", {37, 11});
  }
  fw::init_normal(ctx, lazy, 7, 0.02f);
  EXPECT_TRUE(lazy.deferred());
  EXPECT_EQ(mem.total_current(), before);
  EXPECT_EQ(lazy.weight.shape(), (fw::Shape{37, 11}));
  for (auto [first, count] : {std::pair<std::int64_t, std::int64_t>{0, 407}, {5, 1}, {100, 250}}) {
    std::vector<float> part(static_cast<std::size_t>(count));
    fw::write_initial_values(ctx, lazy, part.data(), first, count);
    for (std::int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(part[static_cast<std::size_t>(i)], whole.weight[first + i]) << first + i;
    }
  }
  fw::materialize(ctx, lazy);
  EXPECT_FALSE(lazy.deferred());
  EXPECT_EQ(mem.total_current(), before + 2 * 407 * sizeof(float));
  for (std::int64_t i = 0; i < 407; ++i) ASSERT_EQ(lazy.weight[i], whole.weight[i]);
}

TEST(Parameter, ADeferredParameterWithoutARuleCannotBePlaced) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const fw::DeferredInit scope;
  fw::Parameter<float, Host> p(ctx, "w", {4});
  float out[4];
  EXPECT_THROW(fw::write_initial_values(ctx, p, out, 0, 4), fw::ConfigError);
}
