#include "fourway/optim/precision.hpp"

#include <gtest/gtest.h>

#include "toy_params.hpp"

namespace fw = fourway;

namespace {

static_assert(fw::precision_policy<fw::Precision<fw::bf16>>);
static_assert(!fw::precision_policy<fw::bf16>);
static_assert(fw::Precision<fw::fp16>::loss_scaling && !fw::Precision<fw::bf16>::loss_scaling &&
              !fw::Precision<float>::loss_scaling);
static_assert(fw::Precision<fw::bf16>::keeps_master && !fw::Precision<float>::keeps_master);

template <class T>
class PrecisionTyped : public ::testing::Test {};
using Types = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(PrecisionTyped, Types);

// The seed's budget, measured: a model's weights and grads plus the optimizer state of all its
// parameters, per tag, from the accountant. Odd sizes so no alignment can round anything.
TYPED_TEST(PrecisionTyped, SixteenBytesPerParameterInTheAccountant) {
  using T = TypeParam;
  using P = fw::Precision<T>;
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<T> ps(mem, {{17, 5}, {5}, {3, 11}, {1}}, 3);
  std::vector<fw::StateSegment> segs;
  std::int64_t off = 0;
  for (auto& p : ps.params) {
    segs.push_back({off, p.weight.numel(), p.decay});
    off += p.weight.numel();
  }
  fw::MasterState<T, fw::Host> state(ctx, segs);
  const auto n = static_cast<std::size_t>(ps.numel());
  ASSERT_EQ(n, 85u + 5u + 33u + 1u);
  EXPECT_EQ(mem.current(fw::MemTag::weights), n * sizeof(T));
  EXPECT_EQ(mem.current(fw::MemTag::grads), n * sizeof(T));
  EXPECT_EQ(mem.current(fw::MemTag::master_weights), P::keeps_master ? n * 4 : 0u);
  EXPECT_EQ(mem.current(fw::MemTag::optimizer_state), n * 8);
  EXPECT_EQ(mem.total_current(), n * 16);
  EXPECT_EQ(P::bytes_per_param, 16u);
}

TYPED_TEST(PrecisionTyped, MasterStartsAsTheWorkingWeightsAndMomentsAtZero) {
  using T = TypeParam;
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<T> ps(mem, {{4, 3}, {7}}, 11);
  fw::MasterState<T, fw::Host> state(ctx, {{0, 12, true}, {12, 7, false}});
  for (std::size_t i = 0; i < 2; ++i) state.init_master(ctx, i, ps.params[i].weight.data());
  EXPECT_EQ(state.numel(), 19);
  EXPECT_EQ(state.step(), 0);
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::int64_t e = 0; e < ps.params[i].weight.numel(); ++e) {
      if constexpr (fw::Precision<T>::keeps_master) {
        EXPECT_EQ(state.master(i)[e], fw::convert<float>(ps.params[i].weight[e]));
      }
      EXPECT_EQ(state.m(i)[e], 0.0f);
      EXPECT_EQ(state.v(i)[e], 0.0f);
    }
  }
}

}  // namespace
