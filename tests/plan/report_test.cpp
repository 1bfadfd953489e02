#include "fourway/plan/report.hpp"

#include <gtest/gtest.h>

#include <string>

namespace fp = fourway::plan;

namespace {
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace

TEST(PlanReport, TableStatesUnitsAndEveryRow) {
  const fp::Model m{fp::gpt2_124m, 0};
  fp::Strategy s{.dp = 8, .zero = 3, .micro_batch = 4, .checkpointing = fp::Checkpointing::full};
  const auto p = fp::make_plan(m, fp::Cluster{fp::a100_80g, 8}, s);
  const std::string t = fp::table(p);
  for (const char* part :
       {"bytes", "GB", "GiB", "weights (bf16)", "gradients (bf16)", "master weights (fp32)",
        "optimizer state (Adam moments)", "activations (1 micro-batch in flight)",
        "recomputation working set", "ZeRO-3 gathered units", "fits:     yes", "step:", "tokens/s",
        "traffic:"}) {
    EXPECT_TRUE(contains(t, part)) << part << "\n" << t;
  }
  // The total row carries the exact byte count.
  EXPECT_TRUE(contains(t, std::to_string(static_cast<long long>(p.worst().total())))) << t;
}

TEST(PlanReport, JsonCarriesTheNumbersUnrounded) {
  const fp::Model m{fp::gpt2_124m, 0};
  fp::Strategy s{.dp = 4, .pp = 2, .zero = 1, .micro_batches = 4};
  const auto p = fp::make_plan(m, fp::Cluster{fp::h100, 8}, s);
  const std::string j = fp::json(p);
  int depth = 0;
  for (char c : j) {
    depth += c == '{' || c == '[';
    depth -= c == '}' || c == ']';
    ASSERT_GE(depth, 0);
  }
  EXPECT_EQ(depth, 0);
  EXPECT_TRUE(contains(j, "\"params\":124439808"));
  EXPECT_TRUE(contains(j, "\"weights\":" + std::to_string(p.stages[0].states.weights)));
  EXPECT_TRUE(
      contains(j, "\"optimizer_state\":" + std::to_string(p.stages[1].states.optimizer_state)));
  EXPECT_TRUE(contains(j, "\"schedule\":\"1f1b\""));
  EXPECT_TRUE(contains(j, "\"fits\":true"));
  EXPECT_TRUE(contains(j, "\"step_s\":"));
}

// The step time says which achievable rate it assumed: fourway's measured MFU by default (named
// as such), or the user's --mfu or --tflops.
TEST(PlanReport, StepTimeNamesTheRateItAssumes) {
  const fp::Model m{fp::gpt2_124m, 0};
  const fp::Strategy s{.micro_batch = 4};
  const fp::Cluster c{fp::h100, 1};
  const std::string measured = fp::table(fp::make_plan(m, c, s));
  EXPECT_TRUE(contains(measured,
                       "assuming 233 TFLOP/s achievable per GPU (23.6% of the datasheet peak, "
                       "fourway's measured MFU: fourway-train-cuda, GPT-2 124M bf16 on one H200"))
      << measured;  // 0.236 x 989 TFLOP/s (H100 dense bf16)
  fp::Options mine;
  mine.mfu = 0.4;
  const std::string given = fp::table(fp::make_plan(m, c, s, mine));
  EXPECT_TRUE(contains(given,
                       "assuming 396 TFLOP/s achievable per GPU (--mfu 0.400 of the "
                       "datasheet peak)"))
      << given;
  fp::Options tflops;
  tflops.achievable_tflops = 150;
  const std::string rate = fp::table(fp::make_plan(m, c, s, tflops));
  EXPECT_TRUE(contains(rate, "assuming 150 TFLOP/s achievable per GPU (--tflops)")) << rate;
  EXPECT_TRUE(contains(fp::json(fp::make_plan(m, c, s)),
                       "\"achievable_source\":\"23.6% of the datasheet peak, fourway's measured"));
}

TEST(PlanReport, RecommendationTextMarksTheChoice) {
  const fp::Model m{fp::gpt2_774m, 0};
  fp::SearchSpace sp;
  sp.micro_batch = 2;
  const auto r = fp::recommend(m, fp::Cluster{fp::h100, 8}, sp);
  const std::string t = fp::recommendation_text(r, 5);
  EXPECT_TRUE(contains(t, "meshes fit; the fastest 5:")) << t;
  EXPECT_TRUE(contains(t, "* ")) << t;
  EXPECT_TRUE(contains(t, r.why)) << t;
  const std::string j = fp::recommendation_json(r, 5);
  EXPECT_TRUE(contains(j, "\"ranking\":[")) << j;
  const auto none =
      fp::recommend(fp::Model{std::nullopt, 1'000'000'000'000}, fp::Cluster{fp::h100, 8}, sp);
  EXPECT_TRUE(contains(fp::recommendation_text(none), "nothing fits"));
  EXPECT_TRUE(contains(fp::recommendation_json(none), "\"recommended\":null"));
}
