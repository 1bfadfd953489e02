#include "fourway/layers/layernorm.hpp"

#include <gtest/gtest.h>

#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

TEST(LayerNorm, GradientsMatchFiniteDifferencesOfDoubleReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::LayerNorm<float, Host> ln(ctx, "ln_1", 9);
  fw::test::check_layer_gradients(ln, {2, 3, 9}, [](const ref::Params& p, const ref::Vec& x) {
    return ref::layernorm(x, p.at("ln_1.weight"), p.at("ln_1.bias"), 6, 9);
  });
}

TEST(LayerNorm, InitialisesGainOneBiasZeroWithoutDecay) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::LayerNorm<float, Host> ln(ctx, "ln_f", 4);
  EXPECT_EQ(ln.eps(), 1e-5f);
  ln.visit_parameters([&](fw::Parameter<float, Host>& p) {
    EXPECT_FALSE(p.decay);
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      EXPECT_EQ(p.weight[i], p.name == "ln_f.weight" ? 1.0f : 0.0f);
      EXPECT_EQ(p.grad[i], 0.0f);
    }
  });
}

TEST(LayerNorm, StashHoldsOutputAndRowStatistics) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::LayerNorm<fw::bf16, Host> ln(ctx, "ln", 6);
  fw::Tensor<fw::bf16, Host> x({5, 6}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, x, fw::test::randn(30, 3));
  fw::LayerNorm<fw::bf16, Host>::Stash s;
  (void)ln.forward(ctx, x, s);
  EXPECT_EQ(mem.current(fw::MemTag::activations), 5u * 6u * 2u + 2u * 5u * 4u);
}
