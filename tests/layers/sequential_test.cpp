#include "fourway/layers/sequential.hpp"

#include <gtest/gtest.h>

#include "fourway/layers/block.hpp"
#include "fourway/layers/embedding.hpp"
#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

TEST(Sequential, ChainsForwardAndBackward) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  using Seq =
      fw::Sequential<fw::LayerNorm<float, Host>, fw::Linear<float, Host>, fw::Gelu<float, Host>>;
  Seq seq(fw::LayerNorm<float, Host>(ctx, "ln", 6), fw::Linear<float, Host>(ctx, "fc", 6, 4, 1),
          fw::Gelu<float, Host>{});
  static_assert(fw::layer<Seq> && Seq::size == 3);
  fw::test::check_layer_gradients(seq, {5, 6}, [](const ref::Params& p, const ref::Vec& x) {
    const auto h = ref::layernorm(x, p.at("ln.weight"), p.at("ln.bias"), 5, 6);
    return ref::gelu(ref::linear(h, p.at("fc.weight"), &p.at("fc.bias"), 5, 6, 4));
  });
}

TEST(Repeat, NIdenticalBlocksMatchTheReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Repeat<fw::TransformerBlock<float, Host>> blocks(3, [&](std::int64_t i) {
    return fw::TransformerBlock<float, Host>(ctx, "h." + std::to_string(i), 8, 2, fw::Init{});
  });
  EXPECT_EQ(blocks.size(), 3u);
  fw::test::check_layer_gradients(blocks, {1, 4, 8}, [](const ref::Params& p, const ref::Vec& x) {
    auto y = x;
    for (int i = 0; i < 3; ++i) y = ref::block(p, "h." + std::to_string(i) + ".", y, 1, 4, 8, 2);
    return y;
  });
}

TEST(Sequential, StartsWithTokenIdsAndVisitsParametersInOrder) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Sequential<fw::Embedding<float, Host>, fw::TransformerBlock<float, Host>> seq(
      fw::Embedding<float, Host>(ctx, 10, 6, 8, 1),
      fw::TransformerBlock<float, Host>(ctx, "h.0", 8, 2, fw::Init{}));
  std::vector<std::string> names;
  seq.visit_parameters([&](fw::Parameter<float, Host>& p) { names.push_back(p.name); });
  ASSERT_EQ(names.size(), 2u + 12u);
  EXPECT_EQ(names.front(), "wte.weight");
  EXPECT_EQ(names.back(), "h.0.mlp.c_proj.bias");
  fw::Tensor<std::int32_t, Host> tok({2, 5}, fw::MemTag::workspace, mem);
  for (int i = 0; i < 10; ++i) tok[i] = (3 * i) % 10;
  decltype(seq)::Stash s;
  auto y = seq.forward(ctx, tok, s);
  EXPECT_EQ(y.shape(), (fw::Shape{2, 5, 8}));
  fw::Tensor<float, Host> dy({2, 5, 8}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, dy, fw::test::randn(80, 2));
  EXPECT_TRUE(seq.backward(ctx, dy, s).empty());
  EXPECT_EQ(mem.current(fw::MemTag::activations), 0u);
}
