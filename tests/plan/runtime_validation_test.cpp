// The planner against the runtime: model-state bytes equal the memory accountant's exactly, and
// fourway's activation model matches the measured peak of MemTag::activations (within 10%, the
// contract of docs/design.md, the memory law; today it is byte for byte, and the test says so).
#include <gtest/gtest.h>

#include <cstdint>
#include <mutex>
#include <random>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/comm/counting.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/plan/architecture.hpp"
#include "fourway/plan/model_state.hpp"
#include "fourway/plan/planner.hpp"
#include "fourway/plan/runtime_activation.hpp"
#include "fourway/plan/runtime_model_state.hpp"
#include "fourway/train/sharded_strategy.hpp"
#include "fourway/train/strategy.hpp"
#include "fourway/train/trainer.hpp"

namespace fw = fourway;
namespace fp = fourway::plan;
using fw::Host;
using fw::MemTag;

namespace {

template <class T>
constexpr fp::Precision precision_of() {
  if constexpr (std::is_same_v<T, float>)
    return fp::Precision::fp32;
  else if constexpr (std::is_same_v<T, fw::bf16>)
    return fp::Precision::bf16;
  else
    return fp::Precision::fp16;
}

struct Measured {
  std::int64_t params = 0;
  fp::ModelStateBytes states;
  fp::ModelStateBytes states_after_step;
  std::int64_t activation_peak = 0;
  std::int64_t activations_left = 0;
};

// Builds the GPT and the one-rank strategy, then runs one training step of `micro_batches`
// micro-batches of B sequences of T tokens, measuring the accountant.
template <class T>
Measured one_rank_step(const fw::models::GptConfig& cfg, std::int64_t B, std::int64_t Tn,
                       int micro_batches) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  fw::models::Gpt<T, Host> gpt(ctx, cfg, 11);
  fw::SingleRank<fw::models::Gpt<T, Host>, fw::Precision<T>, Host> strategy(ctx, gpt);
  auto states = [&] {
    return fp::ModelStateBytes{static_cast<std::int64_t>(mem.current(MemTag::weights)),
                               static_cast<std::int64_t>(mem.current(MemTag::grads)),
                               static_cast<std::int64_t>(mem.current(MemTag::master_weights)),
                               static_cast<std::int64_t>(mem.current(MemTag::optimizer_state))};
  };
  Measured r;
  r.params = gpt.num_parameters();
  r.states = states();

  std::mt19937_64 g(5);
  fw::Tensor<std::int32_t, Host> tok({B, Tn}, MemTag::workspace, mem);
  fw::Tensor<std::int32_t, Host> tgt({B, Tn}, MemTag::workspace, mem);
  mem.reset_peak();
  strategy.begin_step();
  for (int i = 0; i < micro_batches; ++i) {
    for (std::int64_t k = 0; k < B * Tn; ++k) {
      tok[k] = static_cast<std::int32_t>(g() % static_cast<std::uint64_t>(cfg.vocab));
      tgt[k] = static_cast<std::int32_t>(g() % static_cast<std::uint64_t>(cfg.vocab));
    }
    strategy.begin_micro_batch(i, micro_batches);
    typename fw::models::Gpt<T, Host>::Stash s;
    (void)gpt.forward(ctx, tok, tgt, s, strategy.hooks());
    gpt.backward(ctx, s, 1.0f / static_cast<float>(micro_batches), strategy.hooks());
    strategy.end_micro_batch(i, micro_batches);
  }
  (void)strategy.finish_step(fw::StepControl{1e-3f, 1.0f, false});
  r.activation_peak = static_cast<std::int64_t>(mem.peak(MemTag::activations));
  r.activations_left = static_cast<std::int64_t>(mem.current(MemTag::activations));
  r.states_after_step = states();
  return r;
}

fp::Checkpointing recompute_of(const fw::models::GptConfig& cfg) {
  return cfg.checkpoint  ? fp::Checkpointing::full
         : cfg.selective ? fp::Checkpointing::selective
                         : fp::Checkpointing::none;
}

