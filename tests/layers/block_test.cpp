#include "fourway/layers/block.hpp"

#include <gtest/gtest.h>

#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

TEST(TransformerBlock, GradientsMatchFiniteDifferencesOfDoubleReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::TransformerBlock<float, Host> blk(ctx, "h.0", 8, 2, fw::Init{});
  fw::test::check_layer_gradients(blk, {2, 3, 8}, [](const ref::Params& p, const ref::Vec& x) {
    return ref::block(p, "h.0.", x, 2, 3, 8, 2);
  });
}

TEST(TransformerBlock, StashBytesFollowTheFormula) {
  // 18·B·T·C elements of T plus 4·B·T + B·NH·T floats (docs/layers.md): no T² term, the
  // attention keeps one log-sum-exp per (batch, head, query).
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const std::int64_t B = 3, T = 5, C = 12, NH = 4;
  fw::TransformerBlock<fw::bf16, Host> blk(ctx, "h.0", C, NH, fw::Init{});
  fw::Tensor<fw::bf16, Host> x({B, T, C}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, x, fw::test::randn(static_cast<std::size_t>(B * T * C), 1));
  fw::TransformerBlock<fw::bf16, Host>::Stash s;
  (void)blk.forward(ctx, x, s);
  const auto want = static_cast<std::size_t>(18 * B * T * C * 2 + 4 * B * T * 4 + B * NH * T * 4);
  EXPECT_EQ(mem.current(fw::MemTag::activations), want);
  EXPECT_EQ(mem.current(fw::MemTag::workspace), static_cast<std::size_t>(x.bytes()))
      << "forward leaves no scratch behind";
}
