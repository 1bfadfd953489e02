#include "fourway/plan/runtime_model_state.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "fourway/plan/communication.hpp"

namespace fw = fourway;
namespace fp = fourway::plan;

namespace {
const fp::Architecture odd = fp::gpt2_shape(3, 35, 5, 97, 23);
}

TEST(PlanFourwayModelState, BackwardOrderCoversEveryParameterOnce) {
  const auto n = fp::gpt2_backward_numels(odd);
  ASSERT_EQ(n.size(), 2u + 3u * 12u + 2u);
  EXPECT_EQ(std::accumulate(n.begin(), n.end(), std::int64_t{0}), fp::total_params(odd));
  EXPECT_EQ(n[0], 35);                  // ln_f.bias first: its gradient is final first
  EXPECT_EQ(n[3], 35 * 4 * 35);         // h.2.mlp.c_proj.weight
  EXPECT_EQ(n[n.size() - 2], 23 * 35);  // wpe
  EXPECT_EQ(n.back(), 97 * 35);         // wte last: the embedding's backward completes it
  EXPECT_THROW((void)fp::gpt2_backward_numels(fp::llama2_7b), fw::ConfigError);
}

TEST(PlanFourwayModelState, SegmentsAreBucketsOrUnits) {
  EXPECT_EQ(fp::runtime_segments(odd, 3, 512, fp::Precision::fp32), fp::fsdp_units(odd));
  const auto one = fp::runtime_segments(odd, 1, 1LL << 30, fp::Precision::fp32);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], fp::total_params(odd));
  // 512-byte buckets of fp32: each holds at most 128 elements unless one parameter is larger.
  const auto many = fp::runtime_segments(odd, 2, 512, fp::Precision::fp32);
  EXPECT_GT(many.size(), 10u);
  EXPECT_EQ(std::accumulate(many.begin(), many.end(), std::int64_t{0}), fp::total_params(odd));
}

TEST(PlanFourwayModelState, PaddingPerSegment) {
  const std::int64_t psi = fp::total_params(odd);
  // Stage 0 pads nothing: 16 B per parameter.
  EXPECT_EQ(fp::runtime_model_state_bytes(odd, fp::Precision::bf16, 0, 4).total(), 16 * psi);
  // Stage 3 pads each unit: Σ ceil(unit / N) elements per rank, 16 B each.
  std::int64_t shard = 0;
  for (auto u : fp::fsdp_units(odd)) shard += (u + 3) / 4;
  EXPECT_EQ(fp::runtime_model_state_bytes(odd, fp::Precision::bf16, 3, 4).total(), 16 * shard);
  EXPECT_GT(16 * shard, 16 * ((psi + 3) / 4));  // more than the flat padding: units pad apart
}

// With one bucket the runtime's stage 0-2 traffic is the published volume (communication.hpp)
// plus the scalar reductions; stage 3 adds the tied embedding's second gather.
TEST(PlanFourwayModelState, TrafficAgainstThePublishedVolumes) {
  const fp::Link link{100.0, 0.0};
  const std::int64_t psi = fp::total_params(odd);
  for (int n : {2, 3, 4}) {
    const double scalar = 8.0 * 2.0 * (n - 1) / n;
    for (int stage = 0; stage <= 3; ++stage) {
      const auto rt =
          fp::runtime_data_parallel_bytes(odd, fp::Precision::bf16, stage, n, 2, 1LL << 40);
      const std::int64_t padded = stage == 0 ? psi : fp::shard_elements(psi, n) * n;
      const auto law = fp::data_parallel_traffic(padded, fp::Precision::bf16, stage, n, 2, link);
      const double scalars = (stage == 0 ? 1 : 2) * scalar;
      if (stage < 3) {
        EXPECT_NEAR(rt.total() - scalars, law.bytes(), 1e-9 * law.bytes()) << stage << " " << n;
      } else {
        const auto units = fp::fsdp_units(odd);
        std::int64_t shard = 0;
        for (auto u : units) shard += fp::ceil_div(u, n);
        const double extra =
            2.0 *
            static_cast<double>(fp::ceil_div(units.front(), n) - fp::ceil_div(units.back(), n)) *
            (n - 1) * 2;
        EXPECT_DOUBLE_EQ(rt.all_gather, 2.0 * (2.0 * shard * (n - 1) * 2) + extra);
        EXPECT_DOUBLE_EQ(rt.reduce_scatter, 2.0 * shard * (n - 1) * 2);
      }
    }
  }
  EXPECT_EQ(fp::runtime_data_parallel_bytes(odd, fp::Precision::fp32, 3, 1, 1).total(), 0.0);
}
