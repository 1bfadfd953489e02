#include "fourway/optim/adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "toy_params.hpp"

namespace fw = fourway;

namespace {

// PyTorch's torch.optim.AdamW (single-tensor path) written out in double, one element at a time.
struct RefAdamW {
  double lr, beta1, beta2, eps, wd;
  void step(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
            const std::vector<double>& g, bool decay, int t) const {
    const double bc1 = 1.0 - std::pow(beta1, t);
    const double bc2 = 1.0 - std::pow(beta2, t);
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (decay) p[i] *= 1.0 - lr * wd;
      m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
      p[i] -= lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
    }
  }
};

template <class T>
std::vector<fw::StateSegment> segments_of(toy::Params<T>& ps) {
  std::vector<fw::StateSegment> segs;
  std::int64_t off = 0;
  ps.visit_parameters([&](auto& p) {
    segs.push_back({off, p.weight.numel(), p.decay});
    off += p.weight.numel();
  });
  return segs;
}

template <class T>
std::vector<fw::SegmentBinding<T>> bindings_of(toy::Params<T>& ps) {
  std::vector<fw::SegmentBinding<T>> b;
  ps.visit_parameters([&](auto& p) { b.push_back({p.weight.data(), p.grad.data()}); });
  return b;
}

template <class T>
class AdamWTyped : public ::testing::Test {};
using Types = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(AdamWTyped, Types);

// Five steps on odd-sized matrices and vectors, with fresh gradients and a grad_scale that folds a
// loss-scale undo and a clip coefficient: the fp32 state must follow the double reference.
TYPED_TEST(AdamWTyped, MatchesDoublePrecisionPyTorchAlgorithm) {
  using T = TypeParam;
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<T> ps(mem, {{7, 13}, {13}, {5, 3}, {1}, {3, 1, 4}}, 42);
  const fw::AdamWConfig cfg{
      .lr = 3e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  const fw::AdamW opt(cfg);
  fw::MasterState<T, fw::Host> state(ctx, segments_of(ps));
  std::size_t k = 0;
  ps.visit_parameters([&](auto& p) { state.init_master(ctx, k++, p.weight.data()); });

  // The reference starts from the same (already rounded) weights; zero moments.
  const RefAdamW ref{cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay};
  std::vector<std::vector<double>> p(ps.params.size()), m(p.size()), v(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto& w = ps.params[i].weight;
    for (std::int64_t e = 0; e < w.numel(); ++e) p[i].push_back(fw::convert<float>(w[e]));
    m[i].assign(p[i].size(), 0.0);
    v[i].assign(p[i].size(), 0.0);
  }
  const float grad_scale = 0.7f / 1024.0f;  // clip coefficient 0.7, loss scale 2^10
  for (int t = 1; t <= 5; ++t) {
    ps.randomize_grads(100 + t, 1024.0f);
    for (std::size_t i = 0; i < p.size(); ++i) {
      std::vector<double> g;
      const auto& gr = ps.params[i].grad;
      for (std::int64_t e = 0; e < gr.numel(); ++e) {
        g.push_back(static_cast<double>(fw::convert<float>(gr[e])) * grad_scale);
      }
      ref.step(p[i], m[i], v[i], g, ps.params[i].decay, t);
    }
    const auto b = bindings_of(ps);
    opt.update(ctx, state, std::span<const fw::SegmentBinding<T>>(b), cfg.lr, grad_scale);
    EXPECT_EQ(state.step(), t);
  }
  // fp32 arithmetic over 5 steps: each step's update is lr * O(1) with ~1e-7 relative rounding,
  // the weights are O(1); 2e-6 absolute leaves a 10x margin and still catches a wrong formula
  // (a missing bias correction or decay changes weights by >= 1e-3).
  for (std::size_t i = 0; i < p.size(); ++i) {
    for (std::size_t e = 0; e < p[i].size(); ++e) {
      const float master = fw::MasterState<T, fw::Host>::keeps_master
                               ? state.master(i)[e]
                               : fw::convert<float>(ps.params[i].weight[e]);
      ASSERT_NEAR(master, p[i][e], 2e-6) << "param " << i << " element " << e;
      ASSERT_NEAR(state.m(i)[e], m[i][e], 2e-6 * (1.0 + std::abs(m[i][e])));
      ASSERT_NEAR(state.v(i)[e], v[i][e], 2e-6 * (1.0 + v[i][e]));
      // The working copy is the master rounded to T, exactly.
      ASSERT_EQ(fw::convert<float>(ps.params[i].weight[e]),
                fw::convert<float>(fw::convert<T>(master)));
    }
  }
}

TEST(AdamW, WeightDecayOnlyOnDecaySegments) {
  // Zero gradients: the Adam part is 0/(0+eps) = 0, so only the decoupled decay moves weights.
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<float> ps(mem, {{3, 4}, {5}}, 7);
  ps.randomize_grads(1, 0.0f);
  std::vector<float> before;
  for (auto& prm : ps.params) {
    for (std::int64_t e = 0; e < prm.weight.numel(); ++e) before.push_back(prm.weight[e]);
  }
  const fw::AdamW opt({.lr = 0.5f, .weight_decay = 0.2f});
  fw::MasterState<float, fw::Host> state(ctx, segments_of(ps));
  const auto b = bindings_of(ps);
  opt.update(ctx, state, std::span<const fw::SegmentBinding<float>>(b), 0.5f, 1.0f);
  std::size_t k = 0;
  for (std::int64_t e = 0; e < 12; ++e, ++k) {
    EXPECT_FLOAT_EQ(ps.params[0].weight[e], before[k] * (1.0f - 0.5f * 0.2f));
  }
  for (std::int64_t e = 0; e < 5; ++e, ++k) EXPECT_EQ(ps.params[1].weight[e], before[k]);
}

TEST(AdamW, Fp32KeepsNoMasterCopy) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  fw::MasterState<float, fw::Host> state(ctx, {{0, 10, true}, {10, 3, false}});
  EXPECT_EQ(state.master(0), nullptr);
  EXPECT_EQ(mem.current(fw::MemTag::master_weights), 0u);
  EXPECT_EQ(mem.current(fw::MemTag::optimizer_state), 13u * 8u);
}

