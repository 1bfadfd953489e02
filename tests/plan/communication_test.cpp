#include "fourway/plan/communication.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace fp = fourway::plan;

namespace {
// An explicit ring: N ranks, a buffer of N chunks; reduce-scatter then all-gather, each step
// every rank sends one chunk to its right neighbour. Returns the bytes rank 0 sent.
double simulate_ring(fp::Collective c, double bytes, int n) {
  const double chunk = bytes / n;
  double sent = 0;
  const int phases = c == fp::Collective::all_reduce ? 2 : 1;
  for (int phase = 0; phase < phases; ++phase) {
    for (int step = 0; step < n - 1; ++step) sent += chunk;
  }
  return sent;
}
}  // namespace

TEST(PlanCommunication, RingBytesMatchAnExplicitRing) {
  for (int n : {1, 2, 3, 8, 64}) {
    for (auto c :
         {fp::Collective::all_reduce, fp::Collective::reduce_scatter, fp::Collective::all_gather}) {
      EXPECT_DOUBLE_EQ(fp::ring_bytes_sent(c, 1e9, n), simulate_ring(c, 1e9, n)) << n;
    }
  }
}

TEST(PlanCommunication, AlphaBetaTime) {
  const fp::Link l{100.0, 2.0};  // 100 GB/s, 2 µs
  // 8 ranks, 1 GB all-reduce: 14 steps · 2 µs + 2·7/8 GB / 100 GB/s.
  EXPECT_DOUBLE_EQ(fp::ring_seconds(fp::Collective::all_reduce, 1e9, 8, l),
                   14 * 2e-6 + 1.75e9 / 100e9);
  EXPECT_DOUBLE_EQ(fp::ring_seconds(fp::Collective::all_gather, 1e9, 8, l),
                   7 * 2e-6 + 0.875e9 / 100e9);
  EXPECT_EQ(fp::ring_seconds(fp::Collective::all_reduce, 1e9, 1, l), 0.0);
  EXPECT_DOUBLE_EQ(fp::p2p_seconds(1e6, l), 2e-6 + 1e6 / 100e9);
}

// docs/design.md, the communication law / ZeRO §7: DP moves 2Ψ(N−1)/N, ZeRO-1/2 the same,
// ZeRO-3 1.5× that.
TEST(PlanCommunication, ZeroStageVolumes) {
  const fp::Link l{100.0, 0.0};
  const std::int64_t psi = 1'000'000 * 8;  // divisible by 8
  const double dp = fp::data_parallel_traffic(psi, fp::Precision::bf16, 0, 8, 1, l).bytes();
  EXPECT_DOUBLE_EQ(dp, 2.0 * 2 * psi * 7 / 8);
  EXPECT_DOUBLE_EQ(fp::data_parallel_traffic(psi, fp::Precision::bf16, 1, 8, 1, l).bytes(), dp);
  EXPECT_DOUBLE_EQ(fp::data_parallel_traffic(psi, fp::Precision::bf16, 2, 8, 1, l).bytes(), dp);
  EXPECT_DOUBLE_EQ(fp::data_parallel_traffic(psi, fp::Precision::bf16, 3, 8, 1, l).bytes(),
                   1.5 * dp);
  // With 4 micro-batches: DP and ZeRO-1 reduce once; ZeRO-2 reduce-scatters every micro-batch;
  // ZeRO-3 gathers twice and reduce-scatters every micro-batch.
  const double half = dp / 2;
  EXPECT_DOUBLE_EQ(fp::data_parallel_traffic(psi, fp::Precision::bf16, 0, 8, 4, l).bytes(), dp);
  EXPECT_DOUBLE_EQ(fp::data_parallel_traffic(psi, fp::Precision::bf16, 2, 8, 4, l).bytes(),
                   5 * half);
  EXPECT_DOUBLE_EQ(fp::data_parallel_traffic(psi, fp::Precision::bf16, 3, 8, 4, l).bytes(),
                   12 * half);
  // The parameter all-gather after a ZeRO-1/2 step is not hidden.
  const auto z1 = fp::data_parallel_traffic(psi, fp::Precision::bf16, 1, 8, 1, l);
  EXPECT_DOUBLE_EQ(z1.exposed_bytes, half);
  EXPECT_EQ(fp::data_parallel_traffic(psi, fp::Precision::fp32, 3, 1, 4, l).bytes(), 0.0);
}