template <class T>
void check_one_rank(fw::models::GptConfig cfg, std::int64_t B, std::int64_t Tn, int micro_batches) {
  const fp::Precision p = precision_of<T>();
  const Measured m = one_rank_step<T>(cfg, B, Tn, micro_batches);
  const auto arch = fp::gpt2_shape(cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq);
  const std::int64_t psi = fp::total_params(arch);
  ASSERT_EQ(psi, m.params);

  // Model states: exactly the formula, before and after the optimizer step.
  const fp::ModelStateBytes plan = fp::model_state_bytes(psi, p, 0, 1);
  EXPECT_EQ(m.states, plan);
  EXPECT_EQ(m.states_after_step, plan);
  EXPECT_EQ(plan.total(), 16 * psi);

  // Activations: fourway's own model of its stash.
  const fp::GptActivationShape x{B,         Tn,         cfg.dim, cfg.heads,
                                 cfg.vocab, cfg.layers, p,       cfg.classifier_chunk};
  const std::int64_t model = fp::runtime_activation_bytes(x, recompute_of(cfg));
  const double rel =
      static_cast<double>(model - m.activation_peak) / static_cast<double>(m.activation_peak);
  EXPECT_LE(std::abs(rel), 0.10) << "planner " << model << " B, accountant peak "
                                 << m.activation_peak << " B";
  EXPECT_EQ(model, m.activation_peak) << "runtime_activation.hpp no longer matches the stash of "
                                         "layers/: update it tensor by tensor";
  EXPECT_EQ(m.activations_left, 0);
}

fw::models::GptConfig odd_config(bool checkpoint) {
  fw::models::GptConfig cfg;
  cfg.layers = 3;
  cfg.heads = 5;
  cfg.dim = 35;  // with 97 and 23: no segment divides by 2, 3 or 4, so every shard is padded
  cfg.vocab = 97;
  cfg.max_seq = 23;
  cfg.checkpoint = checkpoint;
  return cfg;
}

}  // namespace

TEST(PlanRuntimeValidation, OneRankFp32) { check_one_rank<float>(odd_config(false), 3, 19, 1); }
TEST(PlanRuntimeValidation, OneRankBf16) { check_one_rank<fw::bf16>(odd_config(false), 2, 23, 1); }
TEST(PlanRuntimeValidation, OneRankFp16Checkpointed) {
  check_one_rank<fw::fp16>(odd_config(true), 3, 17, 1);
}
TEST(PlanRuntimeValidation, OneRankBf16CheckpointedWithLargeVocabulary) {
  auto cfg = odd_config(true);
  cfg.vocab = 1031;  // the head outweighs one block: the other branch of the checkpointed peak
  check_one_rank<fw::bf16>(cfg, 2, 13, 1);
}
// Selective recomputation, each branch of its peak: the last block's whole stash (a small head),
// the head beside the reduced stashes (a large vocabulary), GELU's recomputed output (the fused
// classifier keeps no logits).
TEST(PlanRuntimeValidation, OneRankSelective) {
  auto cfg = odd_config(false);
  cfg.selective = true;
  check_one_rank<float>(cfg, 3, 19, 1);
  cfg.vocab = 1031;
  check_one_rank<fw::bf16>(cfg, 2, 13, 1);
  cfg.vocab = 97;
  cfg.classifier_chunk = 5;
  check_one_rank<fw::bf16>(cfg, 2, 13, 2);
}
// The padded vocabulary at tp = 1 (GptConfig::vocab_alignment, 97 -> 128 rows): the runtime
// model's element counts (wte's padded rows) and its activation formula with the logits as wide
// as the padded vocabulary equal what the accountant counts.
TEST(PlanRuntimeValidation, OneRankPaddedVocabulary) {
  auto cfg = odd_config(false);
  cfg.vocab_alignment = 32;
  const Measured m = one_rank_step<fw::bf16>(cfg, 2, 19, 1);
  const auto arch = fp::gpt2_shape(cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq);
  std::int64_t psi = 0;
  for (std::int64_t n : fp::gpt2_backward_numels(arch, fp::TensorSplit{1, 32})) psi += n;
  EXPECT_EQ(psi, fp::total_params(arch) + (128 - 97) * cfg.dim);
  EXPECT_EQ(psi, m.params);
  EXPECT_EQ(m.states, fp::model_state_bytes(psi, fp::Precision::bf16, 0, 1));
  const fp::GptActivationShape x{2, 19, cfg.dim, cfg.heads, 128, cfg.layers, fp::Precision::bf16};
  EXPECT_EQ(fp::runtime_activation_bytes(x, false), m.activation_peak);
}

// Micro-batches run one after another: the peak is one micro-batch's.
TEST(PlanRuntimeValidation, GradientAccumulationKeepsOneStash) {
  check_one_rank<float>(odd_config(false), 2, 11, 3);
}

