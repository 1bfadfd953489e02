// RMSNorm, SwiGLU and Rotary layers (the Llama pieces) against double-precision references
// written here: forward, input and parameter gradients by central differences (gradcheck.hpp),
// parameter names and initial values, the stash freed by backward, and the in-place rotation
// composed with a Linear (a q|k|v projection) as an attention layer would use it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fourway/layers/linear.hpp"
#include "fourway/layers/rmsnorm.hpp"
#include "fourway/layers/rotary.hpp"
#include "fourway/layers/sequential.hpp"
#include "fourway/layers/swiglu.hpp"
#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

namespace {
/// y = x / sqrt(mean(x²) + eps) · w per row of C (Zhang & Sennrich 2019).
ref::Vec rmsnorm(const ref::Vec& x, const ref::Vec& w, std::int64_t rows, std::int64_t C,
                 double eps = 1e-5) {
  ref::Vec y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (std::int64_t c = 0; c < C; ++c) ss += x[r * C + c] * x[r * C + c];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    for (std::int64_t c = 0; c < C; ++c) y[r * C + c] = x[r * C + c] * s * w[c];
  }
  return y;
}
/// Rows of 2F = [gate | up] -> silu(gate)·up.
ref::Vec swiglu(const ref::Vec& x, std::int64_t rows, std::int64_t F) {
  ref::Vec y(static_cast<std::size_t>(rows * F));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < F; ++c) {
      const double g = x[r * 2 * F + c];
      y[r * F + c] = g / (1.0 + std::exp(-g)) * x[r * 2 * F + F + c];
    }
  }
  return y;
}
/// Rotate-half RoPE of the first `heads` heads of each row (position r % seq), in double with
/// the fp32 angle the convention defines (inv_freq and t·inv_freq in fp32, as HF Llama).
ref::Vec rope(ref::Vec x, std::int64_t rows, std::int64_t seq, std::int64_t stride,
              std::int64_t heads, std::int64_t hs, float theta) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < hs / 2; ++i) {
        const float f = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(hs));
        const double angle = static_cast<double>(static_cast<float>(r % seq) * f);
        double& a = x[r * stride + h * hs + i];
        double& b = x[r * stride + h * hs + i + hs / 2];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(angle) - b0 * std::sin(angle);
        b = b0 * std::cos(angle) + a0 * std::sin(angle);
      }
    }
  }
  return x;
}
}  // namespace

TEST(RMSNorm, GradientsMatchFiniteDifferencesOfDoubleReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::RMSNorm<float, Host> rms(ctx, "ln_1", 9);
  fw::test::check_layer_gradients(rms, {2, 3, 9}, [](const ref::Params& p, const ref::Vec& x) {
    return rmsnorm(x, p.at("ln_1.weight"), 6, 9);
  });
}

TEST(RMSNorm, NamesItsGainAndStartsAtOne) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::RMSNorm<float, Host> rms(ctx, "model.norm", 4, 1e-6f);
  EXPECT_EQ(rms.eps(), 1e-6f);
  EXPECT_EQ(rms.features(), 4);
  EXPECT_EQ((fw::RMSNorm<float, Host>(ctx, "n", 4).eps()), 1e-5f);
  int n = 0;
  rms.visit_parameters([&](fw::Parameter<float, Host>& p) {
    ++n;
    EXPECT_EQ(p.name, "model.norm.weight");
    EXPECT_FALSE(p.decay);
    ASSERT_EQ(p.numel(), 4);
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      EXPECT_EQ(p.weight[i], 1.0f);
      EXPECT_EQ(p.grad[i], 0.0f);
    }
  });
  EXPECT_EQ(n, 1);
  EXPECT_THROW((fw::RMSNorm<float, Host>(ctx, "bad", 0)), fw::ConfigError);
}

