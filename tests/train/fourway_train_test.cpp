// End-to-end tests of the fourway-train program: it is run as users run it, on the golden files
// tools/make_train_golden.py wrote with PyTorch 1.13, and its --log-json output is checked.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/checkpoint/state_dir.hpp"
#include "fourway/train/token_data.hpp"
#include "support/program.hpp"

namespace fw = fourway;

namespace {

const std::string exe = FOURWAY_TRAIN_EXE;
const std::filesystem::path golden = FOURWAY_GOLDEN_DIR;
const std::filesystem::path weights = golden / "train_gpt2_v1.safetensors";
const std::filesystem::path tokens = golden / "train_tokens_v1.bin";
const std::filesystem::path expected = golden / "train_expected_v1.safetensors";

std::filesystem::path scratch(const std::string& name) {
  return fw::test::scratch_path("fourway_train_test", name);
}

using fw::test::ProgramRun;
using fw::test::slurp;

ProgramRun run(const std::string& args) {
  return fw::test::run_program(exe, args, "fourway_train_test");
}

/// The golden run's flags: the settings make_train_golden.py trained PyTorch with.
std::string golden_flags() {
  const auto e = fw::SafetensorsFile::read(expected);
  const auto cfg = e.read<float>(e.at("hparams"));
  std::ostringstream s;
  s.precision(9);
  s << "--init-from '" << weights.string() << "' --data '" << tokens.string()
    << "' --heads 4 --seq 8 --batch 3 --steps 8 --lr " << cfg[0] << " --beta1 " << cfg[1]
    << " --beta2 " << cfg[2] << " --eps " << cfg[3] << " --weight-decay " << cfg[4]
    << " --grad-clip " << cfg[5];
  return s.str();
}

/// The value of `"key":<number>` in one JSON line.
double json_field(const std::string& line, const std::string& key) {
  const auto k = line.find("\"" + key + "\":");
  if (k == std::string::npos) return NAN;
  return std::strtod(line.c_str() + k + key.size() + 3, nullptr);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty()) v.push_back(l);
  }
  return v;
}

/// The "loss" of every line of a --log-json file.
std::vector<double> losses(const std::filesystem::path& log) {
  std::vector<double> v;
  for (const auto& l : lines_of(slurp(log))) v.push_back(json_field(l, "loss"));
  return v;
}

/// A token file `name` of `n` pseudo-random byte ids (as the built-in corpus's) from `seed`.
std::filesystem::path byte_tokens(const std::string& name, std::size_t n, std::uint32_t seed) {
  const auto path = scratch(name);
  std::vector<std::uint16_t> toks(n);
  std::uint32_t x = seed;
  for (auto& t : toks) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<std::uint16_t>(x >> 24);
  }
  fw::TokenData::write(path, toks);
  return path;
}

}  // namespace

TEST(FourwayTrain, EveryStepMatchesPyTorchAdamWOnGoldenFiles) {
  const auto log = scratch("golden.jsonl");
  const auto saved = scratch("golden_final.safetensors");
  const ProgramRun r =
      run(golden_flags() + " --log-json '" + log.string() + "' --save '" + saved.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err << r.out;

  const auto e = fw::SafetensorsFile::read(expected);
  const auto loss = e.read<float>(e.at("loss"));
  const auto norm = e.read<float>(e.at("grad_norm"));
  const auto lines = lines_of(slurp(log));
  ASSERT_EQ(lines.size(), loss.size()) << "one JSON line per step";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    EXPECT_EQ(json_field(l, "step"), static_cast<double>(i + 1));
    // fp32 against PyTorch fp32 on the same weights and data: summation order differs, so a
    // few ulps per op; 1e-5 relative is the mesh-independence law's fp32 tolerance.
    const double got = json_field(l, "loss");
    EXPECT_NEAR(got, loss[i], 1e-5 * std::fabs(loss[i])) << "step " << i + 1;
    EXPECT_NEAR(json_field(l, "grad_norm"), norm[i], 1e-4 * norm[i]) << "step " << i + 1;
    EXPECT_GT(json_field(l, "tokens_per_s"), 0.0);
    for (const char* tag : {"\"weights\":", "\"grads\":", "\"optimizer_state\":",
                            "\"activations\":", "\"peak\":", "\"rank\":0"}) {
      EXPECT_NE(l.find(tag), std::string::npos) << tag << " missing in " << l;
    }
  }
  // The final weights, saved with HF names (no prefix), are PyTorch's after 8 AdamW steps.
  const auto f = fw::SafetensorsFile::read(saved);
  int compared = 0;
  for (const auto& want : e.entries()) {
    if (want.name.rfind("final.", 0) != 0) continue;
    const auto& got = f.at(want.name.substr(6));
    EXPECT_EQ(got.shape, want.shape) << got.name;
    const auto a = f.read<float>(got);
    const auto b = e.read<float>(want);
    // Everything moves by about lr = 1e-2 per step; 1e-5 is a thousandth of one step. The key
    // bias (c_attn.bias[C, 2C)) is left out: its true gradient is exactly zero (softmax ignores a
    // shift shared by all keys), so both runs feed rounding noise to Adam, whose normalised step
    // is then O(lr) in either direction, and no bound on it could fail. Its gradient is checked
    // directly (Gpt.KeyBiasGradientIsZero in tests/layers/gpt_test.cpp).
    const bool c_attn_bias = got.name.find("attn.c_attn.bias") != std::string::npos;
    const std::size_t C = 32;
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (c_attn_bias && i >= C && i < 2 * C) continue;
      worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    }
    EXPECT_LT(worst, 1e-5) << got.name;
    ++compared;
  }
  EXPECT_EQ(compared, 28);
}

TEST(FourwayTrain, SaveThenInitFromRoundTripsBitwise) {
  const auto a = scratch("rt_a.safetensors"), b = scratch("rt_b.safetensors");
  const auto data = " --data '" + tokens.string() + "' --seq 8 --batch 3 --quiet";
  ProgramRun r = run("--layers 2 --dim 48 --heads 6 --vocab 64 --steps 2 --seed 5 --save '" +
                     a.string() + "'" + data);
  ASSERT_EQ(r.status, 0) << r.err;
  r = run("--init-from '" + a.string() + "' --heads 6 --steps 0 --save '" + b.string() + "'" +
          data);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(a), slurp(b)) << "load -> save must reproduce the file byte for byte";
  // and the trained weights differ from the seed's init, so the round trip carried real state
  const ProgramRun c =
      run("--layers 2 --dim 48 --heads 6 --vocab 64 --steps 0 --seed 5 "
          "--save '" +
          b.string() + "'" + data);
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(slurp(a), slurp(b));
  // the golden HF-style file (prefix, buffers, tied lm_head) loads and saves as plain names
  r = run("--init-from '" + weights.string() + "' --heads 4 --steps 0 --save '" + b.string() + "'" +
          data);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto in = fw::SafetensorsFile::read(weights);
  const auto out = fw::SafetensorsFile::read(b);
  EXPECT_EQ(out.entries().size(), 28u);
  for (const auto& e : out.entries()) {
    const auto src = in.bytes(in.at("transformer." + e.name));
    const auto dst = out.bytes(e);
    ASSERT_EQ(src.size(), dst.size());
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << e.name;
  }
}