// ---- several ranks: ShardedStrategy<0|1|2|3> on a LocalWorld -----------------------------------

namespace {

struct MeshCase {
  int stage = 0;
  int ranks = 1;
  int micro_batches = 1;
  std::int64_t bucket_bytes = 25LL << 20;
  bool checkpoint = false;
  bool whole_run = false;  // also hold the whole-run peak to the planner's total (10%)
};

struct RankMeasure {
  fp::ModelStateBytes states;
  std::int64_t activation_peak = 0;
  std::int64_t total_peak = 0;    // the whole run: construction and both steps
  fp::DataParallelBytes traffic;  // of the second step
};

template <class T, int Stage>
std::vector<RankMeasure> run_mesh(const fw::models::GptConfig& cfg, const MeshCase& mc,
                                  std::int64_t global_batch, std::int64_t Tn) {
  using Model = fw::models::Gpt<T, Host>;
  using Comm = fw::Counting<fw::LocalComm>;
  using S = fw::ShardedStrategy<Stage, Model, fw::Precision<T>, Host, Comm>;
  std::vector<RankMeasure> out(static_cast<std::size_t>(mc.ranks));
  std::mutex mu;
  std::mt19937 rng(3);
  std::vector<std::int32_t> rows(static_cast<std::size_t>(global_batch * (Tn + 1)));
  for (auto& t : rows) t = static_cast<std::int32_t>(rng() % static_cast<unsigned>(cfg.vocab));
  const fw::TokenBatch batch = fw::TokenBatch::from_rows(rows, global_batch, Tn);
  fw::launch<fw::LocalWorld>(mc.ranks, [&](fw::World<fw::LocalWorld>& w) {
    Comm dp(w.comm().split(0, w.rank(), "dp"));
    Model model = Model::deferred(w.ctx(), cfg, 11);  // peaks count from here on
    fw::TrainerOptions opts;
    opts.micro_batches = mc.micro_batches;
    fw::ShardedOptions so;
    so.bucket_bytes = mc.bucket_bytes;
    fw::Trainer<S> t(opts, w.ctx(), model, dp, fw::AdamW{}, so);
    (void)t.step(batch.view());
    dp.counters().reset();
    (void)t.step(batch.view());
    auto& m = w.memory();
    RankMeasure r;
    r.traffic.all_reduce = dp.counters().get("dp", fw::CommOp::all_reduce).modelled_bytes;
    r.traffic.reduce_scatter = dp.counters().get("dp", fw::CommOp::reduce_scatter).modelled_bytes;
    r.traffic.all_gather = dp.counters().get("dp", fw::CommOp::all_gather).modelled_bytes;
    r.states = fp::ModelStateBytes{static_cast<std::int64_t>(m.current(MemTag::weights)),
                                   static_cast<std::int64_t>(m.current(MemTag::grads)),
                                   static_cast<std::int64_t>(m.current(MemTag::master_weights)),
                                   static_cast<std::int64_t>(m.current(MemTag::optimizer_state))};
    r.activation_peak = static_cast<std::int64_t>(m.peak(MemTag::activations));
    r.total_peak = static_cast<std::int64_t>(m.total_peak());
    std::lock_guard lock(mu);
    out[static_cast<std::size_t>(w.rank())] = r;
  });
  return out;
}

template <class T>
void check_mesh(const MeshCase& mc) {
  auto cfg = odd_config(mc.checkpoint);
  const std::int64_t per_rank = 2;  // sequences per micro-batch per rank
  const std::int64_t global_batch = per_rank * mc.ranks * mc.micro_batches;
  const std::int64_t Tn = cfg.max_seq;  // the planner's architecture trains at its context
  std::vector<RankMeasure> got;
  switch (mc.stage) {
    case 0: got = run_mesh<T, 0>(cfg, mc, global_batch, Tn); break;
    case 1: got = run_mesh<T, 1>(cfg, mc, global_batch, Tn); break;
    case 2: got = run_mesh<T, 2>(cfg, mc, global_batch, Tn); break;
    default: got = run_mesh<T, 3>(cfg, mc, global_batch, Tn); break;
  }
  const fp::Precision p = precision_of<T>();
  const auto arch = fp::gpt2_shape(cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq);
  const fp::ModelStateBytes plan =
      fp::runtime_model_state_bytes(arch, p, mc.stage, mc.ranks, mc.bucket_bytes);
  const fp::GptActivationShape x{per_rank, Tn, cfg.dim, cfg.heads, cfg.vocab, cfg.layers, p};
  const std::int64_t act = fp::runtime_activation_bytes(x, recompute_of(cfg));
  const fp::DataParallelBytes traffic = fp::runtime_data_parallel_bytes(
      arch, p, mc.stage, mc.ranks, mc.micro_batches, mc.bucket_bytes);
  // The planner itself, asked for fourway's footprint of this mesh.
  fp::Strategy st;
  st.dp = mc.ranks;
  st.zero = mc.stage;
  st.micro_batch = per_rank;
  st.micro_batches = mc.micro_batches;
  st.precision = p;
  st.checkpointing = recompute_of(cfg);
  fp::Options opts;
  opts.footprint = fp::Footprint::fourway;
  opts.bucket_bytes = mc.bucket_bytes;
  const fp::Plan whole =
      fp::make_plan(fp::Model{arch, 0}, fp::Cluster{fp::h100, mc.ranks}, st, opts);
  for (std::size_t r = 0; r < got.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "stage " << mc.stage << ", " << mc.ranks << " ranks, rank "
                                      << r << ", buckets of " << mc.bucket_bytes << " B, "
                                      << mc.micro_batches << " micro-batches");
    EXPECT_EQ(got[r].states, plan);
    const double rel = static_cast<double>(act - got[r].activation_peak) /
                       static_cast<double>(got[r].activation_peak);
    EXPECT_LE(std::abs(rel), 0.10)
        << "planner " << act << " B, accountant " << got[r].activation_peak;
    EXPECT_EQ(act, got[r].activation_peak);
    // All-reduce bytes carry the factor 2(N-1)/N, summed bucket by bucket by the decorator and
    // once here: equal up to double rounding.
    EXPECT_EQ(got[r].states, whole.worst().states);
    EXPECT_EQ(static_cast<double>(got[r].activation_peak),
              whole.worst().activations + whole.worst().recompute_working);
    // The whole-run peak (construction, steps) against the planner's per-rank total: the
    // transients (gathered units, gradient buckets, workspace) are modelled, not counted.
    const double whole_run = whole.worst().total();
    if (mc.whole_run) {
      EXPECT_LE(std::abs(whole_run - static_cast<double>(got[r].total_peak)),
                0.10 * static_cast<double>(got[r].total_peak))
          << "planner " << whole_run << " B, accountant " << got[r].total_peak << " B";
    }
    EXPECT_NEAR(got[r].traffic.all_reduce, traffic.all_reduce, 1e-12 * traffic.all_reduce);
    EXPECT_EQ(got[r].traffic.reduce_scatter, traffic.reduce_scatter);
    EXPECT_EQ(got[r].traffic.all_gather, traffic.all_gather);
  }
  // The published law next to the runtime's padding: the total is within N-1 elements per segment.
  const std::int64_t psi = fp::total_params(arch);
  const auto law = fp::model_state_bytes(psi, p, mc.stage, mc.ranks, fp::Padding::flat());
  const auto segments = fp::runtime_segments(arch, mc.stage, mc.bucket_bytes, p);
  EXPECT_LE(std::abs(plan.total() - law.total()),
            16 * static_cast<std::int64_t>(segments.size()) * mc.ranks);
}

}  // namespace

TEST(PlanRuntimeValidation, ShardedStagesOnTwoThreeAndFourRanks) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (int ranks : {2, 3, 4}) check_mesh<float>(MeshCase{stage, ranks, 1, 512, false});
  }
}

TEST(PlanRuntimeValidation, ShardedBf16WithDefaultBucketsAndMicroBatches) {
  for (int stage = 0; stage <= 3; ++stage) {
    check_mesh<fw::bf16>(MeshCase{stage, 3, 2, 25LL << 20, false});
  }
}

TEST(PlanRuntimeValidation, ShardedWithCheckpointing) {
  check_mesh<float>(MeshCase{3, 4, 1, 512, true});
  check_mesh<fw::bf16>(MeshCase{2, 2, 2, 700, true});
}

// The whole-run peak per rank (construction by deferred init, every step) against the planner,
// ZeRO 0-3 on 1, 2, 4 and 8 ranks: model states exactly, the total within 10%.
TEST(PlanRuntimeValidation, WholeRunPeakPerRankOnOneToEightRanks) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (int ranks : {1, 2, 4, 8}) {
      check_mesh<fw::bf16>(MeshCase{stage, ranks, 1, 25LL << 20, false, true});
    }
  }
}