TEST(RMSNorm, StashHoldsOutputAndRstdAndBackwardClearsIt) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::RMSNorm<fw::bf16, Host> rms(ctx, "ln", 6);
  fw::Tensor<fw::bf16, Host> x({5, 6}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, x, fw::test::randn(30, 3));
  fw::RMSNorm<fw::bf16, Host>::Stash s;
  const auto y = rms.forward(ctx, x, s);
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_EQ(mem.current(fw::MemTag::activations), 5u * 6u * 2u + 5u * 4u);
  fw::Tensor<fw::bf16, Host> dy({5, 6}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, dy, fw::test::randn(30, 4));
  const auto dx = rms.backward(ctx, dy, s);
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(mem.current(fw::MemTag::activations), 0u);
  EXPECT_EQ(s.x.numel() + s.y.numel() + s.rstd.numel(), 0);
  EXPECT_THROW((void)rms.backward(ctx, dy, s), fw::ShapeError);  // no matching forward
}

TEST(SwiGLU, GradientsMatchFiniteDifferencesOfDoubleReference) {
  fw::SwiGLU<float, Host> sw;
  fw::test::check_layer_gradients(
      sw, {3, 2, 14}, [](const ref::Params&, const ref::Vec& x) { return swiglu(x, 6, 7); });
}

TEST(SwiGLU, HalvesTheLastDimensionHasNoParametersAndClearsItsStash) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::SwiGLU<float, Host> sw;
  int n = 0;
  sw.visit_parameters([&](auto&) { ++n; });
  EXPECT_EQ(n, 0);
  fw::Tensor<float, Host> x({2, 3, 10}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, x, fw::test::randn(60, 5));
  fw::SwiGLU<float, Host>::Stash s;
  const auto y = sw.forward(ctx, x, s);
  EXPECT_EQ(y.shape(), fw::Shape({2, 3, 5}));
  fw::Tensor<float, Host> dy({2, 3, 5}, fw::MemTag::workspace, mem);
  fw::test::upload(ctx, dy, fw::test::randn(30, 6));
  const auto dx = sw.backward(ctx, dy, s);
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(mem.current(fw::MemTag::activations), 0u);
  EXPECT_EQ(s.x.numel() + s.y.numel(), 0);
  fw::Tensor<float, Host> odd({2, 7}, fw::MemTag::workspace, mem);
  EXPECT_THROW((void)sw.forward(ctx, odd, s), fw::ShapeError);
}

// Llama's feed-forward: RMSNorm, a fused gate|up projection (C, 2F), SwiGLU, the down projection.
TEST(SwiGLU, LlamaFeedForwardCompositionMatchesTheReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  constexpr std::int64_t rows = 5, C = 6, F = 4;
  using Seq = fw::Sequential<fw::RMSNorm<float, Host>, fw::Linear<float, Host>,
                             fw::SwiGLU<float, Host>, fw::Linear<float, Host>>;
  Seq mlp(fw::RMSNorm<float, Host>(ctx, "ln_2", C),
          fw::Linear<float, Host>(ctx, "mlp.gate_up", C, 2 * F, 1, 0.02f, false),
          fw::SwiGLU<float, Host>{},
          fw::Linear<float, Host>(ctx, "mlp.down", F, C, 2, 0.02f, false));
  static_assert(fw::layer<Seq>);
  fw::test::check_layer_gradients(mlp, {rows, C}, [](const ref::Params& p, const ref::Vec& x) {
    const auto h = rmsnorm(x, p.at("ln_2.weight"), rows, C);
    const auto gu = ref::linear(h, p.at("mlp.gate_up.weight"), nullptr, rows, C, 2 * F);
    return ref::linear(swiglu(gu, rows, F), p.at("mlp.down.weight"), nullptr, rows, F, C);
  });
}