TEST(FourwayTrain, LowPrecisionAndCheckpointingRunAndLearn) {
  for (const std::string extra :
       {"--precision bf16", "--precision fp16", "--checkpoint-activations", "--classifier-chunk 5",
        "--classifier-chunk 5 --ranks 3 --zero 3", "--classifier-chunk 7 --pp 2 --micro-batches 3",
        "--checkpoint-activations selective",
        "--checkpoint-activations selective --tp 2 --pp 2 --ranks 4 --micro-batches 3 "
        "--schedule zb-h1 --sequence-parallel"}) {
    const auto log = scratch("lp.jsonl");
    const ProgramRun r = run(golden_flags() + " " + extra + " --log-json '" + log.string() + "'");
    ASSERT_EQ(r.status, 0) << extra << ": " << r.err;
    const auto lines = lines_of(slurp(log));
    ASSERT_EQ(lines.size(), 8u);
    const auto e = fw::SafetensorsFile::read(expected);
    const auto loss = e.read<float>(e.at("loss"));
    // bf16 keeps 8 mantissa bits: the first loss (same weights, rounded) within 2%; checkpointing
    // (full, or selective on one rank and on a tp2·pp2 ZB-H1 mesh) recomputes the same arithmetic,
    // and the fused classifier (5 or 7 token rows of logits at a time, on one rank, three ZeRO-3
    // ranks and a two-stage pipeline) sums wte's head gradient chunk by chunk: both as exact as
    // fp32.
    const bool fp32 = extra[2] == 'c';
    EXPECT_NEAR(json_field(lines[0], "loss"), loss[0], (fp32 ? 1e-5 : 2e-2) * loss[0]) << extra;
    EXPECT_NEAR(json_field(lines[7], "loss"), loss[7], (fp32 ? 1e-5 : 5e-2) * loss[7]) << extra;
  }
}

TEST(FourwayTrain, WarmupAndCosineDecayFollowNanoGptSchedule) {
  const auto log = scratch("sched.jsonl");
  const ProgramRun r =
      run(golden_flags() + " --warmup 2 --min-lr 0.001 --quiet --log-json '" + log.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = lines_of(slurp(log));
  ASSERT_EQ(lines.size(), 8u);
  const double lr = 1e-2, min_lr = 1e-3, pi = 3.14159265358979323846;
  for (int i = 0; i < 8; ++i) {
    // linear warm-up to lr over 2 steps, then cosine to min_lr at step 8 (nanoGPT's get_lr)
    const double want = i < 2 ? lr * (i + 1) / 2
                              : min_lr + 0.5 * (1 + std::cos(pi * (i - 2) / 6.0)) * (lr - min_lr);
    EXPECT_NEAR(json_field(lines[static_cast<std::size_t>(i)], "lr"), want, 1e-6 * want) << i;
  }
  // the first step is the golden one (same weights; only its update is smaller)
  const auto e = fw::SafetensorsFile::read(expected);
  EXPECT_NEAR(json_field(lines[0], "loss"), e.read<float>(e.at("loss"))[0], 1e-5 * 4.2);
}

TEST(FourwayTrain, HelpExitsZeroAndListsEveryFlag) {
  const ProgramRun r = run("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* f : {"--init-from",    "--layers",
                        "--dim",          "--heads",
                        "--vocab",        "--seq",
                        "--seed",         "--data",
                        "--batch",        "--steps",
                        "--lr",           "--weight-decay",
                        "--beta1",        "--beta2",
                        "--eps",          "--grad-clip",
                        "--precision",    "--checkpoint-activations",
                        "--log-json",     "--save",
                        "--save-dir",     "--save-every",
                        "--keep",         "--resume",
                        "--tf32",         "--classifier-chunk",
                        "--attention",    "--profile-step",
                        "--cuda-graph",   "--backend",
                        "--comm-timeout", "strict",
                        "--help"}) {
    EXPECT_NE(r.out.find(f), std::string::npos) << f;
  }
  // the host program works in fp32 unless told otherwise (fourway-train-cuda: bf16)
  const auto at = r.out.find("--precision");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NE(r.out.substr(at, r.out.find('\n', at) - at).find("[fp32]"), std::string::npos) << r.out;
}

TEST(FourwayTrain, BadInputsGiveAClearMessageAndNonZeroExit) {
  const auto truncated = scratch("truncated.safetensors");
  {
    const std::string w = slurp(weights);
    std::ofstream(truncated, std::ios::binary) << w.substr(0, w.size() / 2);
  }
  const auto bad_tokens = scratch("bad_tokens.bin");
  {
    std::string t = slurp(tokens);
    t[0] = 'X';
    std::ofstream(bad_tokens, std::ios::binary) << t;
  }
  const auto not_gpt2 = scratch("not_gpt2.safetensors");
  {
    fw::SafetensorsWriter w;
    const std::vector<float> v(4, 1.0f);
    w.add<float>("model.embed_tokens.weight", {2, 2}, v);
    w.write(not_gpt2);
  }
  const std::string init = "--init-from '" + weights.string() + "' ";
  const std::string data = "--data '" + tokens.string() + "' ";
  struct Case {
    std::string args;
    std::string message;
    int status;
  };
  const std::vector<Case> cases = {
      {"--lr-max 3", "unknown flag --lr-max; did you mean --lr?", 2},
      {"--bogus", "unknown flag --bogus", 2},
      {"--weight-decya 0.1", "unknown flag --weight-decya; did you mean --weight-decay?", 2},
      {"--steps --quiet", "--steps needs a value", 2},
      {"--batch abc", "--batch expects an integer, got 'abc'", 2},
      {"--lr nan", "--lr must be finite", 2},
      {"--precision fp8", "--precision must be one of fp32, bf16, fp16, got 'fp8'", 2},
      {"stray", "unexpected argument 'stray'", 2},
      {"--tf32", "fourway-train computes fp32 GEMMs in fp32 (drop --tf32)", 1},
      {"--attention fused", "fourway-train runs the host flash attention (drop --attention)", 1},
      {"--attention flash", "--attention must be one of blockwise, fused, cudnn, got 'flash'", 2},
      {"--attention cudnn", "--attention cudnn needs a fourway-train built with the cuDNN", 1},
      {"--attention cudnn --precision fp32",
       "--attention cudnn needs a fourway-train built with the cuDNN", 1},
      {"--steps 2 --profile-step 1", "fourway-train has none (drop --profile-step)", 1},
      {"--steps 2 --profile-step 3", "--profile-step must be in [0, --steps] = [0, 2], got 3", 1},
      {"--classifier-chunk -1", "--classifier-chunk must be >= 0", 1},
      {"--classifier-chunk 64 --tp 2", "the vocabulary-parallel head of --tp 2 keeps its slice", 1},
      {"--steps 1 --steps 2", "--steps given twice", 2},
      {init + data + "--heads 4 --seq 32", "--seq 32 exceeds the model's context of 16", 1},
      {init + data + "--heads 5", "5 heads do not divide the checkpoint's width 32", 1},
      {init + data, "cannot infer the head count of width 32", 1},
      {data + "--dim 32 --heads 5 --vocab 64", "--heads 5 does not divide --dim 32", 1},
      {data + "--vocab 32 --seq 8 --batch 3",
       "contains token id 63 but the model's vocabulary has 32", 1},
      {data + "--seq 8 --batch 64 --vocab 64", "holds 77 tokens; a batch of 64 x 8 needs 513", 1},
      {data + "--batch 0", "--batch must be positive", 1},
      {"--data /nonexistent/tokens.bin", "/nonexistent/tokens.bin: no such regular file", 1},
      {"--init-from /nonexistent/w.safetensors", "no such regular file", 1},
      {"--init-from '" + truncated.string() + "'", "truncated.safetensors", 1},
      {"--init-from '" + not_gpt2.string() + "'", "is not a GPT-2 checkpoint", 1},
      {"--data '" + bad_tokens.string() + "'", "magic number", 1},
      {"--lr -1", "learning rate -1 must be finite and >= 0", 1},
      {"--beta1 1.5", "betas must lie in [0, 1)", 1},
      {data + "--vocab 64 --seq 8 --batch 3 --steps 5 --warmup 10",
       "warmup < total iterations, got warmup 10 and total 5", 1},
      {data + "--vocab 64 --save /nonexistent/dir/out.safetensors --steps 0",
       "--save cannot create /nonexistent/dir/out.safetensors: directory /nonexistent/dir does "
       "not exist",
       1},
      {"--log-json /nonexistent/dir/log.jsonl", "--log-json cannot create", 1},
  };
  for (const auto& c : cases) {
    const ProgramRun r = run(c.args + " --quiet");
    EXPECT_EQ(r.status, c.status) << c.args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos)
        << c.args << "\nexpected: " << c.message << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find("fourway-train: "), std::string::npos) << r.err;
  }
}

