#include "fourway/checkpoint/gpt2_checkpoint.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

namespace fw = fourway;

namespace {

/// A GPT-2 file written from the names and shapes alone (random values), optionally with the
/// `transformer.` prefix, in dtype F32 / F16 / BF16.
fw::SafetensorsWriter gpt2_file(
    int L, std::int64_t C, std::int64_t V, std::int64_t T, const std::string& prefix,
    fw::StDtype dtype, std::vector<std::pair<std::string, std::vector<float>>>* values = nullptr) {
  fw::SafetensorsWriter w;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (const auto& [name, shape] : fw::gpt2_tensor_shapes(L, C, V, T)) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = nd(rng);
    if (dtype == fw::StDtype::F32) {
      w.add<float>(prefix + name, shape, v);
    } else if (dtype == fw::StDtype::BF16) {
      std::vector<fw::bf16> h(v.size());
      for (std::size_t i = 0; i < v.size(); ++i)
        h[i] = fw::bf16(v[i]), v[i] = static_cast<float>(h[i]);
      w.add<fw::bf16>(prefix + name, shape, h);
    } else {
      std::vector<fw::fp16> h(v.size());
      for (std::size_t i = 0; i < v.size(); ++i)
        h[i] = fw::fp16(v[i]), v[i] = static_cast<float>(h[i]);
      w.add<fw::fp16>(prefix + name, shape, h);
    }
    if (values) values->push_back({name, v});
  }
  return w;
}

std::string load_error(const fw::SafetensorsWriter& w) {
  try {
    (void)fw::inspect_gpt2(fw::SafetensorsFile::parse(w.serialize(), "m.safetensors"));
  } catch (const fw::CheckpointError& e) {
    return e.what();
  }
  return "";
}

template <class T>
std::vector<std::vector<T>> weights_of(fw::models::Gpt<T, fw::Host>& m) {
  std::vector<std::vector<T>> out;
  m.visit_parameters(
      [&](auto& p) { out.emplace_back(p.weight.data(), p.weight.data() + p.numel()); });
  return out;
}

/// A small GPT-2: 2 layers, 3 heads, width 12, vocabulary 17, context 7.
fw::models::GptConfig small_config() {
  fw::models::GptConfig cfg;
  cfg.layers = 2;
  cfg.heads = 3;
  cfg.dim = 12;
  cfg.vocab = 17;
  cfg.max_seq = 7;
  return cfg;
}

}  // namespace

TEST(Gpt2Checkpoint, InfersShapeWithAndWithoutPrefixAndIgnoresBuffers) {
  for (const std::string prefix : {"", "transformer."}) {
    auto w = gpt2_file(3, 24, 50, 11, prefix, fw::StDtype::F32);
    const std::vector<float> mask(11 * 11, 1.0f);
    w.add<float>(prefix + "h.1.attn.bias", {1, 1, 11, 11}, mask);
    w.add<float>(prefix + "h.2.attn.masked_bias", {}, std::vector<float>{-1e4f});
    const auto f = fw::SafetensorsFile::parse(w.serialize());
    const auto info = fw::inspect_gpt2(f);
    EXPECT_EQ(info.prefix, prefix);
    EXPECT_EQ(info.layers, 3);
    EXPECT_EQ(info.dim, 24);
    EXPECT_EQ(info.vocab, 50);
    EXPECT_EQ(info.context, 11);
    EXPECT_EQ(info.ignored.size(), 2u);
    const auto cfg = info.config(4);
    EXPECT_EQ(cfg.heads, 4);
    EXPECT_EQ(cfg.max_seq, 11);
    EXPECT_THROW((void)info.config(0), fw::ConfigError) << "24 is not a multiple of 64";
    EXPECT_THROW((void)info.config(5), fw::ConfigError);
  }
  // GPT-2 small's width 768 gives 12 heads of 64
  fw::Gpt2FileInfo small;
  small.dim = 768;
  small.layers = 12;
  small.vocab = 50257;
  small.context = 1024;
  EXPECT_EQ(small.config().heads, 12);
}