// A q|k|v projection whose q and k heads are rotated in place (heads = 2·NH, row_stride = 3·C),
// v left alone; L = <r, rotated qkv>. The gradient goes back through Rotary::backward (in place
// on dqkv) and the Linear, and is checked against central differences of the double reference
// for the input and both parameters.
TEST(Rotary, ComposedWithAQkvProjectionMatchesFiniteDifferences) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  constexpr std::int64_t B = 2, T = 3, C = 8, NH = 2, hs = C / NH, rows = B * T;
  constexpr float theta = 100.0f;  // a small base, so the second frequency turns visibly
  fw::Linear<float, Host> qkv(ctx, "attn.qkv", C, 3 * C, 11, 0.3f);
  fw::Rotary<float, Host> rot(hs, theta);
  EXPECT_EQ(rot.head_size(), hs);
  EXPECT_EQ(rot.theta(), theta);
  EXPECT_EQ((fw::Rotary<float, Host>(8).theta()), 10000.0f);
  ref::Params p = fw::test::randomize_parameters(ctx, qkv, 21);
  fw::zero_grad(ctx, qkv);
  fw::Tensor<float, Host> x({B, T, C}, fw::MemTag::activations, mem);
  ref::Vec xv = fw::test::randn(static_cast<std::size_t>(rows * C), 31);
  fw::test::upload(ctx, x, xv);

  const auto reference = [&](const ref::Params& pp, const ref::Vec& xx) {
    const auto y =
        ref::linear(xx, pp.at("attn.qkv.weight"), &pp.at("attn.qkv.bias"), rows, C, 3 * C);
    return rope(y, rows, T, 3 * C, 2 * NH, hs, theta);
  };
  fw::Linear<float, Host>::Stash s;
  fw::Tensor<float, Host> y = qkv.forward(ctx, x, s);
  rot.forward(ctx, y, T, 3 * C, 2 * NH);
  const ref::Vec want = reference(p, xv);
  ASSERT_TRUE(fw::test::close(fw::test::download(ctx, y), want, 2e-5, "rotated qkv"));
  // v is untouched: equal to the plain projection bit for bit
  const auto plain =
      ref::linear(xv, p.at("attn.qkv.weight"), &p.at("attn.qkv.bias"), rows, C, 3 * C);
  const auto got = fw::test::download(ctx, y);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 2 * C; c < 3 * C; ++c) {
      EXPECT_NEAR(got[r * 3 * C + c], plain[r * 3 * C + c], 1e-5) << r << "," << c;
    }
  }

  const ref::Vec rv = fw::test::randn(want.size(), 41);
  fw::Tensor<float, Host> dy(y.shape(), fw::MemTag::workspace, mem);
  fw::test::upload(ctx, dy, rv);
  rot.backward(ctx, dy, T, 3 * C, 2 * NH);
  const fw::Tensor<float, Host> dx = qkv.backward(ctx, dy, s);

  ref::Vec xfd = xv;
  EXPECT_TRUE(fw::test::close(
      fw::test::download(ctx, dx),
      ref::finite_difference(xfd, [&] { return ref::dot(reference(p, xfd), rv); }), 1e-4, "dx"));
  qkv.visit_parameters([&](fw::Parameter<float, Host>& prm) {
    ref::Vec& pv = p[prm.name];
    const ref::Vec wantg =
        ref::finite_difference(pv, [&] { return ref::dot(reference(p, xv), rv); });
    EXPECT_TRUE(fw::test::close(fw::test::download(ctx, prm.grad), wantg, 1e-4, "d " + prm.name));
  });
}

TEST(Rotary, RefusesBadShapes) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  EXPECT_THROW((fw::Rotary<float, Host>(7)), fw::ShapeError);
  EXPECT_THROW((fw::Rotary<float, Host>(0)), fw::ShapeError);
  fw::Rotary<float, Host> rot(4);
  fw::Tensor<float, Host> x({3, 10}, fw::MemTag::workspace, mem);
  EXPECT_THROW(rot.forward(ctx, x, 3, 7, 1), fw::ShapeError);   // 30 is not a multiple of 7
  EXPECT_THROW(rot.forward(ctx, x, 3, 10, 3), fw::ShapeError);  // 3 heads of 4 > 10
  EXPECT_THROW(rot.backward(ctx, x, 0, 10, 2), fw::ShapeError);
  EXPECT_NO_THROW(rot.forward(ctx, x, 3, 10, 2));
}
