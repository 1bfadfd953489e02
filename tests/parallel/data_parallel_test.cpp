// DataParallel: the policy-to-strategy mapping, and bucketing that changes when gradients are
// all-reduced but never what: every bucket size gives bitwise the same training run.
#include <gtest/gtest.h>

#include <span>
#include <type_traits>

#include "fourway/train/sharded_strategy.hpp"
#include "parallel_harness.hpp"

namespace {

using Model = fw::models::Gpt<float, fw::Host>;
using P = fw::Precision<float>;
using Comm = fw::LocalComm;

static_assert(
    std::is_same_v<fw::data_parallel_strategy_t<fw::DataParallel, Model, P, fw::Host, Comm>,
                   fw::ShardedStrategy<0, Model, P, fw::Host, Comm>>);
static_assert(std::is_same_v<fw::data_parallel_strategy_t<fw::Sharded<3>, Model, P, fw::Host, Comm>,
                             fw::ShardedStrategy<3, Model, P, fw::Host, Comm>>);
static_assert(std::is_same_v<fw::DataParallelStrategy<Model, P, fw::Host, Comm>,
                             fw::ShardedStrategy<0, Model, P, fw::Host, Comm>>);
static_assert(std::is_same_v<fw::data_parallel_policy_t<0>, fw::DataParallel> &&
              std::is_same_v<fw::data_parallel_policy_t<2>, fw::Sharded<2>>);
static_assert(
    std::is_same_v<fw::ShardedStrategy<1, Model, P, fw::Host, Comm>::policy, fw::Sharded<1>>);
static_assert(fw::training_strategy<fw::DataParallelStrategy<Model, P, fw::Host, Comm>>);
static_assert(fw::training_strategy<fw::ShardedStrategy<3, Model, P, fw::Host, Comm>>);

TEST(ParallelDataParallel, BucketSizeNeverChangesTheResult) {
  harness::RunConfig rc;
  rc.stage = 0;
  rc.ranks = 3;
  rc.steps = 5;
  rc.bucket_bytes = 0;  // one bucket
  const harness::RunResult one = harness::run<float>(rc);
  // 4 B: one parameter per bucket; 700 B: parameters split unevenly; 1 MiB: one bucket again
  for (std::int64_t bytes : {4, 700, 1 << 20}) {
    rc.bucket_bytes = bytes;
    const harness::RunResult got = harness::run<float>(rc);
    EXPECT_EQ(got.losses, one.losses) << bytes << " B buckets";
    EXPECT_EQ(got.params, one.params) << bytes << " B buckets";
    EXPECT_EQ(got.ranks[0].step_bytes, one.ranks[0].step_bytes) << bytes << " B buckets";
  }
}

/// Every rank's weights after 4 DataParallel steps on 4 LocalWorld ranks. With `isolated`, each
/// rank is alone in its group and trains only its share of every batch, as ranks that skip their
/// collectives would.
std::vector<std::vector<std::vector<float>>> replicas(bool isolated) {
  using S = fw::DataParallelStrategy<Model, P, fw::Host, Comm>;
  constexpr int n = 4;
  std::vector<std::vector<std::vector<float>>> per_rank(n);
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    Comm dp = w.comm().split(isolated ? w.rank() : 0, w.rank(), "dp");
    Model model(w.ctx(), harness::tiny_gpt(), harness::kSeed);
    fw::Trainer<S> t(fw::TrainerOptions{}, w.ctx(), model, dp, harness::adamw(),
                     fw::ShardedOptions{});
    for (int s = 0; s < 4; ++s) {
      const fw::TokenBatch b = harness::batch(s);
      if (!isolated) {
        t.step(b.view());
        continue;
      }
      const std::int64_t rows = b.B / n;
      const auto at = static_cast<std::size_t>(w.rank() * rows * b.T);
      const auto len = static_cast<std::size_t>(rows * b.T);
      t.step(fw::Batch{std::span<const std::int32_t>(b.inputs).subspan(at, len),
                       std::span<const std::int32_t>(b.targets).subspan(at, len), rows, b.T});
    }
    per_rank[static_cast<std::size_t>(w.rank())] = harness::model_params(model);
  });
  return per_rank;
}

TEST(ParallelDataParallel, ReplicasStayIdenticalAndDivergeWithoutTheirCollectives) {
  // DataParallel keeps full replicas: after training, every rank's weights are the same bits.
  const auto together = replicas(false);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(together[static_cast<std::size_t>(r)], together[0]) << r;
  // The control: the same check fails when the ranks skip their collectives, so the equality
  // above is the all-reduce's doing and not something every run would show.
  const auto alone = replicas(true);
  for (int r = 1; r < 4; ++r) EXPECT_NE(alone[static_cast<std::size_t>(r)], alone[0]) << r;
  EXPECT_NE(alone[0], together[0]);
}

}  // namespace
