// SingleRank, the reference strategy: grads zeroed per step, global norm and clip coefficient as
// clip_grad_norm_ computes them, the loss scale divided out, skip on inf/NaN with nothing touched.
#include "fourway/train/strategy.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "optim/toy_params.hpp"

namespace fw = fourway;

namespace {

template <class T>
using Single = fw::SingleRank<toy::Params<T>, fw::Precision<T>, fw::Host>;

// The concept needs a model type only through `model()`; the toy parameters are enough here.
static_assert(fw::training_strategy<Single<float>>);
static_assert(fw::training_strategy<Single<fw::fp16>>);

template <class T>
std::vector<float> weights_of(toy::Params<T>& ps) {
  std::vector<float> w;
  for (auto& p : ps.params) {
    for (std::int64_t e = 0; e < p.numel(); ++e) w.push_back(fw::convert<float>(p.weight[e]));
  }
  return w;
}

template <class T>
class SingleRankTyped : public ::testing::Test {};
using Types = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(SingleRankTyped, Types);

// Gradients that carry a loss scale of 2^6, clipped to a third of their norm: the strategy must
// report the unscaled norm and apply AdamW to grad * coef / S, coef from the double formula.
TYPED_TEST(SingleRankTyped, ClipsOnTheUnscaledGlobalNormAndUpdates) {
  using T = TypeParam;
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  const std::vector<fw::Shape> shapes = {{6, 5}, {5}, {3, 7}};
  toy::Params<T> ps(mem, shapes, 21);
  toy::Params<T> twin(mem, shapes, 21);  // same weights, updated by AdamW directly
  const float S = 64.0f;
  ps.randomize_grads(5, S);
  twin.randomize_grads(5, S);
  double ss = 0.0;
  for (auto& p : ps.params) {
    for (std::int64_t e = 0; e < p.numel(); ++e) {
      const double g = fw::convert<float>(p.grad[e]);
      ss += g * g;
    }
  }
  const double norm = std::sqrt(ss) / S;
  const fw::AdamWConfig cfg{
      .lr = 1e-2f, .weight_decay = 0.1f, .max_grad_norm = static_cast<float>(norm / 3.0)};
  Single<T> strategy(ctx, ps, fw::AdamW(cfg));
  const auto r = strategy.finish_step({.lr = cfg.lr, .loss_scale = S, .check_finite = true});
  EXPECT_FALSE(r.found_inf);
  EXPECT_FALSE(r.skipped);
  EXPECT_NEAR(r.grad_norm, norm, 1e-12 * norm);
  const double coef = static_cast<double>(cfg.max_grad_norm) / (norm + 1e-6);
  EXPECT_NEAR(r.clip_coef, coef, 1e-7 * coef);
  EXPECT_EQ(strategy.state().step(), 1);

  fw::MasterState<T, fw::Host> state(ctx, {{0, 30, true}, {30, 5, false}, {35, 21, true}});
  std::vector<fw::SegmentBinding<T>> b;
  for (std::size_t i = 0; i < twin.params.size(); ++i) {
    state.init_master(ctx, i, twin.params[i].weight.data());
    b.push_back({twin.params[i].weight.data(), twin.params[i].grad.data()});
  }
  fw::AdamW(cfg).update(ctx, state, b, cfg.lr, r.clip_coef / S);
  EXPECT_EQ(weights_of(ps), weights_of(twin));
}

// An inf (or NaN) anywhere: the step is skipped and masters, moments, step count and working
// weights are bitwise what they were.
TYPED_TEST(SingleRankTyped, SkipsOnInfOrNanWithEverythingUnchanged) {
  using T = TypeParam;
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<T> ps(mem, {{4, 9}, {9}}, 3);
  Single<T> strategy(ctx, ps, fw::AdamW({.lr = 1e-2f, .max_grad_norm = 1.0f}));
  (void)strategy.finish_step({.lr = 1e-2f, .loss_scale = 1.0f, .check_finite = true});
  ASSERT_EQ(strategy.state().step(), 1);
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    const auto& st = strategy.state();
    const auto n = static_cast<std::size_t>(st.numel());
    std::vector<float> m(st.first_moments().data(), st.first_moments().data() + n);
    std::vector<float> v(st.second_moments().data(), st.second_moments().data() + n);
    std::vector<float> master;
    if (st.keeps_master) master.assign(st.masters().data(), st.masters().data() + n);
    const auto w = weights_of(ps);
    ps.randomize_grads(9, 1.0f);
    ps.params[1].grad[4] = fw::convert<T>(bad);
    const auto r = strategy.finish_step({.lr = 1e-2f, .loss_scale = 1.0f, .check_finite = true});
    EXPECT_TRUE(r.found_inf);
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(st.step(), 1);
    EXPECT_EQ(0, std::memcmp(m.data(), st.first_moments().data(), n * 4));
    EXPECT_EQ(0, std::memcmp(v.data(), st.second_moments().data(), n * 4));
    if (st.keeps_master) {
      EXPECT_EQ(0, std::memcmp(master.data(), st.masters().data(), n * 4));
    }
    const auto w2 = weights_of(ps);
    EXPECT_EQ(0, std::memcmp(w.data(), w2.data(), w.size() * 4));
  }
}

// Without the check (fp32, bf16) a non-finite gradient is not hidden: as in PyTorch, the norm
// is reported non-finite and the update poisons the weights, for the user to see.
TEST(SingleRank, WithoutTheCheckNonFiniteIsNotHidden) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<float> ps(mem, {{3, 3}}, 1);
  ps.params[0].grad[2] = std::numeric_limits<float>::infinity();
  Single<float> strategy(ctx, ps, fw::AdamW({.max_grad_norm = 1.0f}));
  const auto r = strategy.finish_step({.lr = 1e-3f});
  EXPECT_FALSE(r.skipped);
  EXPECT_TRUE(std::isinf(r.grad_norm));
  EXPECT_TRUE(std::isnan(ps.params[0].weight[0]));
}

TEST(SingleRank, BeginStepZeroesGradients) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<fw::bf16> ps(mem, {{2, 3}, {3}}, 4);
  Single<fw::bf16> strategy(ctx, ps);
  strategy.begin_step();
  for (auto& p : ps.params) {
    for (std::int64_t e = 0; e < p.numel(); ++e) EXPECT_EQ(p.grad[e].bits, 0);
  }
  EXPECT_EQ(strategy.dp_rank(), 0);
  EXPECT_EQ(strategy.dp_size(), 1);
  // one rank: the group's loss sum is this rank's, passed through skipped and applied steps
  EXPECT_EQ(strategy.finish_step({.lr = 0.0f, .loss_sum = 2.5}).loss_sum, 2.5);
  EXPECT_EQ(strategy.finish_step({.lr = 0.0f, .check_finite = true, .loss_sum = 3.5}).loss_sum,
            3.5);
}

}  // namespace