// Korthikanti et al. 2022 §4.2.2 / Shoeybi et al. 2019: two all-reduces of b·s·h forward and
// two backward per layer; the loss adds three of b·s floats; the embedding (forward) and the LM
// head (its input's gradient, backward) one of b·s·h each.
TEST(PlanCommunication, TensorParallelVolumes) {
  const fp::Link l{100.0, 0.0};
  const fp::ActivationShape x{1024, 2, 768, 6};
  const double act = 1024.0 * 2 * 768 * 2;  // bf16
  const auto mid = fp::tensor_parallel_traffic_per_micro_batch(x, 4, fp::Precision::bf16, false,
                                                               false, false, l);
  EXPECT_DOUBLE_EQ(mid.bytes, 6 * 4 * 2 * act * 3 / 4);
  const auto full =
      fp::tensor_parallel_traffic_per_micro_batch(x, 4, fp::Precision::bf16, true, false, false, l);
  EXPECT_DOUBLE_EQ(full.bytes, 1.5 * mid.bytes);
  const auto ends =
      fp::tensor_parallel_traffic_per_micro_batch(x, 4, fp::Precision::bf16, false, true, true, l);
  EXPECT_DOUBLE_EQ(ends.bytes, mid.bytes + 2 * 2 * act * 3 / 4 + 3 * 2 * (1024.0 * 2 * 4) * 3 / 4);
  EXPECT_EQ(
      fp::tensor_parallel_traffic_per_micro_batch(x, 1, fp::Precision::bf16, false, true, true, l)
          .bytes,
      0.0);
}

TEST(PlanCommunication, PipelineSendsOneActivationEachWayPerBoundary) {
  const fp::Link l{50.0, 0.0};
  const fp::ActivationShape x{4096, 1, 8192, 10};
  const double act = 4096.0 * 8192 * 2;
  EXPECT_DOUBLE_EQ(
      fp::pipeline_traffic_per_micro_batch(x, 1, false, fp::Precision::bf16, 4, 0, l).bytes, act);
  EXPECT_DOUBLE_EQ(
      fp::pipeline_traffic_per_micro_batch(x, 1, false, fp::Precision::bf16, 4, 1, l).bytes,
      2 * act);
  EXPECT_DOUBLE_EQ(
      fp::pipeline_traffic_per_micro_batch(x, 1, false, fp::Precision::bf16, 4, 3, l).bytes, act);
  EXPECT_DOUBLE_EQ(
      fp::pipeline_traffic_per_micro_batch(x, 8, true, fp::Precision::bf16, 4, 1, l).bytes,
      2 * act / 8);
  EXPECT_EQ(fp::pipeline_traffic_per_micro_batch(x, 1, false, fp::Precision::bf16, 1, 0, l).bytes,
            0.0);
}

// Megatron's order: tp innermost, then pp, dp outermost; a group inside one node uses NVLink.
TEST(PlanCommunication, AxisLinksFollowTheRankLayout) {
  const auto a = fp::axis_links(8, 1, 4, 8);
  EXPECT_TRUE(a.tp_in_node);
  EXPECT_TRUE(a.pp_in_node);
  EXPECT_FALSE(a.dp_in_node);
  const auto b = fp::axis_links(2, 2, 2, 8);
  EXPECT_TRUE(b.tp_in_node && b.pp_in_node && b.dp_in_node);
  const auto c = fp::axis_links(16, 1, 1, 8);
  EXPECT_FALSE(c.tp_in_node);
  const auto d = fp::axis_links(3, 1, 1, 8);  // 3 does not tile an 8-GPU node
  EXPECT_FALSE(d.tp_in_node);
}

// tp 2 × cp 4 fills an 8-GPU node; pp outside them leaves it.
TEST(PlanCommunication, ContextParallelSitsBetweenTensorAndPipeline) {
  const auto a = fp::axis_links(2, 2, 1, 8, 4);
  EXPECT_TRUE(a.tp_in_node);
  EXPECT_TRUE(a.cp_in_node);
  EXPECT_FALSE(a.pp_in_node);
  EXPECT_FALSE(a.dp_in_node);
  const auto b = fp::axis_links(8, 1, 1, 8, 2);
  EXPECT_TRUE(b.tp_in_node);
  EXPECT_FALSE(b.cp_in_node);
}

