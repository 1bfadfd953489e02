// The planner against three published large training runs: what each paper reports is the
// reference, the planner is given only what the paper states about its configuration and software
// (and, where the paper is silent, an assumption written beside it and in docs/plan.md).
//
// One kernel efficiency per GPU generation for all of them: the GEMMs run at 62% of the dense
// peak (--mfu 0.62), fitted once, on nothing but Megatron-LM's Table 1; on H100 the attention
// core runs at 45% (--attention-mfu 0.45: FlashAttention-2 reaches about a third to a half of
// an H100's peak, Shah et al. 2024, FlashAttention-3, §4.1). Every other second of a step is
// modelled: the pipeline bubble, exposed tensor-, pipeline-, context- and data-parallel
// communication, and an unfused attention's memory traffic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "fourway/plan/planner.hpp"

namespace fp = fourway::plan;

namespace {

// Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", Table 1 (weak scaling, A100 80GB, vocabulary 51,200, sequence 2,048).
struct MegatronRow {
  double billions;
  std::int64_t heads, hidden, layers;
  int tp, pp, gpus;
  std::int64_t batch;
  double tflops_per_gpu;  // achieved, recomputation counted (the paper's eq. 3)
};

constexpr MegatronRow megatron_table1[] = {
    {1.7, 24, 2304, 24, 1, 1, 32, 512, 137},
    {3.6, 32, 3072, 30, 2, 1, 64, 512, 138},
    {7.5, 32, 4096, 36, 4, 1, 128, 512, 142},
    {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
    {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138},
    {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140},
    {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148},
    {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155},
    {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163},
    {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163},
};

constexpr double a100_gemm_efficiency = 0.62;
constexpr double h100_attention_efficiency = 0.45;

}  // namespace

// The step time the paper's own figures imply: eq. (3), F = 96·B·s·l·h²·(1 + s/(6h) + V/(16lh))
// FLOPs per iteration with recomputation, over the achieved teraFLOP/s times the GPUs. The
// planner is told what the paper states — 16-bit mixed precision (fp16 here; an A100's peak is
// bf16's too), full activation recomputation, the 2021 attention (separate score, softmax and
// dropout kernels), the scatter/gather of pipeline sends (§4.1), gradients all-reduced after the
// backward (no overlap) — and assumes micro-batches of one sequence on the 1F1B schedule. Every row
// within ±10% of the published step time, and every mesh fits the 80 GB A100 the paper used.
TEST(PlanPublishedRuns, MegatronTable1StepTimeWithinTenPercent) {
  for (const MegatronRow& r : megatron_table1) {
    const fp::Architecture a =
        fp::gpt2_shape(r.layers, r.hidden, r.heads, 51200, 2048, "megatron-table-1");
    fp::Strategy s;
    s.tp = r.tp;
    s.pp = r.pp;
    s.dp = r.gpus / (r.tp * r.pp);
    s.micro_batch = 1;
    s.micro_batches = r.batch / s.dp;
    s.precision = fp::Precision::fp16;
    s.checkpointing = fp::Checkpointing::full;
    fp::Options o;
    o.mfu = a100_gemm_efficiency;
    o.overlap = 0.0;
    o.attention = fp::AttentionKernel::unfused;
    o.pp_scatter_gather = true;
    const fp::Plan plan = fp::make_plan(fp::Model{a, 0}, fp::Cluster{fp::a100_80g, r.gpus}, s, o);
    const double B = static_cast<double>(r.batch), sq = 2048, l = static_cast<double>(r.layers),
                 h = static_cast<double>(r.hidden), V = 51200;
    const double flops = 96 * B * sq * l * h * h * (1 + sq / (6 * h) + V / (16 * l * h));
    const double published = flops / (r.tflops_per_gpu * 1e12 * r.gpus);
    ASSERT_TRUE(plan.time.has_value());
    EXPECT_NEAR(plan.time->total_s / published, 1.0, 0.10)
        << r.billions << "B: planned " << plan.time->total_s << " s, published " << published
        << " s";
    EXPECT_TRUE(plan.fits) << r.billions << "B needs " << plan.worst().total() / 1e9 << " GB";
  }
}

namespace {

// Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (Llama 3 405B: 126 layers, model
// dimension 16,384, FFN 53,248, 128 heads, 8 key/value heads, vocabulary 128,256) and Table 4:
// TP 8, PP 16, 16M tokens per batch, BF16 MFU on H100 80GB.
struct Llama3Row {
  int gpus, cp, dp;
  std::int64_t seq, batch_per_dp;
  double mfu;
};

constexpr Llama3Row llama3_table4[] = {
    {8192, 1, 64, 8192, 32, 0.43},
    {16384, 1, 128, 8192, 16, 0.41},
    {16384, 16, 8, 131072, 16, 0.38},
};

fp::Plan llama3_plan(const Llama3Row& r, fp::Checkpointing checkpointing) {
  fp::Architecture a{"llama-3-405b", fp::Family::llama, 126, 16384, 128, 8, 53248, 128256, r.seq};
  fp::Strategy s;
  s.tp = 8;
  s.pp = 16;
  s.cp = r.cp;
  s.dp = r.dp;
  s.micro_batch = 1;
  s.micro_batches = r.batch_per_dp;
  s.schedule = fp::Schedule::interleaved;
  s.virtual_stages = 4;
  s.zero = 1;
  s.sequence_parallel = true;
  s.checkpointing = checkpointing;
  fp::Options o;
  o.mfu = a100_gemm_efficiency;  // the same GEMM efficiency on H100
  o.attention_mfu = h100_attention_efficiency;
  o.attention = fp::AttentionKernel::fused;
  return fp::make_plan(fp::Model{a, 0}, fp::Cluster{fp::h100, r.gpus}, s, o);
}

}  // namespace

// §3.3.2: 8K sequences trained without activation checkpointing, the interleaved schedule
// (chunks per rank not given: 4 assumed), FSDP-style sharding of the optimizer state (ZeRO-1
// here), context parallelism of 16 for the 128K stage (all-gathered K and V in the paper; the
// planner's ring moves the same blocks and hides them behind the attention). MFU within ±15%
// of Table 4's. Memory does not fit as the planner counts it: Korthikanti's per-layer bytes
// (34·s·b·h/t) times the interleaved schedule's activations in flight exceed 80 GB by the
// figures docs/plan.md gives; Llama 3 reports freeing each stage's input and output tensors
// early, which the published model does not count. With full recomputation every row fits.
TEST(PlanPublishedRuns, Llama3Table4MfuWithinFifteenPercent) {
  for (const Llama3Row& r : llama3_table4) {
    const fp::Plan plan = llama3_plan(r, fp::Checkpointing::none);
    ASSERT_EQ(plan.strategy.gpus(), r.gpus);
    ASSERT_TRUE(plan.time.has_value());
    EXPECT_NEAR(plan.time->mfu / r.mfu, 1.0, 0.15)
        << r.gpus << " GPUs, seq " << r.seq << ": planned MFU " << plan.time->mfu;
    // the stated gap (docs/plan.md, "Published runs"): over by less than a third of the GPU
    EXPECT_FALSE(plan.fits);
    EXPECT_LT(plan.worst().total() - plan.usable_bytes(), 25e9) << r.gpus << " GPUs";
    EXPECT_TRUE(llama3_plan(r, fp::Checkpointing::full).fits) << r.gpus << " GPUs";
  }
}

// Jiang et al. 2024, "MegaScale: Scaling Large Language Model Training to More Than 10,000
// GPUs", its strong-scaling evaluation of the 175B model (GPT-3's shape: 96 layers, 12,288 wide, 96
// heads, sequence 2,048) at a batch of 6,144 sequences on 12,288 A100s, 55.2% MFU. What §3 states:
// tensor parallelism's communication overlapped with its GEMMs, the data-parallel reduce-scatter
// overlapped with backward, the interleaved 1F1B schedule, FlashAttention, sequence
// parallelism; assumed: TP 8 × PP 8 (so dp 192, 32 micro-batches of one sequence), 4 chunks per
// rank, a distributed optimizer (ZeRO-1), no recomputation. Within ±15%, and it fits.
TEST(PlanPublishedRuns, MegaScale175bMfuWithinFifteenPercent) {
  const fp::Architecture a = fp::gpt2_shape(96, 12288, 96, 51200, 2048, "megascale-175b");
  fp::Strategy s;
  s.tp = 8;
  s.pp = 8;
  s.dp = 12288 / 64;
  s.micro_batch = 1;
  s.micro_batches = 6144 / s.dp;
  s.schedule = fp::Schedule::interleaved;
  s.virtual_stages = 4;
  s.zero = 1;
  s.sequence_parallel = true;
  fp::Options o;
  o.mfu = a100_gemm_efficiency;
  o.tp_overlap = 1.0;
  o.attention = fp::AttentionKernel::fused;
  const fp::Plan plan = fp::make_plan(fp::Model{a, 0}, fp::Cluster{fp::a100_80g, 12288}, s, o);
  ASSERT_TRUE(plan.time.has_value());
  EXPECT_NEAR(plan.time->mfu / 0.552, 1.0, 0.15) << "planned MFU " << plan.time->mfu;
  EXPECT_TRUE(plan.fits) << plan.worst().total() / 1e9 << " GB";
}