// ---- models that do not fit: a per-rank cap, deferred construction, sharded load and save ----

TEST(FourwayTrain, ModelsThatDoNotFitTrainUnderZero3AndACap) {
  // Ψ = V·C + T·C + L·(12C² + 13C) + 2C for V 1024, T 32, C 128, L 4; the cap is a third of the
  // unsharded bf16 states 16Ψ, so one rank could never hold them.
  const std::int64_t C = 128, V = 1024, T = 32, L = 4;
  const std::int64_t psi = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  const std::int64_t cap = 16 * psi / 3;
  std::ostringstream gb;
  gb.precision(12);
  gb << static_cast<double>(cap) / 1e9;
  const auto log = scratch("cap.jsonl");
  const std::string model =
      "--layers 4 --dim 128 --heads 4 --vocab 1024 --seq 32 --batch 8 --steps 2 --precision bf16 "
      "--ranks 8 --quiet --memory-report --memory-cap-gb " +
      gb.str() + " --log-json '" + log.string() + "'";
  const ProgramRun ok = run(model + " --zero 3");
  ASSERT_EQ(ok.status, 0) << ok.err << ok.out;
  const auto lines = lines_of(slurp(log));
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& l : lines) {  // every rank's memory, each under the cap, peaks from the start
    std::size_t at = 0;
    int ranks = 0;
    while ((at = l.find("\"total_peak\":", at)) != std::string::npos) {
      const double peak = std::strtod(l.c_str() + at + 13, nullptr);
      EXPECT_LE(peak, static_cast<double>(cap));
      EXPECT_GT(peak, static_cast<double>(16 * psi / 8));  // more than the states at rest
      ++ranks;
      ++at;
    }
    EXPECT_EQ(ranks, 8) << l;
    EXPECT_NE(l.find("\"limit\":" + std::to_string(cap)), std::string::npos) << l;
  }
  std::size_t tables = 0;
  for (std::size_t at = 0; (at = ok.out.find("memory of rank", at)) != std::string::npos; ++at) {
    ++tables;
  }
  EXPECT_GE(tables, 16u) << "at start-up and in the report, every rank's table";
  // DataParallel with the same cap stops at construction with fourway's OutOfMemory
  const ProgramRun oom = run(model + " --zero 0");
  EXPECT_EQ(oom.status, 1) << oom.out;
  const std::vector<std::string> parts = {
      "fourway-train: fourway: out of memory on rank ", "B of optimizer_state",
      "past its cap of " + std::to_string(cap) + " B", "B in use: weights"};
  for (const auto& part : parts) {
    EXPECT_NE(oom.err.find(part), std::string::npos) << part << "\nstderr: " << oom.err;
  }
  EXPECT_EQ(oom.out.find("loss"), std::string::npos) << "it must fail before any step";
}

// --memory-cap-gb reaches every rank on every path: a 1000-byte cap stops the tensor-parallel and
// the pipeline runs at their first allocation past it with fourway's OutOfMemory (before, those
// two paths ignored the flag and trained).
TEST(FourwayTrain, TensorParallelAndPipelineRanksHonourTheCap) {
  const std::string model =
      "--layers 2 --dim 32 --heads 2 --vocab 64 --seq 16 --batch 4 --steps 1 "
      "--quiet --ranks 2 --memory-cap-gb 0.000001";
  for (const std::string axis : {"--tp 2", "--pp 2 --micro-batches 2"}) {
    const ProgramRun r = run(model + " " + axis);
    EXPECT_EQ(r.status, 1) << axis << "\n" << r.out;
    EXPECT_NE(r.err.find("out of memory on rank"), std::string::npos) << axis << "\n" << r.err;
    EXPECT_NE(r.err.find("past its cap of 1000 B"), std::string::npos) << axis << "\n" << r.err;
  }
}

/// The data flags of the save tests below, and the file they compare with: 2 blocks of width 48
/// trained 2 steps from seed 5 on one rank and saved by the one-process writer, at `a`.
const std::string share_data = " --data '" + tokens.string() + "' --seq 8 --batch 8 --quiet";
void save_one_rank_file(const std::filesystem::path& a) {
  const ProgramRun r = run("--layers 2 --dim 48 --heads 6 --vocab 64 --steps 2 --seed 5 --save '" +
                           a.string() + "'" + share_data);
  ASSERT_EQ(r.status, 0) << r.err;
}

TEST(FourwayTrain, EightRanksReadTheirShareAndSaveTheOneRankFile) {
  const auto a = scratch("share_a.safetensors"), b = scratch("share_b.safetensors");
  const auto& data = share_data;
  ASSERT_NO_FATAL_FAILURE(save_one_rank_file(a));
  ProgramRun r;
  const auto file = fw::SafetensorsFile::read(a);
  const std::uint64_t size = std::filesystem::file_size(a);
  const std::uint64_t header = file.data_offset();
  const std::uint64_t data_bytes = size - header;
  for (int zero = 0; zero <= 3; ++zero) {
    for (int ranks : {1, 8}) {
      SCOPED_TRACE(::testing::Message() << "--zero " << zero << " --ranks " << ranks);
      std::filesystem::remove(b);
      r = run("--init-from '" + a.string() + "' --heads 6 --steps 0 --zero " +
              std::to_string(zero) + " --ranks " + std::to_string(ranks) + " --save '" +
              b.string() + "'" + data);
      ASSERT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(slurp(a), slurp(b)) << "load -> save reproduces the file byte for byte";
      // every rank says how many bytes it read from the file
      int seen = 0;
      for (std::size_t at = 0; (at = r.out.find("  read ", at)) != std::string::npos; ++at) {
        const double got = std::strtod(r.out.c_str() + at + 7, nullptr);
        if (zero == 0 || ranks == 1) {
          EXPECT_EQ(got, static_cast<double>(size));  // a replica reads all of it, once
        } else {
          // its 1/8 of the tensor data (rounded up per segment: at most 64 segments here) + header
          EXPECT_LE(got, static_cast<double>(header + data_bytes / 8 + 64 * 4)) << r.out;
        }
        ++seen;
      }
      EXPECT_EQ(seen, ranks) << r.out;
    }
  }
}

