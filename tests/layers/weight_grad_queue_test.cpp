// The split backward (layers/weight_grad_queue.hpp): under `DeferWeightGrads` a Linear's backward
// gives the whole input gradient and leaves the weight gradient untouched until the queue runs;
// then the weight gradient equals the double-loop xᵀ·dy (Linear) and the fused backward's bit for
// bit (a GPT with and without checkpointing; wte, whose two parts add in the other order, within
// 1e-6).
#include "fourway/layers/weight_grad_queue.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fourway/layers/gpt.hpp"
#include "fourway/layers/linear.hpp"

namespace fw = fourway;
using Host = fw::Host;

namespace {

std::vector<float> host_values(const fw::Tensor<float, Host>& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) v[static_cast<std::size_t>(i)] = t[i];
  return v;
}

void fill(fw::Tensor<float, Host>& t, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = u(g);
}

void expect_close(const std::vector<double>& want, const std::vector<float>& got, double tol,
                  const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << "[" << i << "]";
}

}  // namespace

TEST(WeightGradQueue, LinearDefersOnlyTheWeightGradient) {
  constexpr std::int64_t rows = 6, in = 5, out = 7;
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::Linear<float, Host> lin(ctx, "proj", in, out, 3);
  fw::Tensor<float, Host> x({2, 3, in}, fw::MemTag::workspace, mem);
  fw::Tensor<float, Host> dy({2, 3, out}, fw::MemTag::workspace, mem);
  fill(x, 1);
  fill(dy, 2);
  fill(lin.weight().grad, 4);  // accumulation: W must add, not overwrite
  const auto w = host_values(lin.weight().weight);
  const auto g0 = host_values(lin.weight().grad);
  const auto xv = host_values(x);
  const auto dyv = host_values(dy);

  // independent expectations, in double: dx = dy·Wᵀ, dW = g0 + xᵀ·dy, db = Σ_rows dy
  std::vector<double> dx_want(rows * in), dw_want(in * out), db_want(out, 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < in; ++i) {
      double s = 0.0;
      for (std::int64_t o = 0; o < out; ++o) s += double(dyv[r * out + o]) * w[i * out + o];
      dx_want[r * in + i] = s;
    }
  for (std::int64_t i = 0; i < in; ++i)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = g0[i * out + o];
      for (std::int64_t r = 0; r < rows; ++r) s += double(xv[r * in + i]) * dyv[r * out + o];
      dw_want[i * out + o] = s;
    }
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) db_want[o] += dyv[r * out + o];

  fw::WeightGradQueue<float, Host> q;
  fw::Linear<float, Host>::Stash s;
  (void)lin.forward(ctx, x, s);
  const std::size_t before = mem.current(fw::MemTag::activations) - rows * out * 4;  // minus y
  fw::Tensor<float, Host> dx;
  {
    fw::DeferWeightGrads<float, Host> scope(q);
    dx = lin.backward(ctx, dy, s);
  }
  EXPECT_EQ((fw::DeferWeightGrads<float, Host>::active()), nullptr);
  expect_close(dx_want, host_values(dx), 1e-6, "dx after B");
  expect_close(db_want, host_values(lin.bias().grad), 1e-6, "bias grad after B");
  EXPECT_EQ(host_values(lin.weight().grad), g0) << "B touched the weight gradient";
  ASSERT_EQ(q.size(), 1u);
  // W keeps copies of x and dy, counted as activations: the caller may free x and dy now
  EXPECT_EQ(q.bytes(), (rows * in + rows * out) * 4);
  EXPECT_EQ(mem.current(fw::MemTag::activations), before + (rows * in + rows * out) * 4);
  fill(x, 5);
  fill(dy, 6);
  q.run(ctx);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(mem.current(fw::MemTag::activations), before);
  expect_close(dw_want, host_values(lin.weight().grad), 1e-6, "weight grad after W");
}

