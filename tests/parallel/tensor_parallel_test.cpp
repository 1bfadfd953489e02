// models::Gpt split over a tp group (Megatron splits, vocabulary-parallel embedding and loss,
// sequence parallelism) under ShardedStrategy on LocalWorld meshes against the one-rank
// fw::models::Gpt: fp32, 20 steps, losses, per-step global norms and the gathered final parameters
// within 1e-5 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <type_traits>

#include "fourway/plan/architecture.hpp"
#include "fourway/plan/communication.hpp"
#include "fourway/plan/planner.hpp"
#include "fourway/plan/runtime_activation.hpp"
#include "tp_harness.hpp"

namespace {

using tph::RunConfig;
using tph::RunResult;

// Summation order differs from one rank (partial products summed over the group, the norm over
// slices), so results agree to rounding, amplified a little by Adam: 1e-5 relative (as for
// DataParallel/ZeRO, tests/parallel/sharded_test.cpp), per tensor in the L2 norm.
constexpr double kFp32Tol = 1e-5;

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void expect_close(const RunResult& got, const RunResult& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (std::size_t s = 0; s < ref.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], ref.losses[s], tol * std::abs(ref.losses[s]))
        << what << " step " << s;
    // a norm that counted replicated parameters N times would be off by far more than this
    EXPECT_NEAR(got.norms[s], ref.norms[s], tol * ref.norms[s]) << what << " norm, step " << s;
  }
  ASSERT_EQ(got.names, ref.names) << what;
  for (std::size_t i = 0; i < ref.params.size(); ++i) {
    auto a = got.params[i];
    auto b = ref.params[i];
    ASSERT_EQ(a.size(), b.size()) << what << " " << ref.names[i];
    if (ref.names[i].ends_with("attn.c_attn.bias")) {
      const std::size_t C = b.size() / 3;
      // The key bias has an exactly zero gradient (softmax ignores a constant added to a row of
      // scores): rounding noise that Adam scales to about lr per step (as sharded_test.cpp).
      for (std::size_t k = C; k < 2 * C; ++k) {
        EXPECT_LE(std::abs(a[k] - b[k]), 2.0 * tph::adamw().config().lr * ref.losses.size())
            << what << " " << ref.names[i] << "[" << k << "]";
      }
      a.erase(a.begin() + static_cast<std::ptrdiff_t>(C),
              a.begin() + static_cast<std::ptrdiff_t>(2 * C));
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(C),
              b.begin() + static_cast<std::ptrdiff_t>(2 * C));
    }
    EXPECT_LE(rel_err(a, b), tol) << what << " " << ref.names[i];
  }
  EXPECT_TRUE(got.padding_zero) << what << ": the padding rows of wte moved";
  for (const auto& l : got.rank_losses) EXPECT_EQ(l, got.losses) << what << ": ranks disagree";
}

std::string describe(const RunConfig& rc) {
  return "tp " + std::to_string(rc.tp) + " dp " + std::to_string(rc.dp) + " zero " +
         std::to_string(rc.stage) + (rc.sequence_parallel ? " sp" : "") +
         (rc.checkpoint ? " ckpt" : "") + " align " + std::to_string(rc.alignment);
}

class TensorParallelMatchesOneRank : public ::testing::TestWithParam<bool> {};

TEST_P(TensorParallelMatchesOneRank, Fp32TwentyStepsVocab301) {
  const RunResult ref = tph::run_single<float>(20);
  for (int n : {1, 2, 4, 8}) {
    RunConfig rc;
    rc.tp = n;
    rc.sequence_parallel = GetParam();
    expect_close(tph::run_tp<float>(rc), ref, kFp32Tol, describe(rc));
  }
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, TensorParallelMatchesOneRank, ::testing::Bool());

