// Every pair of fourway-train's flags is either honoured or refused by name (issue 44, item 4).
// The flags go through the program's own parser and `validate` (examples/train/validate.hpp),
// which runs before anything is built; an accepted pair must show both flags' effects in what
// `describe` says the run will do (the --dry-run output), a refused one must name one of the two
// flags. Walked for the host build (fourway-train) and the CUDA build (fourway-train-cuda), whose
// flags are the same and whose traits differ. No model is built, so the ~2700 cases take
// milliseconds.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/checkpoint/safetensors.hpp"
#include "support/program.hpp"
#include "validate.hpp"

namespace fw = fourway;
namespace ft = fourway_train;

namespace {

std::filesystem::path scratch(const std::string& name) {
  return fw::test::scratch_path("flag_pairs_test", name);
}

/// A GPT-2 file of 2 blocks, width 32, vocabulary 64, context 64, with a config.json of 4 heads
/// beside it (what --init-from reads), in its own folder.
std::filesystem::path gpt2_file(const std::string& folder, int heads) {
  const auto dir = scratch(folder);
  std::filesystem::create_directories(dir);
  fw::SafetensorsWriter w;
  for (const auto& [name, shape] : fw::gpt2_tensor_shapes(2, 32, 64, 64)) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    const std::vector<float> v(static_cast<std::size_t>(n), 0.01f);
    w.add<float>(name, shape, v);
  }
  w.write(dir / "model.safetensors");
  if (heads > 0) {
    fw::models::GptConfig c;
    c.layers = 2;
    c.dim = 32;
    c.heads = heads;
    c.vocab = 64;
    c.max_seq = 64;
    fw::write_gpt2_config(dir / "model.safetensors", c, "float32");
  }
  return dir / "model.safetensors";
}