/// The bytes every rank wrote, from the line --save prints ("... (B per rank: 10 20 ...)").
std::vector<std::int64_t> bytes_per_rank(const std::string& out) {
  std::vector<std::int64_t> v;
  const std::size_t at = out.find("B per rank:");
  if (at == std::string::npos) return v;
  std::istringstream in(out.substr(at + 11, out.find(')', at) - at - 11));
  for (std::int64_t b = 0; in >> b;) v.push_back(b);
  return v;
}

// --save on tensor-, pipeline-parallel and 3D meshes (with every ZeRO stage on the way) writes the
// one-rank file byte for byte, every rank writing only what it owns: each rank writes something,
// no rank more than twice an even share, and the counts add up to the file's tensor bytes (every
// element once). Before, these meshes gathered the whole model and one rank wrote all of it.
TEST(FourwayTrain, EveryMeshSavesTheOneRankFileEachRankWritingWhatItOwns) {
  const auto a = scratch("mesh_save_a.safetensors"), b = scratch("mesh_save_b.safetensors");
  ASSERT_NO_FATAL_FAILURE(save_one_rank_file(a));
  const auto file = fw::SafetensorsFile::read(a);
  const auto data_bytes =
      static_cast<std::int64_t>(std::filesystem::file_size(a) - file.data_offset());
  const std::vector<std::pair<std::string, int>> meshes = {
      {"--tp 2", 2},
      {"--pp 2 --micro-batches 2", 2},
      {"--tp 2 --zero 1", 4},
      {"--pp 2 --micro-batches 2 --zero 2", 4},
      {"--tp 2 --pp 2 --micro-batches 2 --zero 3", 8},
      {"--tp 2 --pp 2 --micro-batches 2 --zero 0", 8},
  };
  for (const auto& [mesh, ranks] : meshes) {
    SCOPED_TRACE(mesh + " --ranks " + std::to_string(ranks));
    std::filesystem::remove(b);
    const ProgramRun r =
        run("--init-from '" + a.string() + "' --heads 6 --steps 0 " + mesh + " --ranks " +
            std::to_string(ranks) + " --save '" + b.string() + "'" + share_data);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(slurp(a), slurp(b)) << "load -> save reproduces the file byte for byte";
    const auto wrote = bytes_per_rank(r.out);
    ASSERT_EQ(wrote.size(), static_cast<std::size_t>(ranks)) << r.out;
    std::int64_t sum = 0;
    for (const std::int64_t w : wrote) {
      EXPECT_GT(w, 0) << r.out;
      EXPECT_LE(w, 2 * data_bytes / ranks) << r.out;
      sum += w;
    }
    EXPECT_EQ(sum, data_bytes) << r.out;
  }
}

// When the model does not fit: tensor-parallel, pipeline and 3D meshes of 8 ranks under ZeRO-3
// train, checkpoint (--save-dir) and save (--save) under a per-rank cap below the whole model's
// fp32 weights, 4Ψ (what the old --save gathered on every rank). The cap is enforced on every
// allocation the accountant counts, the save's staging included; each rank's whole-run peak is
// read back from the memory report.
TEST(FourwayTrain, ThreeDMeshesTrainAndSaveUnderACapBelowTheWholeModel) {
  const std::int64_t C = 256, V = 1024, T = 16, L = 4;
  const std::int64_t psi = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  const std::int64_t cap = 4 * psi * 98 / 100;
  std::ostringstream gb;
  gb.precision(12);
  gb << static_cast<double>(cap) / 1e9;
  for (const std::string mesh : {"--tp 2", "--pp 4 --micro-batches 4",
                                 "--tp 2 --pp 2 --micro-batches 2", "--pp 2 --micro-batches 2"}) {
    SCOPED_TRACE(mesh);
    const auto saved = scratch("capped.safetensors");
    const auto dir = scratch("capped_ckpt");
    std::filesystem::remove(saved);
    std::filesystem::remove_all(dir);
    const ProgramRun r =
        run("--layers 4 --dim 256 --heads 4 --vocab 1024 --seq 16 --batch 8 --steps 2 "
            "--precision bf16 --ranks 8 --zero 3 --quiet --memory-report --memory-cap-gb " +
            gb.str() + " " + mesh + " --save '" + saved.string() + "' --save-dir '" + dir.string() +
            "'");
    ASSERT_EQ(r.status, 0) << r.err << r.out;
    EXPECT_EQ(fw::SafetensorsFile::read(saved).entries().size(),
              fw::gpt2_tensor_shapes(L, C, V, T).size());
    EXPECT_EQ(bytes_per_rank(r.out).size(), 8u) << r.out;
    int checkpoints = 0;  // --save-dir wrote the last step's
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      checkpoints += e.path().filename().string().rfind("step-", 0) == 0 ? 1 : 0;
    }
    EXPECT_EQ(checkpoints, 1) << r.out;
    // the report after the save: every rank's "total  current  peak  MiB" row
    const std::size_t report = r.out.rfind("saved ");
    ASSERT_NE(report, std::string::npos) << r.out;
    int rows = 0;
    for (std::size_t at = report; (at = r.out.find("\ntotal ", at)) != std::string::npos; ++at) {
      std::istringstream row(r.out.substr(at + 7, 80));
      double current = 0, peak = 0;
      row >> current >> peak;
      EXPECT_LE(peak, static_cast<double>(cap)) << r.out;
      EXPECT_GT(peak, static_cast<double>(16 * psi / 8)) << "more than the states at rest";
      ++rows;
    }
    EXPECT_EQ(rows, 8) << r.out;
  }
}

// Every path logs each step's model FLOPs, by the formula stated in docs/train.md and computed
// here from the shape (6 per parameter of the blocks and the LM head per token, 12·L·T·C per token
// for attention, times B·T), and with --peak-tflops the MFU against it, in the log and the
// progress line; without a peak the host has no MFU to print, and no GPU memory.
TEST(FourwayTrain, EveryPathLogsModelFlopsAndTheMfuAgainstThePeak) {
  const double L = 2, C = 32, V = 256, T = 16, B = 8;  // the built-in corpus: byte ids
  const double per_token = 6 * (L * (12 * C * C + 13 * C) + V * C) + 12 * L * T * C;
  const double flops = per_token * B * T;
  const std::string model =
      "--layers 2 --dim 32 --heads 2 --vocab 256 --seq 16 --batch 8 --steps 2 ";
  const auto log = scratch("mfu.jsonl");
  for (const std::string mesh : {"", "--ranks 2", "--tp 2 --ranks 2", "--pp 2 --ranks 2"}) {
    SCOPED_TRACE(mesh);
    ProgramRun r = run(model + mesh + " --peak-tflops 0.5 --log-json '" + log.string() + "'");
    ASSERT_EQ(r.status, 0) << r.err;
    const auto lines = lines_of(slurp(log));
    ASSERT_EQ(lines.size(), 2u);
    for (const auto& l : lines) {
      EXPECT_DOUBLE_EQ(json_field(l, "model_flops"), flops) << l;
      const double mfu = flops / (json_field(l, "step_ms") / 1e3) / 0.5e12;
      EXPECT_NEAR(json_field(l, "mfu"), mfu, 1e-6 * mfu) << l;
      EXPECT_EQ(l.find("device_memory_bytes"), std::string::npos) << l;
    }
    EXPECT_NE(r.out.find(" | MFU "), std::string::npos) << r.out;
    r = run(model + mesh + " --log-json '" + log.string() + "'");
    ASSERT_EQ(r.status, 0) << r.err;
    for (const auto& l : lines_of(slurp(log))) {
      EXPECT_DOUBLE_EQ(json_field(l, "model_flops"), flops) << l;
      EXPECT_EQ(l.find("\"mfu\""), std::string::npos) << l;
    }
    EXPECT_EQ(r.out.find(" | MFU "), std::string::npos) << r.out;
  }
  const ProgramRun bad = run(model + "--peak-tflops -1");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--peak-tflops must be >= 0"), std::string::npos) << bad.err;
}

