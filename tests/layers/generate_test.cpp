// Incremental decoding (layers/kv_cache.hpp, layers/generate.hpp): greedy tokens against Hugging
// Face transformers' `generate` on the same weights (tests/golden/sample_greedy_v1.txt, written
// once by tools/make_sample_golden.py), the KV-cache logits against the training forward's logits
// of the whole sequence, and the sampling rule against its probabilities.
#include "fourway/layers/generate.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/layers/gpt.hpp"

namespace fw = fourway;

namespace {

const std::filesystem::path golden = FOURWAY_GOLDEN_DIR;

/// The model of fourway-train's golden run with the final weights PyTorch reached.
fw::models::GptConfig golden_config() {
  return {.layers = 2, .heads = 4, .dim = 32, .vocab = 64, .max_seq = 16};
}

template <class T>
void load_final(fw::models::Gpt<T, fw::Host>& m) {
  const auto f = fw::SafetensorsFile::read(golden / "train_expected_v1.safetensors");
  m.visit_parameters([&](fw::Parameter<T, fw::Host>& p) {
    const auto v = f.read<float>(f.at("final." + p.name));
    ASSERT_EQ(static_cast<std::int64_t>(v.size()), p.numel()) << p.name;
    for (std::int64_t i = 0; i < p.numel(); ++i) p.weight[i] = fw::convert<T>(v[i]);
  });
}

struct GreedyCase {
  std::vector<std::int32_t> prompt, tokens;
};

/// `prompt IDS : NEW IDS : min_gap G` lines of sample_greedy_v1.txt.
std::vector<GreedyCase> greedy_cases() {
  std::ifstream in(golden / "sample_greedy_v1.txt");
  std::vector<GreedyCase> out;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("prompt ", 0) != 0) continue;
    std::istringstream s(line.substr(7));
    GreedyCase c;
    std::string w;
    while (s >> w && w != ":") c.prompt.push_back(std::stoi(w));
    while (s >> w && w != ":") c.tokens.push_back(std::stoi(w));
    out.push_back(c);
  }
  return out;
}

}  // namespace

TEST(Generate, GreedyIsTransformersGenerateOnTheSameWeights) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  fw::models::Gpt<float, fw::Host> m(ctx, golden_config());
  load_final(m);
  const auto cases = greedy_cases();
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& c : cases) {
    fw::SampleOptions o;
    o.temperature = 0.0f;
    o.tokens = static_cast<int>(c.tokens.size());
    EXPECT_EQ(fw::generate(ctx, m, c.prompt, o), c.tokens) << "prompt of " << c.prompt.size();
  }
  EXPECT_EQ(mem.total_current(), mem.current(fw::MemTag::weights) + mem.current(fw::MemTag::grads))
      << "the caches and every temporary are freed";
}

// Each decode step's logits are those the training forward computes for the whole sequence at
// that position (its flash attention against the cache's two GEMMs): the cache is the prefix.
TEST(Generate, KvCacheLogitsAreTheForwardsLogitsAtEveryPosition) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  auto cfg = golden_config();
  cfg.vocab_alignment = 48;  // padded rows: decode returns the 64 real logits
  fw::models::Gpt<float, fw::Host> m(ctx, cfg, 77);
  const std::int64_t T = cfg.max_seq;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(T));
  std::mt19937 rng(3);
  for (auto& t : ids) t = static_cast<std::int32_t>(rng() % 64);
  const auto tokens = fw::Tensor<std::int32_t, fw::Host>::view_of(ids.data(), fw::Shape{1, T});
  fw::models::Gpt<float, fw::Host>::Stash s;
  (void)m.forward(ctx, tokens, tokens, s);
  const std::int64_t Vp = cfg.padded_vocab();
  ASSERT_EQ(s.logits.numel(), T * Vp);
  auto caches = m.kv_caches(ctx, T);
  double worst = 0.0;
  for (std::int64_t pos = 0; pos < T; ++pos) {
    const auto logits = fw::decode_token(ctx, m, ids[static_cast<std::size_t>(pos)], pos, caches);
    ASSERT_EQ(logits.size(), 64u);
    for (std::size_t v = 0; v < logits.size(); ++v) {
      const double want = s.logits.data()[pos * Vp + static_cast<std::int64_t>(v)];
      worst = std::max(worst, std::abs(logits[v] - want));
      EXPECT_NEAR(logits[v], want, 1e-5) << "position " << pos << " token " << v;
    }
  }
  std::printf("KV-cache decode against the forward's logits: largest difference %.3g\n", worst);
  EXPECT_THROW((void)fw::decode_token(ctx, m, 1, T, caches), fw::ConfigError);  // past the context
  EXPECT_THROW((void)fw::decode_token(ctx, m, 64, 0, caches),
               fw::ShapeError);  // outside the vocabulary
}