namespace {
// An explicit ring attention: c ranks each start with their own K/V block; at every step each
// rank sends the block it holds to its right neighbour and receives its left one, c − 1 steps
// per pass, until every rank has seen every block. Returns the bytes rank 0 sent in one pass.
double simulate_kv_ring(int c, double block_bytes) {
  std::vector<int> holds(static_cast<std::size_t>(c));
  for (int r = 0; r < c; ++r) holds[static_cast<std::size_t>(r)] = r;
  std::vector<std::vector<bool>> seen(static_cast<std::size_t>(c),
                                      std::vector<bool>(static_cast<std::size_t>(c), false));
  for (int r = 0; r < c; ++r) seen[static_cast<std::size_t>(r)][static_cast<std::size_t>(r)] = true;
  double sent = 0;
  for (int step = 0; step < c - 1; ++step) {
    std::vector<int> next(holds.size());
    for (int r = 0; r < c; ++r) {
      next[static_cast<std::size_t>((r + 1) % c)] = holds[static_cast<std::size_t>(r)];
      if (r == 0) sent += block_bytes;
    }
    holds = next;
    for (int r = 0; r < c; ++r) {
      seen[static_cast<std::size_t>(r)]
          [static_cast<std::size_t>(holds[static_cast<std::size_t>(r)])] = true;
    }
  }
  for (const auto& row : seen) {
    for (bool b : row) EXPECT_TRUE(b);  // every query block met every key block
  }
  return sent;
}

// An explicit all-to-all: rank 0 holds `bytes` split into c equal parts and sends all but its own.
double simulate_all_to_all(int c, double bytes) {
  double sent = 0;
  for (int dst = 1; dst < c; ++dst) sent += bytes / c;
  return sent;
}
}  // namespace

// Ring: per layer one pass of K and V forward, K, V, dK, dV backward, one more forward pass
// when the attention is recomputed. Ulysses: Q, K, V and the output per forward, their gradients
// backward, each an all-to-all.
TEST(PlanCommunication, ContextParallelBytesMatchAnExplicitRingAndAllToAll) {
  const fp::Link l{100.0, 1.0};
  const double s = 32768, b = 2, q = 4096, kv = 1024;  // widths per tp rank
  const fp::ContextShape x{s, b, q, kv, 3};
  for (int c : {2, 4, 8}) {
    const double local = b * s / c * 2;  // bf16 bytes per unit of width
    const double kv_block = 2 * kv * local;
    for (bool recompute : {false, true}) {
      const double passes = recompute ? 4 : 3;
      const fp::Traffic ring = fp::context_parallel_traffic_per_micro_batch(
          x, c, fp::ContextKind::ring, fp::Precision::bf16, recompute, l);
      EXPECT_DOUBLE_EQ(ring.bytes, 3 * passes * simulate_kv_ring(c, kv_block)) << c;
      EXPECT_DOUBLE_EQ(ring.seconds, 3 * passes * (c - 1) * fp::p2p_seconds(kv_block, l)) << c;
      const fp::Traffic ulysses = fp::context_parallel_traffic_per_micro_batch(
          x, c, fp::ContextKind::ulysses, fp::Precision::bf16, recompute, l);
      const double per_pass = simulate_all_to_all(c, q * local) * 2 +  // Q and the output
                              simulate_all_to_all(c, kv * local) * 2;  // K and V
      EXPECT_DOUBLE_EQ(ulysses.bytes, 3 * (passes - 1) * per_pass) << c;
    }
  }
  EXPECT_EQ(fp::context_parallel_traffic_per_micro_batch(x, 1, fp::ContextKind::ring,
                                                         fp::Precision::bf16, false, l)
                .bytes,
            0.0);
}

// Narayanan et al. 2021 §4.1: without sequence parallelism each tp rank sends 1/t of the
// (replicated) activation across the pipeline link, and the next stage all-gathers it inside
// the node.
TEST(PlanCommunication, ScatterGatherSendsATensorParallelShareAndGathersIt) {
  const fp::Link ib{25.0, 5.0}, nvl{300.0, 1.0};
  const fp::ActivationShape x{2048, 1, 12288, 10};
  const double act = 2048.0 * 12288 * 2;
  const fp::Traffic t =
      fp::pipeline_traffic_per_micro_batch(x, 8, false, fp::Precision::bf16, 4, 1, ib, true, nvl);
  EXPECT_DOUBLE_EQ(t.bytes, 2 * (act / 8 + act * 7 / 8));
  EXPECT_DOUBLE_EQ(t.seconds, 2 * (fp::p2p_seconds(act / 8, ib) +
                                   fp::ring_seconds(fp::Collective::all_gather, act, 8, nvl)));
  // under sequence parallelism the share is already the rank's: nothing to gather
  EXPECT_DOUBLE_EQ(
      fp::pipeline_traffic_per_micro_batch(x, 8, true, fp::Precision::bf16, 4, 1, ib, true, nvl)
          .bytes,
      2 * act / 8);
}
