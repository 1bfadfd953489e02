#include "fourway/layers/linear.hpp"

#include <gtest/gtest.h>

#include "support/gradcheck.hpp"

namespace fw = fourway;
namespace ref = fw::test::ref;
using Host = fw::Host;

TEST(Linear, GradientsMatchFiniteDifferencesOfDoubleReference) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Linear<float, Host> lin(ctx, "proj", 5, 7, 1);
  fw::test::check_layer_gradients(lin, {2, 3, 5}, [](const ref::Params& p, const ref::Vec& x) {
    return ref::linear(x, p.at("proj.weight"), &p.at("proj.bias"), 6, 5, 7);
  });
}

TEST(Linear, WithoutBias) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Linear<float, Host> lin(ctx, "w", 4, 3, 1, 0.02f, /*bias=*/false);
  int n = 0;
  lin.visit_parameters([&](auto&) { ++n; });
  EXPECT_EQ(n, 1);
  fw::test::check_layer_gradients(lin, {5, 4}, [](const ref::Params& p, const ref::Vec& x) {
    return ref::linear(x, p.at("w.weight"), nullptr, 5, 4, 3);
  });
}

TEST(Linear, ParametersAreNamedTaggedAndDecayedAsGpt2) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Linear<float, Host> lin(ctx, "h.0.attn.c_attn", 8, 24, 1);
  std::vector<std::string> names;
  std::vector<bool> decay;
  lin.visit_parameters([&](fw::Parameter<float, Host>& p) {
    names.push_back(p.name);
    decay.push_back(p.decay);
  });
  EXPECT_EQ(names, (std::vector<std::string>{"h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias"}));
  EXPECT_EQ(decay, (std::vector<bool>{true, false}));
  EXPECT_EQ(lin.weight().weight.shape(), (fw::Shape{8, 24}));  // (in, out), HF Conv1D layout
  EXPECT_EQ(mem.current(fw::MemTag::weights), (8u * 24u + 24u) * 4u);
  EXPECT_EQ(mem.current(fw::MemTag::grads), (8u * 24u + 24u) * 4u);
}

TEST(Linear, RejectsAnInputOfTheWrongWidth) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Linear<float, Host> lin(ctx, "w", 4, 3, 1);
  fw::Tensor<float, Host> x({2, 5}, fw::MemTag::activations, mem);
  fw::Linear<float, Host>::Stash s;
  EXPECT_THROW((void)lin.forward(ctx, x, s), fw::ShapeError);
  EXPECT_THROW((fw::Linear<float, Host>(ctx, "w", 0, 3, 1)), fw::ConfigError);
}

TEST(Linear, ReadsParametersThroughTheirTensorsAtEveryCall) {
  // A parallel wrapper may rebind weight to a view of another buffer: the layer must use it.
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Linear<float, Host> lin(ctx, "w", 2, 2, 1, 0.02f, false);
  fw::Tensor<float, Host> flat({4}, fw::MemTag::weights, mem);
  for (int i = 0; i < 4; ++i) flat[i] = static_cast<float>(i + 1);  // W = [[1,2],[3,4]]
  lin.weight().weight = flat.view({2, 2});
  fw::Tensor<float, Host> x({1, 2}, fw::MemTag::activations, mem);
  x[0] = 1.0f;
  x[1] = -1.0f;
  fw::Linear<float, Host>::Stash s;
  auto y = lin.forward(ctx, x, s);
  EXPECT_EQ(y[0], -2.0f);
  EXPECT_EQ(y[1], -2.0f);
}