// --val-data: the validation loss of the same batches, evaluated every --eval-every steps and
// after the last, forward only, is the one-rank figure on every mesh (data parallel under ZeRO-3,
// tensor parallel with sequence parallelism, a V-shaped and an interleaved pipeline, the latter
// held to NCCL's contract by the strict world, and the 3-D mesh); --steps 0 evaluates the
// weights as loaded; bad flags are refused by name.
TEST(FourwayTrain, ValidationLossIsTheOneRankFigureOnEveryMesh) {
  const auto val = byte_tokens("val.bin", 2000, 12345);
  const auto log = scratch("val.jsonl");
  const std::string model = "--layers 4 --dim 32 --heads 2 --vocab 256 --seq 16 --batch 8 " +
                            std::string("--val-data '") + val.string() + "' --eval-batches 3 ";
  const std::string logged = model + "--steps 4 --eval-every 2 --log-json '" + log.string() + "' ";
  const ProgramRun ref = run(logged);
  ASSERT_EQ(ref.status, 0) << ref.err << ref.out;
  std::vector<double> want;
  for (const auto& l : lines_of(slurp(log))) {
    const double v = json_field(l, "val_loss");
    const double step = json_field(l, "step");
    EXPECT_EQ(std::isnan(v), step == 1 || step == 3) << l;  // every 2 steps and the last
    if (!std::isnan(v)) want.push_back(v);
  }
  ASSERT_EQ(want.size(), 2u);
  EXPECT_GT(want[0], 4.0);  // near ln 256 = 5.5 for random bytes, and not zero
  EXPECT_NE(ref.out.find("validation " + val.string() + ": 2000 tokens, the first 3 batches"),
            std::string::npos)
      << ref.out;
  EXPECT_NE(ref.out.find("over 2 evaluations of 3 batches"), std::string::npos) << ref.out;
  EXPECT_NE(ref.out.find(" | val "), std::string::npos) << ref.out;
  for (const std::string mesh :
       {"--ranks 2 --zero 3", "--tp 2 --ranks 2 --sequence-parallel",
        "--pp 2 --ranks 2 --micro-batches 2 --schedule zb-v",
        "--pp 2 --ranks 2 --micro-batches 2 --schedule interleaved --backend strict",
        "--tp 2 --pp 2 --dp 2 --ranks 8 --zero 3 --micro-batches 2"}) {
    SCOPED_TRACE(mesh);
    const ProgramRun r = run(logged + mesh);
    ASSERT_EQ(r.status, 0) << r.err << r.out;
    std::vector<double> got;
    for (const auto& l : lines_of(slurp(log))) {
      const double v = json_field(l, "val_loss");
      if (!std::isnan(v)) got.push_back(v);
    }
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]);
  }
  // --steps 0: the loaded (here: initial) weights, evaluated once, on one rank and a pipeline
  const ProgramRun zero = run(model + "--steps 0");
  ASSERT_EQ(zero.status, 0) << zero.err;
  const auto at = zero.out.find("val loss ");
  ASSERT_NE(at, std::string::npos) << zero.out;
  const std::string line = zero.out.substr(at, zero.out.find('\n', at) - at);
  EXPECT_NE(line.find("over 3 batches"), std::string::npos) << line;
  const ProgramRun zero_pp = run(model + "--steps 0 --pp 2 --ranks 2");
  ASSERT_EQ(zero_pp.status, 0) << zero_pp.err;
  EXPECT_NE(zero_pp.out.find(line), std::string::npos) << zero_pp.out;
  // refused by name
  ProgramRun bad =
      run("--layers 2 --dim 32 --heads 2 --vocab 256 --seq 16 --batch 8 --steps 1 "
          "--val-data '" +
          val.string() + "' --eval-batches 30");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--eval-batches 30 but --val-data " + val.string() + " holds 15 batches"),
            std::string::npos)
      << bad.err;
  bad = run("--steps 1 --eval-every 2");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--eval-every evaluates on a validation file; give --val-data"),
            std::string::npos)
      << bad.err;
  bad = run("--steps 1 --val-data /nonexistent/val.bin");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--val-data /nonexistent/val.bin: no such regular file"),
            std::string::npos)
      << bad.err;
}

// --sample-tokens: greedy samples from the golden run's final weights are the tokens
// transformers' generate gives (tests/golden/sample_greedy_v1.txt, prompt 49 50 51 = "123" in
// byte ids) on every mesh: one rank, data parallel, ZeRO-3 (gathered unit by unit), tensor
// parallel, a pipeline, the 3-D mesh; seeded samples during training are the same on every mesh
// (a ZB-V pipeline under the strict world among them); a tokenizer beside --init-from is found;
// bad flags are refused by name.
TEST(FourwayTrain, SamplesAreTransformersGreedyTokensOnEveryMesh) {
  const auto dir = scratch("sample_init");
  std::filesystem::create_directories(dir);
  const auto init = dir / "model.safetensors";
  {
    const auto e = fw::SafetensorsFile::read(expected);
    fw::SafetensorsWriter w;
    for (const auto& t : e.entries()) {
      if (t.name.rfind("final.", 0) == 0) w.add<float>(t.name.substr(6), t.shape, e.read<float>(t));
    }
    w.write(init);
    fw::models::GptConfig c{.layers = 2, .heads = 4, .dim = 32, .vocab = 64, .max_seq = 16};
    fw::write_gpt2_config(init, c, "float32");
  }
  // 21, then 51 ("3") twelve times: transformers' greedy tokens after "123"
  const std::string want = "sample after step 0: \"\\u0015" + std::string(12, '3') + "\"";
  const std::string greedy = "--init-from '" + init.string() + "' --data '" + tokens.string() +
                             "' --seq 8 --batch 4 --steps 0 --sample-tokens 13 --temperature 0 "
                             "--prompt 123 --tokenizer bytes ";
  for (const std::string mesh :
       {"", "--ranks 2", "--ranks 2 --zero 3", "--tp 2 --ranks 2", "--pp 2 --ranks 2",
        "--tp 2 --pp 2 --dp 2 --ranks 8 --zero 3 --micro-batches 2"}) {
    SCOPED_TRACE(mesh);
    const ProgramRun r = run(greedy + mesh);
    ASSERT_EQ(r.status, 0) << r.err << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("samples: 13 tokens after the last step, greedy, prompt of 3 tokens, "
                         "decoded with byte ids"),
              std::string::npos)
        << r.out;
  }
  // sampled every 2 steps while training: the same text on every data-parallel mesh
  const auto log = scratch("samples.jsonl");
  const std::string train =
      "--layers 4 --dim 32 --heads 2 --vocab 256 --seq 16 --batch 4 "
      "--steps 4 --sample-every 2 --sample-tokens 10 --top-k 20 "
      "--sample-seed 5 --prompt 'The ' --log-json '" +
      log.string() + "' ";
  std::vector<std::string> ref;
  for (const std::string mesh :
       {"", "--ranks 2 --zero 3", "--tp 2 --ranks 2 --sequence-parallel",
        "--pp 2 --ranks 2 --micro-batches 2 --schedule zb-v --backend strict",
        "--tp 2 --pp 2 --ranks 4 --micro-batches 2 --schedule interleaved"}) {
    SCOPED_TRACE(mesh);
    const ProgramRun r = run(train + mesh);
    ASSERT_EQ(r.status, 0) << r.err << r.out;
    std::vector<std::string> got;
    for (const auto& l : lines_of(slurp(log))) {
      const auto at = l.find("\"sample\":");
      if (at != std::string::npos) got.push_back(l.substr(at, l.find("\",\"", at + 10) - at));
    }
    ASSERT_EQ(got.size(), 2u) << "steps 2 and 4";
    if (ref.empty()) ref = got;
    EXPECT_EQ(got, ref);
  }
  // Hugging Face's tokenizer files beside --init-from are the default tokenizer
  const auto bpe = std::filesystem::path(FOURWAY_GOLDEN_DIR) / "bpe_tiny_v1";
  const auto big = scratch("sample_bpe");
  std::filesystem::create_directories(big);
  ProgramRun r =
      run("--layers 1 --dim 32 --heads 2 --vocab 1281 --seq 16 --steps 0 --data '" +
          tokens.string() + "' --batch 2 --save '" + (big / "m.safetensors").string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  std::filesystem::copy_file(bpe / "tokenizer.json", big / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  r = run("--init-from '" + (big / "m.safetensors").string() + "' --data '" + tokens.string() +
          "' --batch 2 --seq 8 --steps 0 --sample-tokens 6 --prompt 'hello world'");
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("decoded with " + (big / "tokenizer.json").string()), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("sample after step 0: \""), std::string::npos) << r.out;
  // refused by name
  const std::string rnd = "--layers 1 --dim 32 --heads 2 --vocab 256 --seq 16 --steps 1 ";
  r = run(rnd + "--prompt hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--prompt shapes the samples; give --sample-tokens K"), std::string::npos)
      << r.err;
  r = run(rnd + "--sample-tokens 4 --tokenizer /nonexistent/tok");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--tokenizer /nonexistent/tok: no such file or folder"), std::string::npos)
      << r.err;
  r = run(rnd + "--sample-tokens 14 --prompt abc");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("the prompt is 3 tokens and --sample-tokens 14: 17 exceed the model's "
                       "context of 16 tokens"),
            std::string::npos)
      << r.err;
  r = run("--layers 1 --dim 32 --heads 2 --vocab 300 --seq 16 --steps 1 --sample-tokens 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no tokenizer was found for a vocabulary of 300"), std::string::npos)
      << r.err;
}