/// An llm.c token file of `n` tokens below 64.
std::filesystem::path token_file() {
  const auto p = scratch("tokens.bin");
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 2000;
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (int i = 0; i < 2000; ++i) {
    const auto t = static_cast<std::uint16_t>(i % 64);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  return p;
}

/// One value of every flag (valid alone) and the words `describe` prints when the run honours it.
struct Sample {
  std::vector<std::string> args;
  std::string effect;
};

std::map<std::string, Sample> samples() {
  const std::string weights = gpt2_file("init", 4).string();
  const std::string tokens = token_file().string();
  const std::string dir = scratch("out").string();
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(dir + "/resume");
  std::ofstream(dir + "/resume/index.json") << "{}";  // what --resume's check looks for
  return {
      {"init-from", {{"--init-from", weights}, "from " + weights}},
      {"layers", {{"--layers", "3"}, "3 layers"}},
      {"dim", {{"--dim", "64"}, "width 64"}},
      {"heads", {{"--heads", "4"}, "4 heads"}},
      {"vocab", {{"--vocab", "128"}, "vocab 128"}},
      {"seq", {{"--seq", "32"}, "x 32 tokens"}},
      {"seed", {{"--seed", "7"}, "seed 7"}},
      {"data", {{"--data", tokens}, "data: " + tokens}},
      {"batch", {{"--batch", "16"}, "batch: 16 sequences"}},
      {"steps", {{"--steps", "3"}, "steps: 3"}},
      {"lr", {{"--lr", "0.001"}, "lr 0.001"}},
      {"weight-decay", {{"--weight-decay", "0.1"}, "weight decay 0.1"}},
      {"beta1", {{"--beta1", "0.8"}, "beta1 0.8"}},
      {"beta2", {{"--beta2", "0.99"}, "beta2 0.99"}},
      {"eps", {{"--eps", "1e-6"}, "eps 1e-06"}},
      {"grad-clip", {{"--grad-clip", "0.5"}, "clip 0.5"}},
      {"warmup", {{"--warmup", "2"}, "warmup 2"}},
      {"min-lr", {{"--min-lr", "0.0001"}, "min lr 0.0001"}},
      {"precision", {{"--precision", "fp16"}, "precision: fp16"}},
      {"tf32", {{"--tf32"}, ", tf32"}},
      {"attention", {{"--attention", "fused"}, "attention fused"}},
      {"classifier-chunk", {{"--classifier-chunk", "4"}, "classifier chunk 4"}},
      {"checkpoint-activations",
       {{"--checkpoint-activations", "selective"}, "recomputation selective"}},
      {"log-json", {{"--log-json", dir + "/log.jsonl"}, "log " + dir + "/log.jsonl"}},
      {"val-data", {{"--val-data", tokens}, "validation on " + tokens}},
      {"eval-every", {{"--eval-every", "3"}, "evaluated every 3 steps"}},
      {"eval-batches", {{"--eval-batches", "2"}, "2 validation batches"}},
      {"sample-tokens", {{"--sample-tokens", "8"}, "samples of 8 tokens"}},
      {"sample-every", {{"--sample-every", "5"}, "tokens every 5 steps and after"}},
      {"prompt", {{"--prompt", "hi"}, "prompt \"hi\""}},
      {"temperature", {{"--temperature", "0.7"}, "temperature 0.7"}},
      {"top-k", {{"--top-k", "5"}, "top-k 5"}},
      {"sample-seed", {{"--sample-seed", "42"}, "seed 42"}},
      {"tokenizer", {{"--tokenizer", "bytes"}, "tokenizer bytes"}},
      {"save", {{"--save", dir + "/w.safetensors"}, "save " + dir + "/w.safetensors"}},
      {"save-dir", {{"--save-dir", dir + "/ck"}, "checkpoints under " + dir + "/ck"}},
      {"save-every", {{"--save-every", "2"}, "every 2 steps"}},
      {"keep", {{"--keep", "1"}, "keep 1"}},
      {"save-async", {{"--save-async"}, "written in the background"}},
      {"resume", {{"--resume", dir + "/resume"}, "resume from " + dir + "/resume"}},
      {"memory-report", {{"--memory-report"}, "memory report of every rank"}},
      {"memory-cap-gb", {{"--memory-cap-gb", "2"}, "cap 2 GB"}},
      {"block-cache", {{"--block-cache", "off"}, "block cache off"}},
      {"ranks", {{"--ranks", "2"}, "on 2 ranks"}},
      {"backend", {{"--backend", "strict"}, "backend strict"}},
      {"comm-timeout", {{"--comm-timeout", "30"}, "timeout 30 s"}},
      {"dp", {{"--dp", "2"}, "dp=2"}},
      {"zero", {{"--zero", "2"}, "ZeRO-2"}},
      {"bucket-mb", {{"--bucket-mb", "1"}, "bucket 1 MiB"}},
      {"no-overlap", {{"--no-overlap"}, "overlap off"}},
      {"tp", {{"--tp", "2"}, "tp=2"}},
      {"sequence-parallel", {{"--sequence-parallel"}, "sequence parallel"}},
      {"vocab-align", {{"--vocab-align", "8"}, "aligned to 8"}},
      {"cp", {{"--cp", "2"}, "cp=2"}},
      {"pp", {{"--pp", "2"}, "pp=2"}},
      {"micro-batches", {{"--micro-batches", "2"}, "2 micro-batches"}},
      {"schedule", {{"--schedule", "gpipe"}, "schedule gpipe"}},
      {"virtual-stages", {{"--virtual-stages", "2"}, "2 chunks per rank"}},
      {"trace", {{"--trace", dir + "/trace.json"}, "trace " + dir + "/trace.json"}},
      {"check", {{"--check"}, "check: "}},
      {"quiet", {{"--quiet"}, "quiet"}},
      {"profile-step", {{"--profile-step", "1"}, "profile step 1"}},
      {"cuda-graph", {{"--cuda-graph", "on"}, "cuda graph on"}},
      {"peak-tflops", {{"--peak-tflops", "100"}, "MFU against 100 TFLOP/s per device"}},
      {"dry-run", {{"--dry-run"}, "dry run"}},
  };
}

/// Every flag the program's parser knows, from its help.
std::vector<std::string> program_flags() {
  ft::Options o;
  std::istringstream help(ft::make_parser(o, "fourway-train").help());
  std::vector<std::string> out;
  for (std::string line; std::getline(help, line);) {
    if (line.rfind("  --", 0) != 0) continue;
    const std::string name = line.substr(4, line.find(' ', 4) - 4);
    if (name != "help") out.push_back(name);
  }
  return out;
}

/// What the program does with `args` before building anything: accepted (the run it describes)
/// or refused (the message).
struct Outcome {
  bool accepted = false;
  std::string text;
};

Outcome outcome(const std::vector<std::string>& args, const ft::TargetTraits& t) {
  ft::Options o;
  o.precision = t.default_precision;
  auto parser = ft::make_parser(o, t.program);
  std::vector<const char*> argv = {t.program};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    parser.parse(static_cast<int>(argv.size()), argv.data());
    o.given = ft::given_flags(parser);
    const auto cfg = ft::validate(o, t);
    return {true, ft::describe(o, t, cfg)};
  } catch (const fw::Error& e) {
    return {false, e.what()};
  }
}

