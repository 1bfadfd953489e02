#include "fourway/plan/architecture.hpp"

#include <gtest/gtest.h>

#include <string>

namespace fw = fourway;
namespace fp = fourway::plan;

static_assert(fp::total_params(fp::gpt2_124m) == 124'439'808);

// Published parameter counts (independent of this code): Hugging Face model cards / safetensors
// metadata of gpt2, gpt2-medium, gpt2-large, gpt2-xl, and meta-llama/Llama-2-{7b,13b,70b}-hf.
TEST(PlanArchitecture, PresetsHaveThePublishedParameterCounts) {
  EXPECT_EQ(fp::total_params(fp::gpt2_124m), 124'439'808);
  EXPECT_EQ(fp::total_params(fp::gpt2_350m), 354'823'168);
  EXPECT_EQ(fp::total_params(fp::gpt2_774m), 774'030'080);
  EXPECT_EQ(fp::total_params(fp::gpt2_1558m), 1'557'611'200);
  EXPECT_EQ(fp::total_params(fp::llama2_7b), 6'738'415'616);
  EXPECT_EQ(fp::total_params(fp::llama2_13b), 13'015'864'320);
  EXPECT_EQ(fp::total_params(fp::llama2_70b), 68'976'648'192);
}

TEST(PlanArchitecture, Gpt2BlockIs12HSquaredPlus13H) {
  for (std::int64_t h : {64, 768, 1600}) {
    const auto a = fp::gpt2_shape(3, h, 4, 1000, 128);
    EXPECT_EQ(fp::layer_params(a), 12 * h * h + 13 * h);
  }
}

// Megatron's split: everything divides by t except the norms and the two row-parallel biases
// (6h for a GPT-2 block; 2h, the two RMSNorms, for Llama), which every rank keeps.
TEST(PlanArchitecture, TensorParallelRanksSumToTheBlockPlusReplicatedParts) {
  for (int t : {1, 2, 4, 8}) {
    const auto g = fp::gpt2_shape(2, 1024, 16, 50257, 1024);
    EXPECT_EQ(t * fp::layer_params(g, t), fp::layer_params(g) + (t - 1) * 6 * 1024) << t;
    EXPECT_EQ(t * fp::layer_params(fp::llama2_70b, t),
              fp::layer_params(fp::llama2_70b) + (t - 1) * 2 * 8192)
        << t;
  }
  // The vocabulary does not divide by 4: the fullest rank holds ceil(V/t) rows.
  EXPECT_EQ(fp::embedding_params(fp::gpt2_124m, 4), (50257 + 3) / 4 * 768 + 1024 * 768);
}

TEST(PlanArchitecture, StagesPartitionTheLayersAndTheTiedHeadIsCopiedOnTheLastStage) {
  for (int p : {1, 2, 5, 7, 12}) {
    std::int64_t layers = 0, params = 0;
    for (int i = 0; i < p; ++i) {
      const std::int64_t l = fp::layers_on_stage(12, p, i);
      EXPECT_TRUE(l == 12 / p || l == 12 / p + 1);
      if (i > 0) {
        EXPECT_GE(l, fp::layers_on_stage(12, p, i - 1));  // extras on the last stages
      }
      layers += l;
      params += fp::stage_params(fp::gpt2_124m, 1, p, i);
    }
    EXPECT_EQ(layers, 12);
    const std::int64_t copy = p > 1 ? 50257LL * 768 : 0;
    EXPECT_EQ(params, fp::total_params(fp::gpt2_124m) + copy) << p;
  }
  // Untied (Llama): no copy.
  std::int64_t params = 0;
  for (int i = 0; i < 4; ++i) params += fp::stage_params(fp::llama2_7b, 1, 4, i);
  EXPECT_EQ(params, fp::total_params(fp::llama2_7b));
}

TEST(PlanArchitecture, FsdpUnitsFollowTheContract) {
  const auto u = fp::fsdp_units(fp::gpt2_124m);
  ASSERT_EQ(u.size(), 14u);
  EXPECT_EQ(u.front(), 50257LL * 768 + 1024 * 768);
  EXPECT_EQ(u.back(), 2 * 768);
  std::int64_t sum = 0;
  for (auto x : u) sum += x;
  EXPECT_EQ(sum, fp::total_params(fp::gpt2_124m));
}

TEST(PlanArchitecture, PresetsByName) {
  EXPECT_EQ(fp::preset("gpt2", "1.5B")->layers, 48);
  EXPECT_EQ(fp::preset("llama", "70B")->kv_heads, 8);
  EXPECT_FALSE(fp::preset("llama", "65B"));
  EXPECT_FALSE(fp::preset("bert", "124M"));
}

TEST(PlanArchitecture, SplitsThatCannotWorkAreConfigErrors) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const fw::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] {
              (void)fp::layer_params(fp::gpt2_1558m, 2);
            }).find("tensor parallelism 2 does not divide the 25 attention heads"),
            std::string::npos);
  EXPECT_NE(message([] {
              (void)fp::layer_params(fp::llama2_70b, 16);
            }).find("does not divide the 8 key/value heads"),
            std::string::npos);
  EXPECT_NE(message([] {
              (void)fp::layers_on_stage(12, 13, 0);
            }).find("13 pipeline stages for 12 layers"),
            std::string::npos);
  EXPECT_NE(message([] {
              (void)fp::total_params(fp::gpt2_shape(2, 100, 3, 10, 10));
            }).find("hidden 100 does not divide by heads 3"),
            std::string::npos);
}