TEST(Generate, Bf16DecodingFollowsTheFp32Logits) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  fw::models::Gpt<float, fw::Host> f(ctx, golden_config());
  fw::models::Gpt<fw::bf16, fw::Host> h(ctx, golden_config());
  load_final(f);
  load_final(h);
  auto cf = f.kv_caches(ctx, 8);
  auto ch = h.kv_caches(ctx, 8);
  for (std::int32_t pos = 0; pos < 8; ++pos) {
    const auto a = fw::decode_token(ctx, f, 3 * pos + 1, pos, cf);
    const auto b = fw::decode_token(ctx, h, 3 * pos + 1, pos, ch);
    for (std::size_t v = 0; v < a.size(); ++v) EXPECT_NEAR(b[v], a[v], 0.05) << pos << " " << v;
  }
}

// The sampling rule: frequencies of 40 000 seeded draws against softmax(logits / T) over the
// top-k, within 0.01; top-k 1 and temperature 0 are the argmax; a seed gives the same draws.
TEST(Generate, PickTokenDrawsFromTheTemperedTopKSoftmax) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f, -1.0f};
  struct Case {
    float temperature;
    int top_k;
  };
  for (const Case c : {Case{1.0f, 0}, Case{0.5f, 0}, Case{2.0f, 3}, Case{1.0f, 2}}) {
    std::vector<double> p(logits.size(), 0.0);
    double sum = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) {
      int above = 0;  // logits larger than this one
      for (const float l : logits) above += l > logits[i] ? 1 : 0;
      if (c.top_k > 0 && above >= c.top_k) continue;
      p[i] = std::exp(logits[i] / c.temperature);
      sum += p[i];
    }
    fw::SampleOptions o;
    o.temperature = c.temperature;
    o.top_k = c.top_k;
    std::mt19937_64 rng(11);
    std::vector<int> count(logits.size(), 0);
    constexpr int draws = 40000;
    for (int i = 0; i < draws; ++i)
      ++count[static_cast<std::size_t>(fw::pick_token(logits, o, rng))];
    for (std::size_t i = 0; i < logits.size(); ++i) {
      EXPECT_NEAR(count[i] / static_cast<double>(draws), p[i] / sum, 0.01)
          << "temperature " << c.temperature << " top-k " << c.top_k << " token " << i;
    }
  }
  std::mt19937_64 rng(1);
  EXPECT_EQ(fw::pick_token(logits, {.temperature = 1.0f, .top_k = 1}, rng), 3);
  EXPECT_EQ(fw::pick_token(logits, {.temperature = 0.0f}, rng), 3);
  const std::vector<float> tie = {1.0f, 5.0f, 5.0f};
  EXPECT_EQ(fw::pick_token(tie, {.temperature = 0.0f}, rng), 1) << "the first largest";
  EXPECT_THROW((void)fw::pick_token(logits, {.temperature = -1.0f}, rng), fw::ConfigError);
  EXPECT_THROW((void)fw::pick_token(logits, {.top_k = -2}, rng), fw::ConfigError);
}

TEST(Generate, TheSameSeedGivesTheSameTokensAndTheContextBoundsTheRun) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  fw::models::Gpt<float, fw::Host> m(ctx, golden_config(), 5);
  const std::vector<std::int32_t> prompt = {1, 2};
  fw::SampleOptions o;
  o.tokens = 14;
  o.seed = 9;
  const auto a = fw::generate(ctx, m, prompt, o);
  EXPECT_EQ(fw::generate(ctx, m, prompt, o), a);
  o.seed = 10;
  EXPECT_NE(fw::generate(ctx, m, prompt, o), a) << "a random model is nearly uniform";
  o.tokens = 15;  // 2 + 15 > 16
  try {
    (void)fw::generate(ctx, m, prompt, o);
    ADD_FAILURE() << "no error past the context";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("a KV cache of 17 tokens; the model's context is 16"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)fw::generate(ctx, m, std::vector<std::int32_t>{}, o), fw::ConfigError);
}