TEST(FourwayTrain, SaveDirEveryNStepsThenResumeOnAnotherMeshContinuesTheRun) {
  // Uninterrupted on 2 ranks ZeRO-3; interrupted: 4 steps on 2 ranks ZeRO-3 saving every 2
  // (keeping 1), resumed on the same mesh (bitwise) and on 3 ranks ZeRO-1 (within 1e-5).
  const auto dir = scratch("ckpt_dir");
  std::filesystem::remove_all(dir);
  const std::string model =
      "--layers 2 --dim 48 --heads 6 --vocab 64 --seed 5 --seq 8 --batch 6 --quiet --data '" +
      tokens.string() + "' ";
  const auto whole = scratch("whole.jsonl"), part = scratch("part.jsonl"),
             same = scratch("same.jsonl"), other = scratch("other.jsonl");
  ProgramRun r = run(model + "--ranks 2 --zero 3 --steps 6 --log-json '" + whole.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run(model + "--ranks 2 --zero 3 --steps 4 --save-dir '" + dir.string() +
          "' --save-every 2 --keep 1 --log-json '" + part.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> kept;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    kept.push_back(e.path().filename().string());
  }
  EXPECT_EQ(kept, std::vector<std::string>{"step-00000004"});
  r = run(model + "--ranks 2 --zero 3 --steps 6 --resume '" + dir.string() + "' --log-json '" +
          same.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from " + (dir / "step-00000004").string() +
                       " at step 4 (saved by 2 ranks)"),
            std::string::npos)
      << r.out;
  r = run(model + "--ranks 3 --zero 1 --steps 6 --resume '" + (dir / "step-00000004").string() +
          "' --log-json '" + other.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto w = losses(whole.string()), p = losses(part.string()), s = losses(same.string()),
             o = losses(other.string());
  ASSERT_EQ(w.size(), 6u);
  ASSERT_EQ(p.size(), 4u);
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(o.size(), 2u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(p[i], w[i]) << "step " << i + 1;
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(s[i], w[4 + i]) << "step " << i + 5;  // the log prints the float exactly
    EXPECT_NEAR(o[i], w[4 + i], 1e-5 * std::fabs(w[4 + i])) << "step " << i + 5;
  }
  // Misuse: typed errors before any training.
  r = run(model + "--steps 2 --save-every 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--save-every and --keep need --save-dir DIR"), std::string::npos) << r.err;
  r = run(model + "--steps 2 --resume '" + scratch("nothing_here").string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("holds no committed checkpoint"), std::string::npos) << r.err;
  r = run(model + "--steps 3 --resume '" + dir.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("is at step 4 but --steps is 3; raise --steps"), std::string::npos) << r.err;
}

