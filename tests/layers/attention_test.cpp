#include "fourway/layers/attention.hpp"

#include <gtest/gtest.h>

#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

TEST(CausalSelfAttention, GradientsMatchFiniteDifferencesOfDoubleReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const fw::Init init{5, 0.02f, 0.01f};
  fw::CausalSelfAttention<float, Host> attn(ctx, "h.0.attn", 12, 3, init);
  fw::test::check_layer_gradients(attn, {2, 5, 12}, [](const ref::Params& p, const ref::Vec& x) {
    return ref::self_attention(p, "h.0.attn.", x, 2, 5, 12, 3);
  });
}

TEST(CausalSelfAttention, NamesAndShapesAreGpt2) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::CausalSelfAttention<float, Host> attn(ctx, "h.3.attn", 8, 2, fw::Init{});
  std::vector<std::string> names;
  attn.visit_parameters([&](fw::Parameter<float, Host>& p) { names.push_back(p.name); });
  EXPECT_EQ(names, (std::vector<std::string>{"h.3.attn.c_attn.weight", "h.3.attn.c_attn.bias",
                                             "h.3.attn.c_proj.weight", "h.3.attn.c_proj.bias"}));
  EXPECT_EQ(attn.c_attn().weight().weight.shape(), (fw::Shape{8, 24}));
  EXPECT_THROW((fw::CausalSelfAttention<float, Host>(ctx, "a", 10, 3, fw::Init{})),
               fw::ConfigError);
}

TEST(CausalSelfAttention, FutureTokensDoNotChangeThePast) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::CausalSelfAttention<float, Host> attn(ctx, "a", 8, 2, fw::Init{3, 0.3f, 0.3f});
  fw::Tensor<float, Host> x({1, 6, 8}, fw::MemTag::workspace, mem);
  auto xv = fw::test::randn(48, 11);
  fw::test::upload(ctx, x, xv);
  fw::CausalSelfAttention<float, Host>::Stash s1, s2;
  const auto y1 = fw::test::download(ctx, attn.forward(ctx, x, s1));
  for (int i = 40; i < 48; ++i) xv[i] += 1.0;  // change the last token only
  fw::test::upload(ctx, x, xv);
  const auto y2 = fw::test::download(ctx, attn.forward(ctx, x, s2));
  for (int i = 0; i < 40; ++i) EXPECT_EQ(y1[i], y2[i]) << i;
  EXPECT_NE(y1[47], y2[47]);
}