/// Whether `message` names `--flag` (not a longer flag that starts with it).
bool names(const std::string& message, const std::string& flag) {
  const std::string f = "--" + flag;
  for (std::size_t at = message.find(f); at != std::string::npos; at = message.find(f, at + 1)) {
    const std::size_t end = at + f.size();
    if (end == message.size()) return true;
    const char c = message[end];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-')) return true;
  }
  return false;
}

std::vector<std::string> args_of(const std::map<std::string, Sample>& s,
                                 std::initializer_list<std::string> flags) {
  std::vector<std::string> a;
  for (const auto& f : flags) a.insert(a.end(), s.at(f).args.begin(), s.at(f).args.end());
  return a;
}

}  // namespace

TEST(FlagPairs, EveryFlagOfTheProgramHasASample) {
  const auto s = samples();
  const auto flags = program_flags();
  EXPECT_EQ(flags.size(), s.size());
  for (const auto& f : flags) EXPECT_TRUE(s.contains(f)) << "--" << f << ": add a sample";
}

TEST(FlagPairs, EveryPairIsHonouredOrRefusedByName) {
  const auto s = samples();
  const auto flags = program_flags();
  for (const ft::TargetTraits& t : {ft::host_traits, ft::cuda_traits}) {
    int accepted = 0, refused = 0;
    for (std::size_t i = 0; i < flags.size(); ++i) {
      for (std::size_t j = i; j < flags.size(); ++j) {
        const std::string& f = flags[i];
        const std::string& g = flags[j];
        const Outcome r = i == j ? outcome(s.at(f).args, t) : outcome(args_of(s, {f, g}), t);
        const std::string what = std::string(t.program) + " --" + f + (i == j ? "" : " --" + g);
        if (r.accepted) {
          ++accepted;
          EXPECT_NE(r.text.find(s.at(f).effect), std::string::npos)
              << what << ": accepted, but --" << f << " (\"" << s.at(f).effect
              << "\") does not show in the run:\n"
              << r.text;
          EXPECT_NE(r.text.find(s.at(g).effect), std::string::npos)
              << what << ": accepted, but --" << g << " (\"" << s.at(g).effect
              << "\") does not show in the run:\n"
              << r.text;
        } else {
          ++refused;
          EXPECT_TRUE(names(r.text, f) || names(r.text, g))
              << what << ": refused without naming either flag: " << r.text;
          EXPECT_NE(r.text.find("fourway: "), std::string::npos) << what << ": " << r.text;
        }
      }
    }
    std::printf("%s: %d flags, %d single flags and pairs accepted and honoured, %d refused\n",
                t.program, static_cast<int>(flags.size()), accepted, refused);
    EXPECT_GT(accepted, 500) << t.program;
    EXPECT_GT(refused, 50) << t.program;
  }
}

// The combinations issue 44 found silently ignored, each refused with a message naming the flag
// and what it needs, and the ones that now work.
TEST(FlagPairs, WhatWasIgnoredIsRefusedOrHonoured) {
  const auto s = samples();
  struct Case {
    std::vector<std::string> args;
    std::string needle;  // in the refusal, or in the run when `accepted`
    bool accepted;
  };
  const std::vector<Case> cases = {
      {args_of(s, {"schedule"}),
       "--schedule orders the micro-batches of a pipeline; it needs "
       "--pp S > 1",
       false},
      {args_of(s, {"virtual-stages"}), "--virtual-stages cuts each pipeline rank's layers", false},
      {args_of(s, {"trace"}), "--trace records the pipeline's actions; it needs --pp S > 1", false},
      {args_of(s, {"sequence-parallel"}),
       "--sequence-parallel splits LayerNorm and residual "
       "regions over tensor-parallel ranks; it needs --tp N > 1",
       false},
      {args_of(s, {"pp", "bucket-mb"}),
       "--bucket-mb shapes the data-parallel path's overlapped "
       "gradient reduction; a pipeline reduces",
       false},
      {args_of(s, {"pp", "no-overlap"}), "--no-overlap shapes", false},
      {args_of(s, {"bucket-mb"}), "and this run has one; give --ranks or --dp", false},
      {args_of(s, {"comm-timeout"}),
       "--comm-timeout bounds the waits of communicators, and a "
       "one-rank run has none",
       false},
      {args_of(s, {"init-from", "seed"}), "--seed seeds the random init, and --init-from loads",
       false},
      {args_of(s, {"check", "log-json"}), "--log-json is not part of --check", false},
      {args_of(s, {"check", "quiet"}), "--quiet is not part of --check", false},
      {args_of(s, {"eval-every"}), "--eval-every evaluates on a validation file; give --val-data",
       false},
      {args_of(s, {"check", "val-data"}), "--val-data is not part of --check", false},
      {args_of(s, {"prompt"}), "--prompt shapes the samples; give --sample-tokens K", false},
      {args_of(s, {"pp", "sample-tokens"}), "samples of 8 tokens after the last step", true},
      {args_of(s, {"zero", "sample-tokens"}), "samples of 8 tokens after the last step", true},
      {args_of(s, {"val-data", "eval-batches"}),
       "validation on " + s.at("val-data").args[1] + " after the last step, 2 validation batches",
       true},
      {{"--steps", "0", "--save-dir", "x"},
       "--save-dir writes checkpoints after training "
       "steps, and --steps 0 runs none",
       false},
      {args_of(s, {"pp", "schedule"}), "schedule gpipe, 2 micro-batches", true},
      {{"--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", "--layers", "4"},
       "schedule interleaved, 2 micro-batches, 2 chunks per rank",
       true},
      {args_of(s, {"tp", "sequence-parallel"}), "sequence parallel", true},
      {args_of(s, {"ranks", "bucket-mb", "no-overlap"}), "bucket 1 MiB, overlap off", true},
      {args_of(s, {"dp"}), "run: DataParallel dp=2 on 2 ranks", true},
      {args_of(s, {"tp", "micro-batches"}), "batch: 8 sequences x 64 tokens, 2 micro-batches",
       true},
      {args_of(s, {"ranks", "comm-timeout"}), "timeout 30 s", true},
  };
  for (const auto& c : cases) {
    std::string line;
    for (const auto& a : c.args) line += " " + a;
    const Outcome r = outcome(c.args, ft::host_traits);
    EXPECT_EQ(r.accepted, c.accepted) << line << ": " << r.text;
    EXPECT_NE(r.text.find(c.needle), std::string::npos) << line << ":\n" << r.text;
  }
}

