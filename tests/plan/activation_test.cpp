#include "fourway/plan/activation.hpp"

#include <gtest/gtest.h>

namespace fp = fourway::plan;

namespace {
// GPT-3 175B (Brown et al. 2020, Table 2.1): s = 2048, h = 12288, a = 96.
constexpr fp::LayerShape gpt3{2048, 1, 12288, 96, 1};
}  // namespace

// Korthikanti et al. 2022, eq. (1): sbh(34 + 5as/h), computed here term by term from §4.1's
// list (attention block 11sbh + 5as²b, MLP 19sbh, two LayerNorms 4sbh), 16-bit values and
// 1-byte dropout masks.
TEST(PlanActivation, NoParallelismIsThirtyFourPlusFiveAsOverH) {
  const double s = 2048, b = 1, h = 12288, a = 96;
  const double attention = 2 * s * b * h        // QKV input
                           + 4 * s * b * h      // Q and K
                           + 2 * a * s * s * b  // softmax output
                           + a * s * s * b      // softmax dropout mask
                           + 2 * s * b * h      // V
                           + 2 * s * b * h      // projection input
                           + s * b * h;         // dropout mask
  const double mlp = 2 * s * b * h + 8 * s * b * h + 8 * s * b * h + s * b * h;
  const double norms = 4 * s * b * h;
  const double dropout_out = 2 * a * s * s * b;  // softmax dropout output, input of the V product
  EXPECT_DOUBLE_EQ(fp::korthikanti_layer_bytes(gpt3, false, fp::Checkpointing::none),
                   attention + dropout_out + mlp + norms);
}

// Table 2 of the paper, one row at a time, for t = 8.
TEST(PlanActivation, TableTwoRowsWithTensorAndSequenceParallelism) {
  fp::LayerShape x = gpt3;
  x.t = 8;
  const double sbh = x.s * x.b * x.h;
  const double att = 5 * x.a * x.s / (x.h * x.t);
  EXPECT_DOUBLE_EQ(fp::korthikanti_layer_bytes(x, false, fp::Checkpointing::none),
                   sbh * (10 + 24 / 8.0 + att));
  EXPECT_DOUBLE_EQ(fp::korthikanti_layer_bytes(x, true, fp::Checkpointing::none),
                   sbh * (34 / 8.0 + att));
  EXPECT_DOUBLE_EQ(fp::korthikanti_layer_bytes(x, false, fp::Checkpointing::selective),
                   sbh * (10 + 24 / 8.0));
  EXPECT_DOUBLE_EQ(fp::korthikanti_layer_bytes(x, true, fp::Checkpointing::selective),
                   sbh * 34 / 8.0);
  EXPECT_DOUBLE_EQ(fp::korthikanti_layer_bytes(x, true, fp::Checkpointing::full), sbh * 2);
  // t = 1: every form collapses to the unparallelised one.
  for (bool sp : {false, true}) {
    EXPECT_DOUBLE_EQ(fp::korthikanti_layer_bytes(gpt3, sp, fp::Checkpointing::none),
                     sbh * (34 + 5 * 96 * 2048 / 12288.0));
  }
}

// §5: "for GPT-3 ... 5as/h = 80 ... selective activation recomputation ... reduces the memory
// required for activations by 70%" (and 65% for MT-NLG 530B: a = 128, h = 20480).
TEST(PlanActivation, SelectiveRecomputationSavesSeventyPercentOnGpt3) {
  const double none = fp::korthikanti_layer_bytes(gpt3, false, fp::Checkpointing::none);
  const double sel = fp::korthikanti_layer_bytes(gpt3, false, fp::Checkpointing::selective);
  EXPECT_NEAR(1 - sel / none, 0.70, 0.005);
  const fp::LayerShape mtnlg{2048, 1, 20480, 128, 1};
  EXPECT_NEAR(1 - fp::korthikanti_layer_bytes(mtnlg, false, fp::Checkpointing::selective) /
                      fp::korthikanti_layer_bytes(mtnlg, false, fp::Checkpointing::none),
              0.65, 0.005);
}

