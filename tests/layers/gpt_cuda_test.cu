// Gpt<float, Cuda> and Gpt<bf16, Cuda>: one forward/backward on the GPU against the host model
// with the same initial parameters and data. Skips without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "fourway/backend/ops.cuh"
#include "fourway/layers/gpt.hpp"
#include "support/util.hpp"

namespace fw = fourway;
using fw::Cuda;
using fw::Host;
using fw::models::Gpt;
using fw::models::GptConfig;

#define FOURWAY_REQUIRE_GPU() \
  if (fw::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

namespace {
struct Out {
  float loss = 0.0f;
  std::vector<std::vector<double>> grads;
  std::vector<std::string> names;
};

template <class T, class B, class Ctx>
Out run(Ctx& ctx, Gpt<T, B>& gpt, const std::vector<std::int32_t>& tok,
        const std::vector<std::int32_t>& tgt, std::int64_t Bn, std::int64_t Tn) {
  fw::Tensor<std::int32_t, B> t({Bn, Tn}, fw::MemTag::workspace, ctx.memory());
  fw::Tensor<std::int32_t, B> y({Bn, Tn}, fw::MemTag::workspace, ctx.memory());
  fw::Ops<B>::from_host(ctx, t.data(), tok.data(), t.numel());
  fw::Ops<B>::from_host(ctx, y.data(), tgt.data(), y.numel());
  typename Gpt<T, B>::Stash s;
  Out o;
  o.loss = gpt.forward(ctx, t, y, s);
  gpt.backward(ctx, s);
  ctx.synchronize();
  gpt.visit_parameters([&](fw::Parameter<T, B>& p) {
    o.names.push_back(p.name);
    o.grads.push_back(fw::test::download(ctx, p.grad));
  });
  return o;
}

/// Relative L2 distance of two gradients (for the figures).
double rel_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / (std::sqrt(den) + 1e-30);
}

template <class T>
void gpu_matches_host(double loss_rel, double grad_rel_l2,
                      const GptConfig& cfg = {2, 4, 64, 96, 32}, std::int64_t Bn = 3,
                      std::int64_t Tn = 29, bool fused_attention = false) {
  std::vector<std::int32_t> tok, tgt;
  for (std::int64_t i = 0; i < Bn * Tn; ++i) {
    tok.push_back(static_cast<std::int32_t>((i * 37 + 5) % cfg.vocab));
    tgt.push_back(static_cast<std::int32_t>((i * 53 + 11) % cfg.vocab));
  }
  fw::MemoryAccountant hm, dm;
  fw::Context<Host> hctx(hm);
  fw::Context<Cuda> dctx(dm, 0);
  dctx.set_fused_attention(fused_attention);
  Gpt<T, Host> host(hctx, cfg, 17);
  Gpt<T, Cuda> dev(dctx, cfg, 17);  // init depends only on (seed, name): identical start
  // the seconds of each side, printed as they end (a step that runs out of time still says
  // which side it was in)
  const auto t0 = std::chrono::steady_clock::now();
  const Out h = run(hctx, host, tok, tgt, Bn, Tn);
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("gpt-step T%lld: host forward + backward %.2f s\n", static_cast<long long>(Tn),
              std::chrono::duration<double>(t1 - t0).count());
  std::fflush(stdout);
  const Out d = run(dctx, dev, tok, tgt, Bn, Tn);
  std::printf("gpt-step T%lld: cuda forward + backward %.3f s (the first, with set-up)\n",
              static_cast<long long>(Tn),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
  EXPECT_NEAR(d.loss, h.loss, loss_rel * h.loss);
  ASSERT_EQ(h.names, d.names);
  double worst = 0.0;
  std::string worst_name;
  for (std::size_t i = 0; i < h.grads.size(); ++i) {
    EXPECT_TRUE(fw::test::close_l2(d.grads[i], h.grads[i], grad_rel_l2, h.names[i]));
    const double e = rel_l2(d.grads[i], h.grads[i]);
    if (e > worst) worst = e, worst_name = h.names[i];
  }
  // one line scripts/device-check.sh copies into its table
  std::printf(
      "FIGURE gpt-step %s L%d C%d NH%d V%d B%lld T%lld: loss host %.6f cuda %.6f "
      "(rel %.1e), worst grad rel-L2 %.1e (%s)\n",
      fw::dtype_name(fw::dtype_v<T>).data(), cfg.layers, cfg.dim, cfg.heads, cfg.vocab,
      static_cast<long long>(Bn), static_cast<long long>(Tn), h.loss, d.loss,
      std::abs(d.loss - h.loss) / h.loss, worst, worst_name.c_str());
  EXPECT_EQ(dm.current(fw::MemTag::activations), 0u);
}
}  // namespace

// fp32: device expf/tanhf and cuBLAS summation order differ from the host by a few ulp per op.
TEST(GptCuda, Fp32MatchesHost) {
  FOURWAY_REQUIRE_GPU();
  gpu_matches_host<float>(1e-5, 1e-4);
}
// bf16: both sides round to 8 mantissa bits at different points (docs/layers.md).
TEST(GptCuda, Bf16MatchesHost) {
  FOURWAY_REQUIRE_GPU();
  gpu_matches_host<fw::bf16>(1e-2, 5e-2);
}

// GPT-2 124M's width, heads and vocabulary at T = 1024, 2 layers, one sequence: the shapes of a
// real run (cuBLAS picks other kernels at these sizes than at the small ones, the 50257-wide
// cross-entropy rows span many warps). fp32 sums of length 768..50257 in another order: 1e-4 on
// the loss and 1e-3 relative L2 on every gradient leave two orders of magnitude above the
// expected ~1e-6 per op, and a wrong kernel is off by far more.
TEST(GptCuda, Gpt2WidthAtT1024MatchesHost) {
  FOURWAY_REQUIRE_GPU();
  gpu_matches_host<float>(1e-4, 1e-3, GptConfig{2, 12, 768, 50257, 1024}, 1, 1024);
}

// The bf16 step with the fused tensor-core attention (head size 16, T = 150: three query tiles,
// the last partial), at bf16's tolerance; the shape is one the fused kernels take, so the layers
// run them (they fall back to the blockwise path only where fused_attention_supports says no).
// After the other step tests: new kernels whose failure should sink none of them.
TEST(GptCuda, Bf16FusedAttentionMatchesHost) {
  FOURWAY_REQUIRE_GPU();
  const GptConfig cfg{2, 4, 64, 96, 160};
  fw::MemoryAccountant m;
  fw::Context<Cuda> ctx(m, 0);
  ASSERT_TRUE(fw::cuda::fused_attention_supports<fw::bf16>(ctx, 2, 150, cfg.dim, cfg.heads));
  gpu_matches_host<fw::bf16>(1e-2, 5e-2, cfg, 2, 150, true);
}

TEST(GptCuda, CheckpointingAndRerunsAreBitwiseEqual) {
  FOURWAY_REQUIRE_GPU();
  GptConfig cfg{2, 4, 64, 96, 32};
  std::vector<std::int32_t> tok, tgt;
  for (int i = 0; i < 2 * 31; ++i) {
    tok.push_back((i * 7 + 1) % 96);
    tgt.push_back((i * 11 + 2) % 96);
  }
  fw::MemoryAccountant dm;
  fw::Context<Cuda> ctx(dm, 0);
  Gpt<float, Cuda> a(ctx, cfg, 3);
  cfg.checkpoint = true;
  Gpt<float, Cuda> b(ctx, cfg, 3);
  const Out x = run(ctx, a, tok, tgt, 2, 31);
  const Out y = run(ctx, b, tok, tgt, 2, 31);
  EXPECT_EQ(x.loss, y.loss);
  for (std::size_t i = 0; i < x.grads.size(); ++i)
    EXPECT_TRUE(x.grads[i] == y.grads[i]) << x.names[i];
}

// A token id outside the vocabulary on the device: the embedding kernel reads nothing for it and
// flags it; the layer's backward reads the flag (once) and names the first bad id and position.
TEST(EmbeddingCuda, BadTokenIdsAreNamedByTheBackward) {
  FOURWAY_REQUIRE_GPU();
  fw::MemoryAccountant dm;
  fw::Context<Cuda> ctx(dm, 0);
  fw::Embedding<float, Cuda> emb(ctx, 5, 4, 3, 1);
  const std::vector<std::int32_t> ids = {1, 7, 2, -1};
  fw::Tensor<std::int32_t, Cuda> t({1, 4}, fw::MemTag::workspace, dm);
  fw::Ops<Cuda>::from_host(ctx, t.data(), ids.data(), 4);
  fw::Embedding<float, Cuda>::Stash s;
  const auto y = emb.forward(ctx, t, s);
  const std::vector<double> out = fw::test::download(ctx, y);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(out[3 + c], 0.0) << "the bad id's row reads nothing";
  fw::Tensor<float, Cuda> dy({1, 4, 3}, fw::MemTag::workspace, dm);
  fw::Ops<Cuda>::fill(ctx, dy.data(), 12, 1.0f);
  try {
    (void)emb.backward(ctx, dy, s);
    ADD_FAILURE() << "a bad token id went unnoticed";
  } catch (const fw::ShapeError& e) {
    EXPECT_NE(
        std::string(e.what()).find("token id 7 at position 1 is outside the vocabulary [0, 5)"),
        std::string::npos)
        << e.what();
  }
}