TEST(AdamW, RejectsBadConfigurationWithTheNumbers) {
  try {
    fw::AdamW opt({.beta1 = 1.0f});
    FAIL() << "beta1 = 1 accepted";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("beta1 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fw::AdamW({.lr = -1.0f}), fw::ConfigError);
  EXPECT_THROW(fw::AdamW({.eps = 0.0f}), fw::ConfigError);
  EXPECT_THROW(fw::AdamW({.weight_decay = -0.1f}), fw::ConfigError);
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  EXPECT_THROW((fw::MasterState<float, fw::Host>(ctx, {{0, 4, true}, {5, 3, false}})),
               fw::ConfigError);
  fw::MasterState<float, fw::Host> state(ctx, {{0, 4, true}});
  std::vector<fw::SegmentBinding<float>> none;
  EXPECT_THROW(
      fw::AdamW().update(ctx, state, std::span<const fw::SegmentBinding<float>>(none), 1e-3f, 1.0f),
      fw::ConfigError);
}

TEST(AdamW, ScheduleDrivesLearningRate) {
  const fw::AdamW constant({.lr = 0.25f});
  EXPECT_EQ(constant.lr_at(0), 0.25f);
  EXPECT_EQ(constant.lr_at(1000), 0.25f);
  const fw::AdamW warm({.lr = 1.0f}, fw::LrSchedule::warmup_cosine(1.0f, 4, 10));
  EXPECT_FLOAT_EQ(warm.lr_at(0), 0.25f);
  EXPECT_FLOAT_EQ(warm.lr_at(3), 1.0f);
}

}  // namespace