TEST(TensorParallel, OddWidthWhereHeadsAllow) {
  // width 15 = 5 heads of 3: tp 5 (and 1) split it; vocabulary 301 pads to 305 at tp 5
  auto cfg = tph::config();
  cfg.dim = 15;
  cfg.heads = 5;
  const RunResult ref = tph::run_single<float>(20, false, cfg);
  for (int n : {1, 5}) {
    for (bool sp : {false, true}) {
      RunConfig rc;
      rc.tp = n;
      rc.model = cfg;
      rc.sequence_parallel = sp;
      expect_close(tph::run_tp<float>(rc), ref, kFp32Tol, "width 15, " + describe(rc));
    }
  }
}

TEST(TensorParallel, AlignedPaddingLeavesWholeShardsEmpty) {
  // tp 8, alignment 128: Vp = 1024, ranks 3..7 hold only padding and still agree.
  const RunResult ref = tph::run_single<float>(6);
  for (bool sp : {false, true}) {
    RunConfig rc;
    rc.tp = 8;
    rc.alignment = 128;
    rc.steps = 6;
    rc.sequence_parallel = sp;
    expect_close(tph::run_tp<float>(rc), ref, kFp32Tol, describe(rc));
  }
}

TEST(TensorParallel, ActivationCheckpointing) {
  const RunResult ref = tph::run_single<float>(20, true);
  for (bool sp : {false, true}) {
    RunConfig rc;
    rc.tp = 2;
    rc.checkpoint = true;
    rc.sequence_parallel = sp;
    expect_close(tph::run_tp<float>(rc), ref, kFp32Tol, describe(rc));
  }
}

TEST(TensorParallel, WithDataParallelAndEveryZeroStage) {
  const RunResult ref = tph::run_single<float>(20);
  for (int stage : {0, 1, 2, 3}) {
    RunConfig rc;
    rc.tp = 2;
    rc.dp = 2;
    rc.stage = stage;
    rc.sequence_parallel = stage == 2;
    expect_close(tph::run_tp<float>(rc), ref, kFp32Tol, describe(rc));
  }
}

TEST(TensorParallel, Bf16WithinTolerance) {
  const RunResult ref = tph::run_single<fw::bf16>(10);
  for (bool sp : {false, true}) {
    RunConfig rc;
    rc.tp = 2;
    rc.steps = 10;
    rc.sequence_parallel = sp;
    const RunResult got = tph::run_tp<fw::bf16>(rc);
    double d = 0;
    for (std::size_t s = 0; s < ref.losses.size(); ++s) {
      d = std::max(d, std::abs(double(got.losses[s]) - ref.losses[s]) / ref.losses[s]);
    }
    std::printf("bf16 %s: max relative loss difference to one rank %.3g\n", describe(rc).c_str(),
                d);
    // bf16 keeps 8 significant bits; partial products summed over the group round differently
    // from the one-rank GEMM (docs/parallel-tp.md): bound 1e-3 over 10 steps.
    EXPECT_LE(d, 1e-3) << describe(rc);
  }
}

TEST(TensorParallel, NormCountsReplicatedParametersOnce) {
  // The norm check in expect_close has teeth: counting every replicated parameter on every tp
  // rank (N times) changes the norm of this model by far more than the tolerance.
  fw::MemoryAccountant mem(0);
  fw::Context<fw::Host> ctx(mem);
  fw::models::Gpt<float, fw::Host> model(ctx, tph::config(), tph::kSeed);
  const auto b = tph::batch(0);
  fw::Tensor<std::int32_t, fw::Host> tok(fw::Shape{b.B, b.T}, fw::MemTag::workspace, mem);
  fw::Tensor<std::int32_t, fw::Host> tgt(fw::Shape{b.B, b.T}, fw::MemTag::workspace, mem);
  std::copy(b.inputs.begin(), b.inputs.end(), tok.data());
  std::copy(b.targets.begin(), b.targets.end(), tgt.data());
  fw::models::Gpt<float, fw::Host>::Stash s;
  model.forward(ctx, tok, tgt, s);
  model.backward(ctx, s);
  const auto table = tph::gpt_placements(tph::config(), 2, 1);
  double once = 0, twice = 0;
  std::size_t i = 0;
  model.visit_parameters([&](fw::Parameter<float, fw::Host>& p) {
    double ss = 0;
    for (std::int64_t k = 0; k < p.numel(); ++k) ss += double(p.grad[k]) * p.grad[k];
    once += ss;
    twice += table[i++].split == fw::tp::Split::replicated ? 2 * ss : ss;
  });
  EXPECT_GT(std::sqrt(twice) - std::sqrt(once), 100 * kFp32Tol * std::sqrt(once));
}

