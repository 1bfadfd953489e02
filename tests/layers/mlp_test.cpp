#include "fourway/layers/mlp.hpp"

#include <gtest/gtest.h>

#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

TEST(Mlp, GradientsMatchFiniteDifferencesOfDoubleReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Mlp<float, Host> mlp(ctx, "h.1.mlp", 6, fw::Init{});
  fw::test::check_layer_gradients(mlp, {2, 3, 6}, [](const ref::Params& p, const ref::Vec& x) {
    return ref::mlp(p, "h.1.mlp.", x, 6, 6);
  });
}

TEST(Mlp, ResidualProjectionUsesTheResidualInit) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Mlp<float, Host> mlp(ctx, "m", 64, fw::Init{9, 0.02f, 0.005f});
  auto sd = [](fw::Parameter<float, Host>& p) {
    double s = 0.0;
    for (std::int64_t i = 0; i < p.numel(); ++i) s += double(p.weight[i]) * p.weight[i];
    return std::sqrt(s / static_cast<double>(p.numel()));
  };
  // 16384 samples each: the sample std is within 2% of the target with overwhelming odds.
  EXPECT_NEAR(sd(mlp.c_fc().weight()), 0.02, 0.0004);
  EXPECT_NEAR(sd(mlp.c_proj().weight()), 0.005, 0.0001);
}