TEST(PlanActivation, RecomputationWorkingSetIsWhatIsRebuilt) {
  EXPECT_EQ(fp::korthikanti_recompute_working_bytes(gpt3, false, fp::Checkpointing::none), 0.0);
  EXPECT_DOUBLE_EQ(
      fp::korthikanti_recompute_working_bytes(gpt3, false, fp::Checkpointing::selective),
      fp::korthikanti_layer_bytes(gpt3, false, fp::Checkpointing::none) -
          fp::korthikanti_layer_bytes(gpt3, false, fp::Checkpointing::selective));
  EXPECT_DOUBLE_EQ(fp::korthikanti_recompute_working_bytes(gpt3, true, fp::Checkpointing::full),
                   fp::korthikanti_layer_bytes(gpt3, true, fp::Checkpointing::none));
}

TEST(PlanActivation, OutputAndEmbeddingTermsOfSection4_3) {
  fp::LayerShape x{1024, 4, 768, 12, 2};
  EXPECT_DOUBLE_EQ(fp::korthikanti_embedding_bytes(x), 1024 * 4 * 768 / 2.0);
  EXPECT_DOUBLE_EQ(fp::korthikanti_output_bytes(x, 50257),
                   4.0 * 1024 * 4 * 768 / 2 + 4.0 * 1024 * 4 * 50257 / 2);
}

// Narayanan et al. 2021 §2.2: GPipe keeps all m micro-batches; 1F1B at most p − i on stage i.
TEST(PlanActivation, MicroBatchesInFlightPerSchedule) {
  EXPECT_EQ(fp::micro_batches_in_flight(fp::Schedule::gpipe, 4, 16, 0), 16);
  EXPECT_EQ(fp::micro_batches_in_flight(fp::Schedule::gpipe, 4, 16, 3), 16);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(fp::micro_batches_in_flight(fp::Schedule::one_f_one_b, 4, 16, i), 4 - i);
  }
  EXPECT_EQ(fp::micro_batches_in_flight(fp::Schedule::one_f_one_b, 8, 3, 0), 3);
  EXPECT_THROW((void)fp::micro_batches_in_flight(fp::Schedule::one_f_one_b, 4, 16, 4),
               fourway::ConfigError);
  EXPECT_THROW((void)fp::micro_batches_in_flight(fp::Schedule::gpipe, 4, 0, 0),
               fourway::ConfigError);
}

// The other schedules from their tables, against the papers' counts: Megatron-LM's interleaved
// schedule (Narayanan et al. 2021 §2.2) runs 2(p − r − 1) + (v − 1)p warm-up chunk forwards on
// rank r, so 2(p − r − 1) + (v − 1)p + 1 chunk-activations are alive at once (p(1 + (p − 1)/(pv))
// stage-equivalents on rank 0); ZB-H1 and ZB-V keep 1F1B's peak (Qi et al. 2023 §3, §4): p
// micro-batches on the first rank (ZB-H1's later ranks hold theirs until the delayed W, up to p),
// and on ZB-V's first rank 2p half-stage chunks.
TEST(PlanActivation, InFlightOfInterleavedAndZeroBubbleSchedules) {
  for (int p : {2, 4}) {
    for (int v : {2, 3}) {
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(fp::micro_batches_in_flight(fp::Schedule::interleaved, p, 2 * p, r, v),
                  2 * (p - r - 1) + (v - 1) * p + 1)
            << "p=" << p << " v=" << v << " rank " << r;
      }
    }
    EXPECT_EQ(fp::micro_batches_in_flight(fp::Schedule::zb_h1, p, 2 * p, 0), p);
    for (int r = 0; r < p; ++r) {  // W is delayed on later ranks, never past 1F1B's peak
      const std::int64_t n = fp::micro_batches_in_flight(fp::Schedule::zb_h1, p, 2 * p, r);
      EXPECT_GE(n, p - r) << "zb-h1 p=" << p << " rank " << r;
      EXPECT_LE(n, p) << "zb-h1 p=" << p << " rank " << r;
    }
    EXPECT_EQ(fp::micro_batches_in_flight(fp::Schedule::zb_v, p, 2 * p, 0), 2 * p) << "zb-v";
  }
  // what the runtime refuses, the planner refuses with the schedule's own reason
  EXPECT_THROW((void)fp::micro_batches_in_flight(fp::Schedule::interleaved, 4, 6, 0, 2),
               fourway::ConfigError);
}