namespace {

std::map<std::string, std::vector<float>> gpt_grads(
    bool checkpoint, bool split, std::map<std::string, std::vector<float>>* after_b = nullptr,
    int classifier_chunk = 0) {
  fw::models::GptConfig cfg{2, 2, 16, 29, 8};
  cfg.checkpoint = checkpoint;
  cfg.classifier_chunk = classifier_chunk;
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::models::Gpt<float, Host> gpt(ctx, cfg, 11);
  fw::zero_grad(ctx, gpt);
  constexpr std::int64_t B = 2, T = 7;
  fw::Tensor<std::int32_t, Host> tok({B, T}, fw::MemTag::workspace, mem);
  fw::Tensor<std::int32_t, Host> tgt({B, T}, fw::MemTag::workspace, mem);
  std::mt19937_64 g(13);
  std::map<std::string, std::vector<float>> out;
  fw::WeightGradQueue<float, Host> q;
  for (int mb = 0; mb < 2; ++mb) {  // two micro-batches: W accumulates onto the first's grads
    for (std::int64_t i = 0; i < B * T; ++i) {
      tok[i] = static_cast<std::int32_t>(g() % 29);
      tgt[i] = static_cast<std::int32_t>(g() % 29);
    }
    fw::models::Gpt<float, Host>::Stash s;
    (void)gpt.forward(ctx, tok, tgt, s);
    if (!split) {
      gpt.backward(ctx, s, 0.5f);
      continue;
    }
    {
      fw::DeferWeightGrads<float, Host> scope(q);
      gpt.backward(ctx, s, 0.5f);
    }
    // four Linears per block, and the head once per chunk of its 14 rows
    const std::size_t head_chunks =
        classifier_chunk == 0 ? 1 : (B * T + classifier_chunk - 1) / classifier_chunk;
    EXPECT_EQ(q.size(), 4u * 2u + head_chunks);
    if (after_b != nullptr && mb == 0)
      gpt.visit_parameters(
          [&](fw::Parameter<float, Host>& p) { (*after_b)[p.name] = host_values(p.grad); });
    q.run(ctx);
  }
  EXPECT_EQ(mem.current(fw::MemTag::activations), 0u);
  gpt.visit_parameters([&](fw::Parameter<float, Host>& p) { out[p.name] = host_values(p.grad); });
  return out;
}

bool is_matrix_of_a_linear(const std::string& name) {
  return name.find(".c_") != std::string::npos && name.ends_with(".weight");
}

}  // namespace

TEST(WeightGradQueue, GptSplitBackwardEqualsTheFusedBackward) {
  // the head's logits kept whole, or 5 rows at a time (the fused classifier: one W per chunk)
  for (const auto& [checkpoint, chunk] :
       std::vector<std::pair<bool, int>>{{false, 0}, {true, 0}, {false, 5}}) {
    SCOPED_TRACE(::testing::Message() << (checkpoint ? "checkpointing" : "no checkpointing")
                                      << ", classifier_chunk " << chunk);
    std::map<std::string, std::vector<float>> after_b;
    const auto fused = gpt_grads(checkpoint, false, nullptr, chunk);
    const auto split = gpt_grads(checkpoint, true, &after_b, chunk);
    ASSERT_EQ(fused.size(), split.size());
    int linears = 0;
    for (const auto& [name, want] : fused) {
      const auto& got = split.at(name);
      if (name == "wte.weight") {  // head part (W) and embedding part (B) add in the other order
        std::vector<double> w(want.begin(), want.end());
        expect_close(w, got, 1e-6, name);
      } else {
        EXPECT_EQ(got, want) << name << " differs from the fused backward";
      }
      if (is_matrix_of_a_linear(name)) {
        ++linears;
        const auto& b = after_b.at(name);
        EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](float v) { return v == 0.0f; }))
            << name << " got its gradient in B";
      }
    }
    EXPECT_EQ(linears, 8);
    // LayerNorms and biases are complete after B
    EXPECT_NE(after_b.at("h.0.ln_1.weight"), std::vector<float>(16, 0.0f));
    EXPECT_NE(after_b.at("h.1.mlp.c_fc.bias"), std::vector<float>(64, 0.0f));
  }
}