// --init-from takes the head count from the config.json beside the weights, refuses a --heads
// that contradicts it, and says where the count came from when there is none.
TEST(FlagPairs, InitFromReadsTheHeadsFromConfigJson) {
  const std::string four = gpt2_file("four_heads", 4).string();
  Outcome r = outcome({"--init-from", four}, ft::host_traits);
  ASSERT_TRUE(r.accepted) << r.text;
  EXPECT_NE(r.text.find("2 layers, width 32, 4 heads, vocab 64"), std::string::npos) << r.text;
  r = outcome({"--init-from", four, "--heads", "8"}, ft::host_traits);
  EXPECT_FALSE(r.accepted);
  EXPECT_NE(r.text.find("--heads 8 but "), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("config.json says n_head 4"), std::string::npos) << r.text;
  // without config.json the width (32) is no multiple of GPT-2's head size 64: --heads needed
  const std::string bare = gpt2_file("no_config", 0).string();
  r = outcome({"--init-from", bare}, ft::host_traits);
  EXPECT_FALSE(r.accepted);
  EXPECT_NE(r.text.find("cannot infer the head count of width 32"), std::string::npos) << r.text;
  r = outcome({"--init-from", bare, "--heads", "2"}, ft::host_traits);
  EXPECT_TRUE(r.accepted) << r.text;
  EXPECT_NE(r.text.find("2 heads"), std::string::npos) << r.text;
  // a config.json that contradicts the tensors is refused, naming both files
  const auto wrong = scratch("wrong") / "model.safetensors";
  std::filesystem::create_directories(wrong.parent_path());
  std::filesystem::copy_file(bare, wrong, std::filesystem::copy_options::overwrite_existing);
  {
    std::ofstream(wrong.parent_path() / "config.json")
        << R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 48, "n_head": 4})";
  }
  r = outcome({"--init-from", wrong.string()}, ft::host_traits);
  EXPECT_FALSE(r.accepted);
  EXPECT_NE(r.text.find("says n_embd 48 but"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("has width 32"), std::string::npos) << r.text;
  {
    std::ofstream(wrong.parent_path() / "config.json")
        << R"({"n_head": 4, "activation_function": "relu"})";
  }
  r = outcome({"--init-from", wrong.string()}, ft::host_traits);
  EXPECT_FALSE(r.accepted);
  EXPECT_NE(r.text.find("activation_function \"relu\" is not the tanh GELU"), std::string::npos)
      << r.text;
  { std::ofstream(wrong.parent_path() / "config.json") << "{\"n_head\": 4,"; }
  r = outcome({"--init-from", wrong.string()}, ft::host_traits);
  EXPECT_FALSE(r.accepted);
  EXPECT_NE(r.text.find("config.json is not valid JSON"), std::string::npos) << r.text;
}