TEST(TensorParallel, HeadsNotDivisibleIsATypedError) {
  fw::launch<fw::LocalWorld>(4, [](fw::World<fw::LocalWorld>& w) {
    auto cfg = tph::config();
    cfg.heads = 6;  // 24 / 6 = 4 per head, 6 heads over 4 ranks
    try {
      fw::models::Gpt<float, fw::Host, fw::LocalComm> m(w.ctx(), cfg, w.comm(), 1);
      ADD_FAILURE() << "no error for heads=6 over tp=4";
    } catch (const fw::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("tp=4 ranks needs heads=6 divisible by 4"),
                std::string::npos)
          << e.what();
    }
  });
}

// ---- what moves and what is held, against the planner's formulas (plan/) ----------------------

TEST(TensorParallel, BytesPerStepEqualTheFormula) {
  namespace fp = fw::plan;
  const auto cfg = tph::config();
  for (int dp : {1, 2}) {
    for (int n : {2, 4}) {
      for (bool sp : {false, true}) {
        RunConfig rc;
        rc.tp = n;
        rc.dp = dp;
        rc.steps = 2;
        rc.sequence_parallel = sp;
        const RunResult got = tph::run_tp<float>(rc);
        const fp::ActivationShape x{double(tph::kSeq), double(tph::kBatch / dp), double(cfg.dim),
                                    cfg.layers};
        const double want =
            fp::runtime_tensor_parallel_bytes(x, n, sp, fp::Precision::fp32, false, 1);
        for (std::size_t r = 0; r < got.tp_bytes.size(); ++r) {
          EXPECT_DOUBLE_EQ(got.tp_bytes[r], want) << describe(rc) << " rank " << r;
          const auto& ops = got.tp_ops[r];
          // sequence parallelism moves the activations as reduce-scatter + all-gather pairs
          EXPECT_EQ(ops[1].calls, sp ? 2u * (2 * cfg.layers + 1) : 0u) << describe(rc);
          EXPECT_EQ(ops[2].calls, sp ? 2u * (2 * cfg.layers + 1) : 0u) << describe(rc);
        }
        // measured: the bytes LocalWorld's copy loops read from and wrote into the peers'
        // buffers of each tp group (ranks g·n .. g·n+n-1) in that step. A rank's share of a
        // small all-reduce follows its slice (a 1-element one is all rank 0's), so the group's
        // total is what equals n times the per-rank ring formula.
        for (int g = 0; g < dp; ++g) {
          double measured = 0;
          for (int q = 0; q < n; ++q)
            measured += got.tp_measured[static_cast<std::size_t>(g * n + q)];
          EXPECT_DOUBLE_EQ(measured, n * want) << describe(rc) << " tp group " << g;
        }
        std::printf(
            "%s: %.0f B modelled, %.0f B measured on rank 0 per step in the tp group "
            "(formula %.0f)\n",
            describe(rc).c_str(), got.tp_bytes[0], got.tp_measured[0], want);
      }
    }
  }
}

