// fw::check_gradients, the public checker of hand-written backward passes: fourway's own layers
// and GPT (at its looser float-loss tolerance) pass it, and a backward that is wrong in one place
// (a parameter's gradient 5% off, an input gradient 5% off, a bias gradient dropped) fails it with
// that tensor named.
#include "fourway/layers/gradient_check.hpp"

#include <gtest/gtest.h>

#include <string>

#include "fourway/backend/host/backend.hpp"
#include "fourway/layers/block.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/layers/layernorm.hpp"
#include "fourway/layers/linear.hpp"
#include "fourway/layers/mlp.hpp"
#include "support/gradcheck.hpp"
#include "support/util.hpp"

namespace fw = fourway;
using Host = fw::Host;

namespace {

/// What a correct float backward stays under, and a 5% error far exceeds (docs/layers.md).
constexpr double kTolerance = 1e-2;
/// A model's check differences a float loss, so it resolves less (see the test).
constexpr double kModelTolerance = 6e-2;

struct Env {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx{mem};
  fw::Tensor<float, Host> input(fw::Shape shape, std::uint64_t seed) {
    fw::Tensor<float, Host> x(shape, fw::MemTag::activations, mem);
    fw::test::upload(ctx, x, fw::test::randn(static_cast<std::size_t>(x.numel()), seed));
    return x;
  }
};

/// `L` with a backward that is wrong in one way: `param`'s gradient times `factor` (the input
/// gradient's when `param` is "input"; a zeroed gradient with factor 0).
template <class L>
struct Miswired {
  using value_type = typename L::value_type;
  using backend_type = typename L::backend_type;
  using Input = typename L::Input;
  using Stash = typename L::Stash;
  L inner;
  std::string param;
  float factor = 1.0f;

  fw::Tensor<float, Host> forward(const fw::Context<Host>& ctx, const Input& x, Stash& s) {
    return inner.forward(ctx, x, s);
  }
  fw::Tensor<float, Host> backward(const fw::Context<Host>& ctx, const fw::Tensor<float, Host>& dy,
                                   Stash& s) {
    fw::Tensor<float, Host> dx = inner.backward(ctx, dy, s);
    const auto scale = [&](const fw::Tensor<float, Host>& t) {
      for (std::int64_t i = 0; i < t.numel(); ++i) t[i] *= factor;
    };
    if (param == "input") scale(dx);
    inner.visit_parameters([&](fw::Parameter<float, Host>& p) {
      if (p.name == param) scale(p.grad);
    });
    return dx;
  }
  template <class F>
  void visit_parameters(F&& f) {
    inner.visit_parameters(f);
  }
};

}  // namespace

TEST(GradientCheck, FourwaysLayersPassWithEveryTensorNamed) {
  Env e;
  fw::Linear<float, Host> lin(e.ctx, "proj", 6, 5, 1);
  (void)fw::test::randomize_parameters(e.ctx, lin, 3);
  auto r = fw::check_gradients(e.ctx, lin, e.input({2, 3, 6}, 11));
  EXPECT_TRUE(r.within(kTolerance)) << r.str();
  ASSERT_EQ(r.tensors.size(), 3u) << r.str();
  EXPECT_EQ(r.tensors[0].name, "proj.weight");
  EXPECT_EQ(r.tensors[1].name, "proj.bias");
  EXPECT_EQ(r.tensors[2].name, "input");
  EXPECT_EQ(r.tensors[0].checked, 24);  // 30 elements: the default 24 samples
  EXPECT_EQ(r.tensors[1].checked, 5);   // all of a small tensor

  fw::LayerNorm<float, Host> ln(e.ctx, "ln_1", 8);
  (void)fw::test::randomize_parameters(e.ctx, ln, 4);
  r = fw::check_gradients(e.ctx, ln, e.input({3, 8}, 12));
  EXPECT_TRUE(r.within(kTolerance)) << r.str();

  fw::Mlp<float, Host> mlp(e.ctx, "h.0.mlp", 6, fw::Init{});
  (void)fw::test::randomize_parameters(e.ctx, mlp, 5, 0.2);
  r = fw::check_gradients(e.ctx, mlp, e.input({2, 3, 6}, 13));
  EXPECT_TRUE(r.within(kTolerance)) << r.str();

  fw::TransformerBlock<float, Host> blk(e.ctx, "h.0", 8, 2, fw::Init{});
  (void)fw::test::randomize_parameters(e.ctx, blk, 6, 0.2);
  r = fw::check_gradients(e.ctx, blk, e.input({2, 4, 8}, 14));
  EXPECT_TRUE(r.within(kTolerance)) << r.str();
  EXPECT_EQ(r.tensors.size(), 13u) << r.str();  // 12 parameters and the input
}

TEST(GradientCheck, AGptPassesOnItsLoss) {
  Env e;
  fw::models::Gpt<float, Host> gpt(
      e.ctx, fw::models::GptConfig{.layers = 2, .heads = 2, .dim = 8, .vocab = 10, .max_seq = 4},
      1);
  fw::Tensor<std::int32_t, Host> tokens(fw::Shape{2, 4}, fw::MemTag::activations, e.mem);
  fw::Tensor<std::int32_t, Host> targets(fw::Shape{2, 4}, fw::MemTag::activations, e.mem);
  for (std::int64_t i = 0; i < 8; ++i) {
    tokens[i] = static_cast<std::int32_t>((3 * i + 1) % 10);
    targets[i] = static_cast<std::int32_t>((7 * i + 2) % 10);
  }
  (void)fw::test::randomize_parameters(e.ctx, gpt, 8, 0.5);
  fw::NoHooks hooks;
  fw::GradientCheckOptions o;
  o.step = 3e-3;
  const auto r = fw::check_gradients(e.ctx, gpt, tokens, targets, hooks, o);
  // the loss is a float: its rounding unit over the step (2.4e-7 / 6e-3 = 4e-5) is the finite
  // differences' resolution, a few percent of the smaller gradients here (docs/layers.md)
  EXPECT_TRUE(r.within(kModelTolerance)) << r.str();
  EXPECT_EQ(r.tensors.size(), 2u + 12u * 2 + 2u) << r.str();  // wte, wpe, 12 per block, ln_f
  EXPECT_EQ(r.tensors.front().name, "wte.weight");
}

TEST(GradientCheck, AWrongBackwardFailsNamingTheTensor) {
  struct Case {
    std::string param;
    float factor;
  };
  for (const Case& c :
       {Case{"proj.weight", 1.05f}, Case{"proj.bias", 0.0f}, Case{"input", 0.95f}}) {
    SCOPED_TRACE(c.param);
    Env e;
    Miswired<fw::Linear<float, Host>> bad{fw::Linear<float, Host>(e.ctx, "proj", 6, 5, 1), c.param,
                                          c.factor};
    (void)fw::test::randomize_parameters(e.ctx, bad.inner, 3);
    const auto r = fw::check_gradients(e.ctx, bad, e.input({2, 3, 6}, 11));
    EXPECT_FALSE(r.within(kTolerance)) << r.str();
    EXPECT_EQ(r.worst().name, c.param) << r.str();
    EXPECT_GT(r.worst().error, 4e-2) << r.str();
    for (const auto& t : r.tensors) {  // the other tensors still pass
      if (t.name != c.param) {
        EXPECT_LE(t.error, kTolerance) << r.str();
      }
    }
  }
}
