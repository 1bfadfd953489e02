#include "fourway/layers/embedding.hpp"

#include <gtest/gtest.h>

#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

TEST(Embedding, ForwardAndScatterAddBackwardMatchDoubleReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const std::int64_t V = 11, maxT = 9, C = 5, B = 3, T = 7;
  fw::Embedding<float, Host> emb(ctx, V, maxT, C, 1);
  ref::Params p = fw::test::randomize_parameters(ctx, emb, 4);
  fw::Tensor<std::int32_t, Host> tok({B, T}, fw::MemTag::workspace, mem);
  std::vector<std::int32_t> tv(static_cast<std::size_t>(B * T));
  for (std::size_t i = 0; i < tv.size(); ++i)
    tok[static_cast<std::int64_t>(i)] = tv[i] =
        static_cast<std::int32_t>((i * 7 + i / 4) % 4);  // repeats
  fw::Embedding<float, Host>::Stash s;
  auto y = emb.forward(ctx, tok, s);
  auto reference = [&] {
    return ref::embedding(tv, p.at("wte.weight"), p.at("wpe.weight"), B, T, C);
  };
  EXPECT_TRUE(fw::test::close(fw::test::download(ctx, y), reference(), 1e-7, "forward"));
  const auto r = fw::test::randn(static_cast<std::size_t>(B * T * C), 5);
  fw::Tensor<float, Host> dy({B, T, C}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, dy, r);
  auto dx = emb.backward(ctx, dy, s);
  EXPECT_TRUE(dx.empty());
  emb.visit_parameters([&](fw::Parameter<float, Host>& par) {
    auto& v = p[par.name];
    const auto want = ref::finite_difference(v, [&] { return ref::dot(reference(), r); });
    EXPECT_TRUE(fw::test::close(fw::test::download(ctx, par.grad), want, 1e-5, par.name));
  });
}

TEST(Embedding, RejectsBadTokensAndTooLongSequences) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Embedding<float, Host> emb(ctx, 10, 4, 3, 1);
  fw::Embedding<float, Host>::Stash s;
  fw::Tensor<std::int32_t, Host> tok({1, 3}, fw::MemTag::workspace, mem);
  tok[0] = 1;
  tok[1] = 10;
  tok[2] = 0;
  EXPECT_THROW((void)emb.forward(ctx, tok, s), fw::ShapeError);
  fw::Tensor<std::int32_t, Host> longer({1, 5}, fw::MemTag::workspace, mem);
  for (int i = 0; i < 5; ++i) longer[i] = 0;
  EXPECT_THROW((void)emb.forward(ctx, longer, s), fw::ConfigError);
}