TEST(FourwayTrain, SaveAsyncWritesWhatTheSynchronousSaveWritesAndResumesBitwise) {
  // 4 steps on 2 ranks ZeRO-3 saving every 2, once synchronously and once with --save-async:
  // both roots hold step 2 and step 4 with byte-identical files (index included, it has no
  // timing fields); resuming the async one to step 6 gives the uninterrupted run's losses.
  const auto sync_dir = scratch("ckpt_sync"), async_dir = scratch("ckpt_async");
  std::filesystem::remove_all(sync_dir);
  std::filesystem::remove_all(async_dir);
  const std::string model =
      "--layers 2 --dim 48 --heads 6 --vocab 64 --seed 5 --seq 8 --batch 6 --data '" +
      tokens.string() + "' --ranks 2 --zero 3 ";
  const auto whole = scratch("async_whole.jsonl"), part = scratch("async_part.jsonl"),
             rest = scratch("async_rest.jsonl");
  ProgramRun r = run(model + "--quiet --steps 6 --log-json '" + whole.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run(model + "--quiet --steps 4 --save-dir '" + sync_dir.string() + "' --save-every 2");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run(model + "--steps 4 --save-dir '" + async_dir.string() +
          "' --save-every 2 --save-async --log-json '" + part.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint step 2: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("writing in the background"), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("checkpoint " + (async_dir / "step-00000004").string() + " committed (async)"),
      std::string::npos)
      << r.out;
  for (const char* step : {"step-00000002", "step-00000004"}) {
    for (const char* f : {"index.json", "rank-00000.safetensors", "rank-00001.safetensors"}) {
      const auto a = async_dir / step / f, s = sync_dir / step / f;
      ASSERT_TRUE(std::filesystem::exists(a)) << a;
      EXPECT_EQ(slurp(a), slurp(s)) << step << "/" << f;
    }
  }
  r = run(model + "--quiet --steps 6 --resume '" + async_dir.string() + "' --log-json '" +
          rest.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto w = losses(whole), p = losses(part), s = losses(rest);
  ASSERT_EQ(w.size(), 6u);
  ASSERT_EQ(p.size(), 4u);
  ASSERT_EQ(s.size(), 2u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(p[i], w[i]) << "step " << i + 1;
  for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(s[i], w[4 + i]) << "step " << i + 5;
  // the flag is listed, and refused without a directory to save to
  EXPECT_NE(run("--help").out.find("--save-async"), std::string::npos);
  r = run(model + "--quiet --steps 2 --save-async");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--save-async needs --save-dir DIR"), std::string::npos) << r.err;
}

TEST(FourwayTrain, ThreeDMeshCheckpointsResumeOnTheSameMeshBitwiseAndOnOthersWithinTolerance) {
  // tp2·pp2·dp2 ZeRO-1 (8 ranks): uninterrupted for 6 steps; interrupted after 4 (saving every
  // 2 with --save-async), resumed on the same mesh (bitwise), on 4 ranks ZeRO-3 (no tp, no pp)
  // and on tp2·dp2 (within 1e-5).
  const auto dir = scratch("ckpt_3d");
  std::filesystem::remove_all(dir);
  const std::string model =
      "--layers 2 --dim 48 --heads 6 --vocab 64 --seed 5 --seq 8 --batch 8 --quiet --data '" +
      tokens.string() + "' ";
  const std::string mesh3d = "--ranks 8 --tp 2 --pp 2 --zero 1 --micro-batches 2 ";
  const auto whole = scratch("3d_whole.jsonl"), part = scratch("3d_part.jsonl"),
             same = scratch("3d_same.jsonl"), dp4 = scratch("3d_dp4.jsonl"),
             tp2 = scratch("3d_tp2.jsonl");
  ProgramRun r = run(model + mesh3d + "--steps 6 --log-json '" + whole.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run(model + mesh3d + "--steps 4 --save-dir '" + dir.string() +
          "' --save-every 2 --save-async --log-json '" + part.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run(model + mesh3d + "--steps 6 --resume '" + dir.string() + "' --log-json '" +
          same.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run(model + "--ranks 4 --zero 3 --steps 6 --resume '" + dir.string() + "' --log-json '" +
          dp4.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run(model + "--ranks 4 --tp 2 --steps 6 --resume '" + dir.string() + "' --log-json '" +
          tp2.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto w = losses(whole), p = losses(part), s = losses(same), d = losses(dp4),
             t = losses(tp2);
  ASSERT_EQ(w.size(), 6u);
  ASSERT_EQ(p.size(), 4u);
  ASSERT_EQ(s.size(), 2u);
  ASSERT_EQ(d.size(), 2u);
  ASSERT_EQ(t.size(), 2u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(p[i], w[i]) << "step " << i + 1;
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(s[i], w[4 + i]) << "step " << i + 5;
    EXPECT_NEAR(d[i], w[4 + i], 1e-5 * std::fabs(w[4 + i])) << "step " << i + 5;
    EXPECT_NEAR(t[i], w[4 + i], 1e-5 * std::fabs(w[4 + i])) << "step " << i + 5;
  }
  // one file per rank, every checksum as the index says, strided (tp column) slices among them
  const auto ckpt = fw::StateDir::open(dir / "step-00000004");
  EXPECT_EQ(ckpt.index().files.size(), 8u);
  EXPECT_TRUE(ckpt.verify_files().empty());
  EXPECT_EQ(ckpt.index().meta.at("saved_by_ranks"), "8");
}

// --vocab-align: the padded vocabulary on one rank, under ZeRO-1/3 and in a pipeline trains as
// the unpadded model does (losses within the cross-mesh 1e-5), a GPT-2 file loads into the
// padded ZeRO-3 model and saves back byte for byte (the real rows only), and a checkpoint the
// padded ZeRO-3 run saves resumes on one unpadded rank. Expected values: the unpadded run.
TEST(FourwayTrain, PaddedVocabularyTrainsSavesAndResumesLikeTheUnpaddedModel) {
  const std::string model =
      "--layers 2 --dim 48 --heads 6 --vocab 64 --seed 5 --seq 8 --batch 4 --quiet --data '" +
      tokens.string() + "' ";
  const auto plain_log = scratch("pad_plain.jsonl"), log = scratch("pad.jsonl");
  const auto a = scratch("pad_a.safetensors"), b = scratch("pad_b.safetensors");
  ProgramRun r =
      run(model + "--steps 4 --log-json '" + plain_log.string() + "' --save '" + a.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto want = losses(plain_log);
  ASSERT_EQ(want.size(), 4u);
  for (const std::string mesh :
       {"", "--ranks 2 --zero 3 ", "--ranks 2 --zero 1 ", "--pp 2 --micro-batches 2 "}) {
    SCOPED_TRACE(mesh);
    r = run(model + mesh + "--vocab-align 48 --steps 4 --log-json '" + log.string() + "'");
    ASSERT_EQ(r.status, 0) << r.err;
    const auto got = losses(log);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::fabs(want[i])) << "step " << i + 1;
    }
  }
  std::filesystem::remove(b);
  r = run("--init-from '" + a.string() + "' --heads 6 --steps 0 --zero 3 --ranks 2 --vocab-align " +
          "48 --save '" + b.string() + "' --data '" + tokens.string() +
          "' --seq 8 --batch 4 --quiet");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(a), slurp(b)) << "the padded model writes GPT-2's 64 rows, byte for byte";
  const auto dir = scratch("pad_ckpt");
  std::filesystem::remove_all(dir);
  r = run(model + "--ranks 2 --zero 3 --vocab-align 48 --steps 2 --save-dir '" + dir.string() +
          "'");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run(model + "--steps 4 --resume '" + dir.string() + "' --log-json '" + log.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto resumed = losses(log);
  ASSERT_EQ(resumed.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(resumed[i], want[2 + i], 1e-5 * std::fabs(want[2 + i])) << "step " << i + 3;
  }
}

// ---- every path ends honestly, config.json beside every --save, the README's figure ----------

// --steps 0 runs no step and says so: no "loss 0 -> 0" of steps that did not happen (before,
// every path printed "loss 0.0000 -> 0.0000 over 0 steps").
TEST(FourwayTrain, StepsZeroSaysNoStepRanInsteadOfALoss) {
  const std::string model =
      "--layers 2 --dim 32 --heads 4 --vocab 64 --seq 8 --batch 4 --steps 0 --data '" +
      tokens.string() + "' ";
  for (const std::string mesh : {"", "--ranks 2 --zero 3 ", "--tp 2 ", "--pp 2 "}) {
    const ProgramRun r = run(model + mesh);
    ASSERT_EQ(r.status, 0) << mesh << r.err;
    EXPECT_NE(r.out.find("no step run (--steps 0)"), std::string::npos) << mesh << r.out;
    EXPECT_EQ(r.out.find("loss 0.0000 -> 0.0000"), std::string::npos) << mesh << r.out;
    EXPECT_EQ(r.out.find("idle fraction"), std::string::npos) << mesh << "no step, no idle time";
  }
}

/// The value of `"key": <value>` in a JSON text, as written.
std::string json_value(const std::string& text, const std::string& key) {
  const auto k = text.find("\"" + key + "\":");
  if (k == std::string::npos) return "";
  auto v = text.find_first_not_of(' ', k + key.size() + 3);
  const auto end = text.find_first_of(",\n}", v);
  return text.substr(v, end - v);
}

// Every --save writes Hugging Face's config.json beside the weights (any shape: 6 heads of 8,
// which width/64 cannot give), on every path, and --init-from reads the head count back from it:
// before, --init-from assumed width/64 without a word and this file could not load without
// --heads.
TEST(FourwayTrain, SaveWritesConfigJsonThatInitFromReads) {
  const std::string data = "--data '" + tokens.string() + "' --seq 8 --batch 4 --quiet ";
  const std::string model = "--layers 2 --dim 48 --heads 6 --vocab 64 " + data;
  for (const std::string mesh :
       {"", "--ranks 2 --zero 3 ", "--tp 2 ", "--pp 2 ", "--tp 2 --pp 2 --dp 2 --zero 1 "}) {
    SCOPED_TRACE(mesh);
    const auto dir = scratch("hf_" + std::to_string(mesh.size()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const auto file = dir / "model.safetensors";
    ProgramRun r = run(model + mesh + "--steps 1 --save '" + file.string() + "'");
    ASSERT_EQ(r.status, 0) << r.err;
    const std::string config = slurp(dir / "config.json");
    ASSERT_FALSE(config.empty()) << "no config.json beside " << file;
    const std::vector<std::pair<std::string, std::string>> want = {
        {"model_type", "\"gpt2\""},
        {"n_layer", "2"},
        {"n_embd", "48"},
        {"n_head", "6"},
        {"vocab_size", "64"},
        {"n_positions", "8"},
        {"n_ctx", "8"},
        {"activation_function", "\"gelu_new\""},
        {"layer_norm_epsilon", "1e-05"},
        {"tie_word_embeddings", "true"},
        {"n_inner", "null"},
        {"torch_dtype", "\"float32\""}};
    for (const auto& [key, value] : want) EXPECT_EQ(json_value(config, key), value) << key;
    // --init-from without --heads takes the 6 heads from config.json and trains
    r = run("--init-from '" + file.string() + "' " + data + "--steps 1");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("6 heads"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("heads from " + (dir / "config.json").string()), std::string::npos)
        << r.out;
    // a --heads that contradicts it is refused before anything runs
    r = run("--init-from '" + file.string() + "' " + data + "--steps 1 --heads 3");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("--heads 3 but " + (dir / "config.json").string() + " says n_head 6"),
              std::string::npos)
        << r.err;
  }
  // bf16 files say so
  const auto dir = scratch("hf_bf16");
  std::filesystem::create_directories(dir);
  const ProgramRun r =
      run(model + "--precision bf16 --steps 0 --save '" + (dir / "m.safetensors").string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json_value(slurp(dir / "config.json"), "torch_dtype"), "\"bfloat16\"");
}

// The shipped program has no fault injection: FOURWAY_TRAIN_SKIP_COLLECTIVES, which isolated
// every rank before (the MPI negative control's hook), changes nothing; the fault lives in a test
// build (tests/parallel/train_skip_collectives.cpp).
TEST(FourwayTrain, TheShippedProgramIgnoresTheOldFaultHook) {
  const std::string args =
      "--layers 2 --dim 32 --heads 4 --vocab 64 --seq 8 --batch 4 --steps 3 "
      "--ranks 2 --quiet --data '" +
      tokens.string() + "' --log-json ";
  const auto clean = scratch("hook_clean.jsonl"), hooked = scratch("hook_set.jsonl");
  ProgramRun r = run(args + "'" + clean.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  r = fw::test::run_program(
      "env", "FOURWAY_TRAIN_SKIP_COLLECTIVES=1 '" + exe + "' " + args + "'" + hooked.string() + "'",
      "fourway_train_test");
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(losses(clean).size(), 3u);
  EXPECT_EQ(losses(hooked), losses(clean));
}

// README's "Models that do not fit" figure is what the program measures: its command, run as
// written there, prints every rank's whole-run peak, and README quotes it to the byte.
TEST(FourwayTrain, ReadmesZero3PeakIsWhatTheProgramMeasures) {
  const std::string readme = slurp(FOURWAY_README);
  const auto at = readme.find("fourway-train --layers 4 --dim 256 --heads 8 --vocab 2048");
  ASSERT_NE(at, std::string::npos) << "the README's command moved";
  std::string cmd;  // the command's two lines, joined
  const auto end = readme.find('\n', readme.find('\n', at) + 1);
  const auto start = at + std::string("fourway-train").size();
  for (char c : readme.substr(start, end - start)) {
    if (c != '\\' && c != '\n') cmd += c;
  }
  const auto figure = readme.find("whole-run peak ", end);
  ASSERT_NE(figure, std::string::npos);
  std::string digits;
  for (std::size_t i = figure + 15; i < readme.size() && readme[i] != ' '; ++i) {
    if (readme[i] != ',') digits += readme[i];
  }
  const ProgramRun r = run(cmd);
  ASSERT_EQ(r.status, 0) << cmd << "\n" << r.err;
  const auto report = r.out.rfind("\nloss ");  // --memory-report's tables follow the last loss
  ASSERT_NE(report, std::string::npos) << r.out;
  std::istringstream out(r.out.substr(report));
  int ranks = 0;
  for (std::string line; std::getline(out, line);) {
    if (line.rfind("total ", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    std::string current, peak;
    fields >> current >> peak;
    EXPECT_EQ(peak, digits) << "README says " << digits << ", the run measured " << peak;
    ++ranks;
  }
  EXPECT_EQ(ranks, 8) << r.out;
}

// --cuda-graph on rehearses the captured step on the host (train/trainer.hpp, StepCapture): the
// same losses, validation losses and saved file as the uncaptured run, bit for bit; step 1 fills
// the cache, step 2 is captured, the validation after step 3 drops the graph and step 4
// recaptures. A mesh is refused; auto leaves the host program uncaptured and says nothing.
TEST(FourwayTrain, CudaGraphOnRehearsesTheCaptureWithTheSameLossesAndFile) {
  const auto val = byte_tokens("graph_val.bin", 600, 777);
  const std::string model =
      "--layers 2 --dim 32 --heads 2 --vocab 256 --seq 16 --batch 4 "
      "--steps 6 --eval-every 3 --eval-batches 2 --val-data '" +
      val.string() + "' --micro-batches 2 ";
  std::vector<std::string> logged;
  std::vector<std::string> saved;
  for (const std::string graph : {"off", "on", "auto"}) {
    const auto log = scratch("graph_" + graph + ".jsonl");
    const auto file = scratch("graph_" + graph + ".safetensors");
    const ProgramRun r = run(model + "--cuda-graph " + graph + " --log-json '" + log.string() +
                             "' --save '" + file.string() + "'");
    ASSERT_EQ(r.status, 0) << graph << r.err << r.out;
    std::string figures;  // each line's loss and validation loss as logged
    for (const auto& l : lines_of(slurp(log))) {
      const auto at = l.find("\"loss\":");
      figures += l.substr(at, l.find(',', at) - at);
      const auto v = l.find("\"val_loss\":");
      if (v != std::string::npos) figures += l.substr(v, l.find(',', v) - v);
      figures += "\n";
    }
    logged.push_back(figures);
    saved.push_back(slurp(file));
    const bool says =
        r.out.find("cuda graph: 2 captures, 3 of 6 steps replayed") != std::string::npos;
    EXPECT_EQ(says, graph == "on") << graph << r.out;
    EXPECT_EQ(r.out.find("cuda graph:") != std::string::npos, graph == "on") << graph << r.out;
  }
  EXPECT_NE(logged[0].find("val_loss"), std::string::npos) << logged[0];
  EXPECT_EQ(logged[1], logged[0]);
  EXPECT_EQ(logged[2], logged[0]);
  EXPECT_TRUE(saved[1] == saved[0]) << "the captured run saved other weights";
  const ProgramRun mesh = run(model + "--cuda-graph on --ranks 2");
  EXPECT_NE(mesh.status, 0);
  EXPECT_NE(mesh.err.find("--cuda-graph on captures a one-rank step"), std::string::npos)
      << mesh.err;
}