TEST(Gpt2Checkpoint, MissingWrongShapedUnknownAndUntiedTensorsAreNamed) {
  {
    fw::SafetensorsWriter w;
    const std::vector<float> v(4, 0.0f);
    w.add<float>("model.embed_tokens.weight", {2, 2}, v);
    EXPECT_NE(load_error(w).find("is not a GPT-2 checkpoint"), std::string::npos);
  }
  {
    // h.1 without its mlp.c_fc.bias
    fw::SafetensorsWriter w;
    for (const auto& [name, shape] : fw::gpt2_tensor_shapes(2, 8, 10, 5)) {
      if (name == "h.1.mlp.c_fc.bias") continue;
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      w.add<float>(name, shape, std::vector<float>(static_cast<std::size_t>(n), 0.5f));
    }
    EXPECT_NE(load_error(w).find("h.1.mlp.c_fc.bias is missing"), std::string::npos)
        << load_error(w);
  }
  {
    fw::SafetensorsWriter w;
    for (const auto& [name, shape0] : fw::gpt2_tensor_shapes(1, 8, 10, 5)) {
      auto shape = shape0;
      if (name == "h.0.attn.c_attn.weight") shape = {24, 8};  // transposed (nn.Linear layout)
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      w.add<float>(name, shape, std::vector<float>(static_cast<std::size_t>(n), 0.5f));
    }
    EXPECT_NE(load_error(w).find(
                  "h.0.attn.c_attn.weight has shape (24, 8), GPT-2 of width 8 needs (8, 24)"),
              std::string::npos)
        << load_error(w);
  }
  {
    auto w = gpt2_file(1, 8, 10, 5, "", fw::StDtype::F32);
    w.add<float>("h.0.attn.rotary", {2}, std::vector<float>{1, 2});
    EXPECT_NE(load_error(w).find("not part of a 1-block GPT-2: h.0.attn.rotary"), std::string::npos)
        << load_error(w);
  }
  {
    auto w = gpt2_file(1, 8, 10, 5, "", fw::StDtype::F32);
    w.add<float>("lm_head.weight", {10, 8}, std::vector<float>(80, 0.25f));
    EXPECT_NE(load_error(w).find("lm_head.weight differs from wte.weight"), std::string::npos);
  }
}

TEST(Gpt2Checkpoint, LoadsF32F16Bf16IntoTheModelByName) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  for (auto dtype : {fw::StDtype::F32, fw::StDtype::F16, fw::StDtype::BF16}) {
    std::vector<std::pair<std::string, std::vector<float>>> values;
    const auto w = gpt2_file(2, 16, 30, 9, "transformer.", dtype, &values);
    const auto f = fw::SafetensorsFile::parse(w.serialize());
    const auto cfg = fw::inspect_gpt2(f).config(2);
    fw::models::Gpt<float, fw::Host> model(ctx, cfg, 99);
    fw::load_gpt2(ctx, f, model);
    std::size_t i = 0;
    model.visit_parameters([&](auto& p) {
      ASSERT_LT(i, values.size());
      EXPECT_EQ(p.name, values[i].first);
      const auto& v = values[i].second;
      ASSERT_EQ(static_cast<std::size_t>(p.numel()), v.size());
      EXPECT_EQ(std::memcmp(p.weight.data(), v.data(), v.size() * 4), 0) << p.name;
      ++i;
    });
    EXPECT_EQ(i, values.size());
  }
}

