#include "fourway/plan/step_time.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace fp = fourway::plan;

// Narayanan et al. 2021 eq. (3): F = 72·B·s·l·h²·(1 + s/(6h) + V/(12·h·l)) per iteration, and
// with full recomputation 96·B·s·l·h²·(1 + s/(6h) + V/(16·h·l)). They count 12h² per block;
// GPT-2's blocks also hold 13h biases and norms, a relative 13/(12h) difference.
TEST(PlanStepTime, FlopsPerTokenMatchNarayananEquationThree) {
  for (const auto& a : {fp::gpt2_124m, fp::gpt2_1558m}) {
    const double s = static_cast<double>(a.seq), h = static_cast<double>(a.hidden),
                 l = static_cast<double>(a.layers), v = static_cast<double>(a.vocab);
    const double narayanan = 72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * h * l)) / s;
    EXPECT_NEAR(fp::flops_per_token(a) / narayanan, 1.0, 13.0 / (12 * h)) << a.name;
    const double recompute = 96 * s * l * h * h * (1 + s / (6 * h) + v / (16 * h * l)) / s;
    EXPECT_NEAR(fp::flops_per_token(a, fp::Checkpointing::full) / recompute, 1.0, 13.0 / (12 * h))
        << a.name;
  }
}

TEST(PlanStepTime, StagesSumToTheModelOverTp) {
  for (int p : {1, 2, 4, 12}) {
    for (int t : {1, 2, 4}) {
      for (auto r :
           {fp::Checkpointing::none, fp::Checkpointing::selective, fp::Checkpointing::full}) {
        double sum = 0;
        for (int i = 0; i < p; ++i) sum += fp::stage_flops_per_token(fp::gpt2_124m, t, p, i, r);
        EXPECT_NEAR(sum, fp::flops_per_token(fp::gpt2_124m, r) / t,
                    1e-12 * fp::flops_per_token(fp::gpt2_124m, r));
      }
    }
  }
}

// The bubble from an explicit GPipe timeline: forward of micro-batch j on stage i at slot i + j,
// backward mirrored after all forwards; count the slots where stage 0 idles.
TEST(PlanStepTime, BubbleMatchesAnExplicitTimeline) {
  for (int p : {1, 2, 4, 8}) {
    for (int m : {1, 3, 8, 32}) {
      const int slots = 2 * (m + p - 1);
      std::vector<int> busy(static_cast<std::size_t>(slots), 0);
      for (int j = 0; j < m; ++j) {
        busy[static_cast<std::size_t>(0 + j)] = 1;                    // forward on stage 0
        busy[static_cast<std::size_t>(m + p - 1 + (p - 1) + j)] = 1;  // backward on stage 0
      }
      int idle = 0;
      for (int b : busy) idle += b == 0;
      EXPECT_DOUBLE_EQ(static_cast<double>(idle) / slots, fp::bubble_fraction(p, m))
          << p << " " << m;
    }
  }
  EXPECT_THROW((void)fp::bubble_fraction(4, 0), fourway::ConfigError);
}

// Qi et al. 2023 §3: with F = B = W, ZB-H1 idles (p − 1)·F of each rank's 3m·F, a third of
// 1F1B's bubble; Narayanan et al. 2021 §2.2: interleaving v chunks per rank divides 1F1B's
// bubble time by v. GPipe and 1F1B keep the closed form.
TEST(PlanStepTime, ScheduleBubbleOfEverySchedule) {
  for (int p : {2, 4}) {
    const int m = 2 * p;
    EXPECT_DOUBLE_EQ(fp::schedule_bubble(fp::Schedule::one_f_one_b, p, m),
                     fp::bubble_fraction(p, m));
    EXPECT_DOUBLE_EQ(fp::schedule_bubble(fp::Schedule::gpipe, p, m), fp::bubble_fraction(p, m));
    EXPECT_NEAR(fp::schedule_bubble(fp::Schedule::zb_h1, p, m), (p - 1.0) / (3.0 * m + p - 1.0),
                1e-12)
        << "p=" << p;
    EXPECT_NEAR(fp::schedule_bubble(fp::Schedule::interleaved, p, m, 2),
                (p - 1.0) / 2.0 / (m + (p - 1.0) / 2.0), 1e-12)
        << "p=" << p;
    EXPECT_LT(fp::schedule_bubble(fp::Schedule::zb_v, p, m),
              fp::schedule_bubble(fp::Schedule::zb_h1, p, m));
  }
}

// The unfused attention's passes over its score matrix, kernel by kernel (plan/step_time.hpp):
// forward 2 + (2 + 2) + (2 + 2 + 1) + 2 bytes per element, backward 2 + (2 + 1 + 2) +
// (2 + 2 + 2) + (2 + 2) + 2, a recomputed forward once more; heads/tp · b · queries · keys
// elements per layer.
TEST(PlanStepTime, UnfusedAttentionStreamsItsScoresKernelByKernel) {
  const double forward = 2 + (2 + 2) + (2 + 2 + 1) + 2;
  const double backward = 2 + (2 + 1 + 2) + (2 + 2 + 2) + (2 + 2) + 2;
  EXPECT_DOUBLE_EQ(fp::unfused_attention_forward_bytes, forward);
  EXPECT_DOUBLE_EQ(fp::unfused_attention_backward_bytes, backward);
  const auto a = fp::gpt2_350m;  // 16 heads
  const double elements = 3.0 * (16 / 4) * 2 * 512 * 1024;
  EXPECT_DOUBLE_EQ(fp::unfused_attention_bytes(a, 3, 4, 2, 512, 1024, false),
                   elements * (forward + backward));
  EXPECT_DOUBLE_EQ(fp::unfused_attention_bytes(a, 3, 4, 2, 512, 1024, true),
                   elements * (2 * forward + backward));
}

TEST(PlanStepTime, AttentionFlopsAreTheScoresShareOfTheStage) {
  const auto a = fp::gpt2_124m;
  for (auto r : {fp::Checkpointing::none, fp::Checkpointing::selective, fp::Checkpointing::full}) {
    double sum = 0;
    for (int i = 0; i < 3; ++i) sum += fp::stage_attention_flops_per_token(a, 2, 3, i, r);
    const double k = r == fp::Checkpointing::none ? 12.0 : 16.0;
    EXPECT_DOUBLE_EQ(sum, k * 12 * 1024 * 768 / 2.0);
  }
}