TEST(TensorParallel, WeightBytesPerRankEqualThePlanner) {
  namespace fp = fw::plan;
  const auto cfg = tph::config();
  const auto arch = fp::gpt2_shape(cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq);
  for (int n : {1, 2, 4, 8}) {
    RunConfig rc;
    rc.tp = n;
    rc.steps = 1;
    const RunResult got = tph::run_tp<float>(rc);
    // alignment 1: every rank holds ceil(V/t) vocabulary rows, the planner's fullest rank
    const auto want = static_cast<std::size_t>(fp::stage_params(arch, n, 1, 0) * 4);
    for (std::size_t r = 0; r < got.weight_bytes.size(); ++r) {
      EXPECT_EQ(got.weight_bytes[r], want) << "tp " << n << " rank " << r;
    }
    // and the placement table says the same (padding included), for any alignment
    for (int align : {1, 128}) {
      std::int64_t local = 0;
      for (const auto& p : tph::gpt_placements(cfg, n, align)) local += p.local_numel(n);
      const std::int64_t vp = fw::tp::padded_vocab(cfg.vocab, n, align);
      EXPECT_EQ(local,
                fp::stage_params(arch, n, 1, 0) + (vp / n - (cfg.vocab + n - 1) / n) * cfg.dim)
          << "tp " << n << " align " << align;
    }
  }
}

// `make_plan` with `--footprint fourway` for a tp (× dp, ± SP, ZeRO 0-3) mesh against what each
// rank's accountant holds after real steps: model states byte for byte on every rank, the
// activation peak of the fullest vocabulary shard, and the tp bytes Counting counted.
template <class T>
void expect_plan_equals_run(const RunConfig& rc) {
  namespace fp = fw::plan;
  const RunResult got = tph::run_tp<T>(rc);
  const auto& cfg = rc.model;
  const auto arch = fp::gpt2_shape(cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq);
  fp::Strategy st;
  st.dp = rc.dp;
  st.tp = rc.tp;
  st.zero = rc.stage;
  st.micro_batch = tph::kBatch / rc.dp;
  st.precision = std::is_same_v<T, float> ? fp::Precision::fp32 : fp::Precision::bf16;
  st.checkpointing = rc.checkpoint ? fp::Checkpointing::full : fp::Checkpointing::none;
  st.sequence_parallel = rc.sequence_parallel;
  fp::Options o;
  o.footprint = fp::Footprint::fourway;
  o.bucket_bytes = 2048;  // the harness's ShardedOptions::bucket_bytes
  o.vocab_alignment = rc.alignment;
  const fp::Plan plan =
      fp::make_plan(fp::Model{arch, 0}, fp::Cluster{fp::h100, rc.tp * rc.dp}, st, o);
  const fp::StagePlan& p = plan.worst();
  std::size_t peak = 0;
  for (std::size_t r = 0; r < got.states.size(); ++r) {
    const auto& s = got.states[r];
    EXPECT_EQ(static_cast<std::int64_t>(s[0]), p.states.weights) << describe(rc) << " rank " << r;
    EXPECT_EQ(static_cast<std::int64_t>(s[1]), p.states.grads) << describe(rc) << " rank " << r;
    EXPECT_EQ(static_cast<std::int64_t>(s[2]), p.states.master_weights)
        << describe(rc) << " rank " << r;
    EXPECT_EQ(static_cast<std::int64_t>(s[3]), p.states.optimizer_state)
        << describe(rc) << " rank " << r;
    EXPECT_LE(static_cast<double>(got.activation_peak[r]), p.activations + p.recompute_working)
        << describe(rc) << " rank " << r;
    peak = std::max(peak, got.activation_peak[r]);
    EXPECT_DOUBLE_EQ(got.tp_bytes[r], p.tensor_parallel.bytes) << describe(rc) << " rank " << r;
  }
  EXPECT_EQ(static_cast<double>(peak), p.activations + p.recompute_working) << describe(rc);
}

