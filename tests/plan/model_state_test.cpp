#include "fourway/plan/model_state.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace fw = fourway;
namespace fp = fourway::plan;

// Usable in constant expressions: a plan can be a compile-time fact.
static_assert(fp::model_state_bytes(1000, fp::Precision::bf16, 3, 7).total() == 143 * 16);
static_assert(fp::Optimizer::adam().k(fp::Precision::bf16) == 12);
static_assert(fp::Optimizer::adam().k(fp::Precision::fp32) == 8);

// Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", Figure 1: a 7.5B-parameter model, N_d = 64, K = 12: 120 GB baseline, 31.4 GB (P_os),
// 16.6 GB (P_os+g), 1.9 GB (P_os+g+p). The paper prints one decimal; GB = 1e9 B.
TEST(PlanModelState, ZeroPaperFigure1SevenPointFiveBillionOn64Gpus) {
  const double psi = 7.5e9;
  const double printed[4] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    const double gb = fp::zero_paper_bytes(psi, stage, 64) / 1e9;
    EXPECT_NEAR(gb, printed[stage], 0.05) << "stage " << stage;  // the paper rounds to 0.1 GB
  }
  // The integer model, fp16, Ψ divisible by 64: the same bytes exactly, tag by tag summed.
  const double exact[4] = {120e9, 30e9 + 12 * 7.5e9 / 64, 15e9 + 14 * 7.5e9 / 64, 16 * 7.5e9 / 64};
  for (int stage = 0; stage <= 3; ++stage) {
    const auto b =
        fp::model_state_bytes(7'500'000'000, fp::Precision::fp16, stage, 64, fp::Padding::exact());
    EXPECT_EQ(static_cast<double>(b.total()), exact[stage]) << "stage " << stage;
    EXPECT_EQ(static_cast<double>(b.total()), fp::zero_paper_bytes(psi, stage, 64));
  }
}

// The seed and the issue: a 70B model holds ~1.1 TB of mixed-precision Adam state (16 B per
// parameter: 2 weights + 2 gradients + 4 master + 8 moments).
TEST(PlanModelState, SeventyBillionParametersIsAboutOnePointOneTerabytes) {
  const auto b = fp::model_state_bytes(70'000'000'000, fp::Precision::bf16, 0, 1);
  EXPECT_EQ(b.weights, 140'000'000'000);
  EXPECT_EQ(b.grads, 140'000'000'000);
  EXPECT_EQ(b.master_weights, 280'000'000'000);
  EXPECT_EQ(b.optimizer_state, 560'000'000'000);
  EXPECT_EQ(b.total(), 1'120'000'000'000);
  EXPECT_NEAR(static_cast<double>(b.total()) / 1e12, 1.1, 0.05);
}

// docs/design.md, the memory law with padding, for random group sizes and counts that do not
// divide: 16Ψ -> 4Ψ' + 12Ψ'/N -> 2Ψ' + 14Ψ'/N -> 16Ψ'/N in bf16 with Ψ'/N := ceil(Ψ/N), Ψ' :=
// N·ceil(Ψ/N) (stage 0 shards nothing and pads nothing).
TEST(PlanModelState, ZeroLawWithFlatPaddingForRandomCounts) {
  std::mt19937_64 gen(8);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t psi = std::uniform_int_distribution<std::int64_t>(1, 50'000'000)(gen);
    const int n = std::uniform_int_distribution<int>(1, 97)(gen);
    std::int64_t shard = psi / n;
    if (shard * n < psi) ++shard;
    const std::int64_t full = shard * n;
    const std::int64_t expect[4] = {16 * psi, 4 * full + 12 * shard, 2 * full + 14 * shard,
                                    16 * shard};
    for (int stage = 0; stage <= 3; ++stage) {
      EXPECT_EQ(fp::model_state_bytes(psi, fp::Precision::bf16, stage, n).total(), expect[stage])
          << "psi " << psi << " n " << n << " stage " << stage;
    }
    // fp32: 4 weights + 4 gradients + 8 moments, no master copy.
    const auto s0 = fp::model_state_bytes(psi, fp::Precision::fp32, 0, n);
    const auto s2 = fp::model_state_bytes(psi, fp::Precision::fp32, 2, n);
    EXPECT_EQ(s0, (fp::ModelStateBytes{4 * psi, 4 * psi, 0, 8 * psi}));
    EXPECT_EQ(s2, (fp::ModelStateBytes{4 * full, 4 * shard, 0, 8 * shard}));
  }
}

TEST(PlanModelState, PerUnitPaddingPadsEachUnitOnItsOwn) {
  const std::vector<std::int64_t> units = {5, 7, 11};  // 23 parameters
  EXPECT_EQ(fp::shard_elements(23, 4, fp::Padding::per_unit(units)), 2 + 2 + 3);
  EXPECT_EQ(fp::shard_elements(23, 4, fp::Padding::flat()), 6);
  const auto b = fp::model_state_bytes(23, fp::Precision::bf16, 3, 4, fp::Padding::per_unit(units));
  EXPECT_EQ(b, (fp::ModelStateBytes{7 * 2, 7 * 2, 7 * 4, 7 * 8}));
  const auto b1 =
      fp::model_state_bytes(23, fp::Precision::bf16, 1, 4, fp::Padding::per_unit(units));
  EXPECT_EQ(b1, (fp::ModelStateBytes{28 * 2, 28 * 2, 7 * 4, 7 * 8}));
}

TEST(PlanModelState, OneRankHasNoPadding) {
  const auto b = fp::model_state_bytes(124'439'808, fp::Precision::bf16, 3, 1);
  EXPECT_EQ(b.total(), 16 * 124'439'808LL);
}

TEST(PlanModelState, KIsConfigurable) {
  const fp::Optimizer sgd_momentum{4};
  EXPECT_EQ(sgd_momentum.k(fp::Precision::bf16), 8);
  const auto b =
      fp::model_state_bytes(1000, fp::Precision::bf16, 0, 1, fp::Padding::flat(), sgd_momentum);
  EXPECT_EQ(b.total(), 12 * 1000);
  EXPECT_DOUBLE_EQ(fp::zero_paper_bytes(1000, 1, 4, 8), 4000 + 8 * 1000 / 4.0);
}

TEST(PlanModelState, BadInputIsAConfigErrorNamingTheNumbers) {
  try {
    (void)fp::model_state_bytes(1000, fp::Precision::bf16, 5, 4);
    FAIL() << "stage 5 accepted";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ZeRO stage 5 does not exist"), std::string::npos)
        << e.what();
  }
  try {
    (void)fp::model_state_bytes(1001, fp::Precision::bf16, 1, 4, fp::Padding::exact());
    FAIL() << "1001 / 4 accepted without padding";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("1001 parameters do not divide by 4"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)fp::model_state_bytes(1000, fp::Precision::bf16, 1, 0), fw::ConfigError);
  const std::vector<std::int64_t> units = {1, 2};
  EXPECT_THROW((void)fp::shard_elements(4, 2, fp::Padding::per_unit(units)), fw::ConfigError);
}