TEST(Gpt2Checkpoint, SaveThenLoadIsBitwiseInFp32AndBf16) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  const fw::models::GptConfig cfg = small_config();
  fw::models::Gpt<float, fw::Host> a(ctx, cfg, 1), b(ctx, cfg, 2);
  ASSERT_NE(weights_of(a), weights_of(b));
  fw::SafetensorsWriter w;
  fw::add_gpt2_tensors(ctx, a, w);
  const auto f = fw::SafetensorsFile::parse(w.serialize());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.at("h.1.mlp.c_proj.weight").shape, (std::vector<std::int64_t>{48, 12}));
  fw::load_gpt2(ctx, f, b);
  EXPECT_EQ(weights_of(a), weights_of(b));

  fw::models::Gpt<fw::bf16, fw::Host> c(ctx, cfg, 3), d(ctx, cfg, 4);
  const auto path =
      std::filesystem::temp_directory_path() / ("fourway_" + std::to_string(::getpid()) + "_" +
                                                std::string("fourway_gpt2_ckpt_test.safetensors"));
  fw::save_gpt2(ctx, c, path);
  const auto g = fw::SafetensorsFile::read(path);
  EXPECT_EQ(g.at("wte.weight").dtype, fw::StDtype::BF16);
  fw::load_gpt2(ctx, g, d);
  const auto wc = weights_of(c), wd = weights_of(d);
  ASSERT_EQ(wc.size(), wd.size());
  for (std::size_t i = 0; i < wc.size(); ++i) {
    EXPECT_EQ(std::memcmp(wc[i].data(), wd[i].data(), wc[i].size() * 2), 0);
  }
  std::filesystem::remove(path);
}

// A padded vocabulary (GptConfig::vocab_alignment) keeps the file GPT-2's: wte is written with
// its real rows only, byte-identical to the unpadded model's file; a file loads into a padded
// model (whole-file and positioned reads) with the padding rows left zero, and the element reader
// a strategy uses gives zeros for padding elements.
TEST(Gpt2Checkpoint, PaddedVocabularyWritesAndReadsTheRealRows) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  const fw::models::GptConfig cfg = small_config();
  fw::models::GptConfig padded_cfg = cfg;
  padded_cfg.vocab_alignment = 8;  // 17 -> 24 rows
  fw::models::Gpt<float, fw::Host> plain(ctx, cfg, 1), padded(ctx, padded_cfg, 1);
  ASSERT_EQ(padded.embedding().wte().weight.shape(), (fw::Shape{24, 12}));
  fw::SafetensorsWriter wp, wq;
  fw::add_gpt2_tensors(ctx, plain, wp);
  fw::add_gpt2_tensors(ctx, padded, wq);
  EXPECT_EQ(wp.serialize(), wq.serialize());  // same init values, same file

  const auto path = std::filesystem::temp_directory_path() /
                    ("fourway_" + std::to_string(::getpid()) + "_padded_vocab.safetensors");
  fw::models::Gpt<float, fw::Host> other(ctx, cfg, 9);
  fw::save_gpt2(ctx, other, path);
  const auto file = fw::SafetensorsFile::read(path);
  EXPECT_EQ(file.at("wte.weight").shape, (std::vector<std::int64_t>{17, 12}));
  const auto reader = fw::SafetensorsReader::open(path);
  for (int positioned = 0; positioned < 2; ++positioned) {
    fw::models::Gpt<float, fw::Host> into(ctx, padded_cfg, 5);
    auto& wte = into.embedding().wte();
    fw::host::fill(ctx, wte.weight.data(), wte.logical_numel(), 7.0f);  // the load overwrites it
    if (positioned == 1) {
      fw::load_gpt2(ctx, reader, into);
    } else {
      fw::load_gpt2(ctx, file, into);
    }
    const auto want = weights_of(other), got = weights_of(into);
    ASSERT_EQ(want.size(), got.size());
    for (std::size_t t = 0; t < want.size(); ++t) {
      ASSERT_GE(got[t].size(), want[t].size());
      EXPECT_TRUE(std::equal(want[t].begin(), want[t].end(), got[t].begin())) << t;
      for (std::size_t i = want[t].size(); i < got[t].size(); ++i) ASSERT_EQ(got[t][i], 0.0f);
    }
  }
  // the element reader over a range that crosses into the padding
  const auto read = fw::gpt2_element_reader(reader, fw::inspect_gpt2(reader));
  fw::models::Gpt<float, fw::Host> shape_only(ctx, padded_cfg, 5);
  std::vector<float> out(40, -1.0f);
  read(shape_only.embedding().wte(), 17 * 12 - 10, 40, out.data());
  const auto wte_values = weights_of(other)[0];
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out[i], wte_values[17 * 12 - 10 + i]);
  for (int i = 10; i < 40; ++i) EXPECT_EQ(out[i], 0.0f);
  std::filesystem::remove(path);
}