TEST(TensorParallel, FourwayFootprintOfThePlannerEqualsTheAccountant) {
  RunConfig rc;
  rc.model.max_seq = tph::kSeq;  // the planner's architecture trains at its context
  rc.steps = 2;
  // tp 2 and 4, with and without sequence parallelism, on one replica; then `more` of each
  const auto each_tp = [&rc](auto&& more) {
    for (int n : {2, 4}) {
      for (bool sp : {false, true}) {
        rc.tp = n;
        rc.sequence_parallel = sp;
        rc.dp = 1;
        rc.stage = 0;
        expect_plan_equals_run<float>(rc);
        more();
      }
    }
  };
  each_tp([&rc] {
    rc.dp = 2;
    for (int stage : {0, 1, 2, 3}) {
      rc.stage = stage;
      expect_plan_equals_run<float>(rc);
    }
  });
  // mixed precision (master weights) and a padded vocabulary (Vp = 512 for 301 over 2 ranks)
  rc.tp = 2;
  rc.dp = 2;
  rc.stage = 2;
  rc.alignment = 128;
  expect_plan_equals_run<fw::bf16>(rc);
  rc.stage = 3;
  rc.sequence_parallel = false;
  expect_plan_equals_run<float>(rc);
  // checkpointed tp blocks: kept outputs, the recomputed block's stash at the peak
  rc.alignment = 1;
  rc.checkpoint = true;
  each_tp([] {});
  rc.tp = 2;
  rc.dp = 2;
  rc.stage = 3;
  expect_plan_equals_run<float>(rc);
}

TEST(TensorParallel, ActivationBytesEqualThePrediction) {
  namespace fp = fw::plan;
  const auto cfg = tph::config();
  const auto b = tph::batch(0);
  for (int n : {1, 2, 4}) {
    for (bool sp : {false, true}) {
      std::vector<std::int64_t> block(static_cast<std::size_t>(n));
      fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
        fw::tp::TpOptions to;
        to.sequence_parallel = sp;
        to.vocab_alignment = 1;
        fw::models::Gpt<float, fw::Host, fw::LocalComm> model(w.ctx(), cfg, w.comm(), tph::kSeed,
                                                              to);
        auto& mem = w.memory();
        fw::Tensor<std::int32_t, fw::Host> tok(fw::Shape{b.B, b.T}, fw::MemTag::workspace, mem);
        fw::Tensor<std::int32_t, fw::Host> tgt(fw::Shape{b.B, b.T}, fw::MemTag::workspace, mem);
        std::copy(b.inputs.begin(), b.inputs.end(), tok.data());
        std::copy(b.targets.begin(), b.targets.end(), tgt.data());
        decltype(model)::Stash s;
        const std::size_t before = mem.current(fw::MemTag::activations);
        model.forward(w.ctx(), tok, tgt, s);
        const auto kept = static_cast<std::int64_t>(mem.current(fw::MemTag::activations) - before);
        const fp::GptActivationShape x{b.B, b.T, cfg.dim, cfg.heads, cfg.vocab, cfg.layers};
        const std::int64_t rows = model.placements().front().valid_rows(n, w.rank());
        EXPECT_EQ(kept, fp::runtime_tp_activation_bytes(x, n, sp, rows))
            << "tp " << n << (sp ? " sp" : "") << " rank " << w.rank();
        model.backward(w.ctx(), s);
        EXPECT_EQ(mem.current(fw::MemTag::activations), before);
      });
      const fp::GptActivationShape x{b.B, b.T, cfg.dim, cfg.heads, cfg.vocab, cfg.layers};
      std::printf("tp %d%s: %lld B per block per rank\n", n, sp ? " sp" : "",
                  static_cast<long long>(fp::runtime_tp_block_activation_bytes(x, n, sp)));
    }
  }
  // sequence parallelism divides the LayerNorm/residual region by tp
  const fp::GptActivationShape x{tph::kBatch, tph::kSeq, cfg.dim, cfg.heads, cfg.vocab, cfg.layers};
  const std::int64_t region = 6 * tph::kBatch * tph::kSeq * cfg.dim * 4;
  EXPECT_EQ(fp::runtime_tp_block_activation_bytes(x, 4, false) -
                fp::runtime_tp_block_activation_bytes(x, 4, true),
            region - region / 4 - 2 * tph::kBatch * tph::kSeq * cfg.dim * 4 +
                2 * (2 * tph::kBatch * tph::kSeq * 4) * 3 / 4);
}

}  // namespace
