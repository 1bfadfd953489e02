#include "fourway/layers/checkpoint.hpp"

#include <gtest/gtest.h>

#include "fourway/layers/block.hpp"
#include "fourway/layers/sequential.hpp"
#include "support/gradcheck.hpp"

namespace fw = fourway;
using Host = fw::Host;

namespace {
template <class T, class Blocks>
struct Run {
  std::vector<T> y;
  std::vector<T> dx;
  std::vector<std::vector<T>> grads;
  std::size_t act_after_forward = 0;
  std::size_t act_peak = 0;
};

template <class T, class Blocks>
Run<T, Blocks> run(fw::MemoryAccountant& mem, fw::Context<Host>& ctx, Blocks& blocks,
                   std::int64_t B, std::int64_t Tn, std::int64_t C) {
  Run<T, Blocks> r;
  fw::Tensor<T, Host> x({B, Tn, C}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, x, fw::test::randn(static_cast<std::size_t>(B * Tn * C), 21));
  fw::Tensor<T, Host> dy({B, Tn, C}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, dy, fw::test::randn(static_cast<std::size_t>(B * Tn * C), 22));
  mem.reset_peak();
  typename Blocks::Stash s;
  auto y = blocks.forward(ctx, x, s);
  r.act_after_forward = mem.current(fw::MemTag::activations);
  r.y = fw::test::download_raw(ctx, y);
  auto dx = blocks.backward(ctx, dy, s);
  r.act_peak = mem.peak(fw::MemTag::activations);
  r.dx = fw::test::download_raw(ctx, dx);
  blocks.visit_parameters(
      [&](fw::Parameter<T, Host>& p) { r.grads.push_back(fw::test::download_raw(ctx, p.grad)); });
  return r;
}

template <class T>
void checkpointing_is_exact_and_saves_memory() {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  const std::int64_t L = 3, B = 2, Tn = 5, C = 8, NH = 2;
  using Block = fw::TransformerBlock<T, Host>;
  fw::Repeat<Block> plain(L, [&](std::int64_t i) {
    return Block(ctx, "h." + std::to_string(i), C, NH, fw::Init{1, 0.2f, 0.1f});
  });
  fw::Repeat<fw::Checkpointed<Block>> ckpt(L, [&](std::int64_t i) {
    return fw::Checkpointed<Block>(
        Block(ctx, "h." + std::to_string(i), C, NH, fw::Init{1, 0.2f, 0.1f}));
  });
  const auto a = run<T>(mem, ctx, plain, B, Tn, C);
  const auto b = run<T>(mem, ctx, ckpt, B, Tn, C);
  // Bitwise: same kernels on the same inputs (fp16/bf16 compared by bits via ==).
  EXPECT_TRUE(a.y == b.y);
  EXPECT_TRUE(a.dx == b.dx);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(a.grads[i] == b.grads[i]) << i;

  const std::size_t block_stash =
      static_cast<std::size_t>(18 * B * Tn * C * sizeof(T) + 4 * B * Tn * 4 + B * NH * Tn * 4);
  const std::size_t kept = static_cast<std::size_t>(B * Tn * C * sizeof(T));
  EXPECT_EQ(a.act_after_forward, L * block_stash);
  EXPECT_EQ(b.act_after_forward, L * kept);
  // Backward recomputes one block at a time on top of the kept outputs.
  EXPECT_EQ(a.act_peak, L * block_stash);
  EXPECT_LE(b.act_peak, L * kept + block_stash);
  EXPECT_LT(b.act_peak, a.act_peak / 2);
}
}  // namespace

TEST(Checkpointed, Fp32GradientsBitwiseEqualAndActivationBytesDrop) {
  checkpointing_is_exact_and_saves_memory<float>();
}
TEST(Checkpointed, Bf16GradientsBitwiseEqualAndActivationBytesDrop) {
  checkpointing_is_exact_and_saves_memory<fw::bf16>();
}
