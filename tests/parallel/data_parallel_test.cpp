// DataParallel: the policy-to-strategy mapping, and bucketing that changes when gradients are
// all-reduced but never what: every bucket size gives bitwise the same training run.
#include <gtest/gtest.h>

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
static_assert(fw::training_strategy<fw::DataParallelStrategy<Model, P, fw::Host, Comm>>);
static_assert(fw::training_strategy<fw::ShardedStrategy<3, Model, P, fw::Host, Comm>>);

TEST(ParallelDataParallel, BucketSizeNeverChangesTheResult) {
  h8::RunConfig rc;
  rc.stage = 0;
  rc.ranks = 3;
  rc.steps = 5;
  rc.bucket_bytes = 0;  // one bucket
  const h8::RunResult one = h8::run<float>(rc);
  // 4 B: one parameter per bucket; 700 B: parameters split unevenly; 1 MiB: one bucket again
  for (std::int64_t bytes : {4, 700, 1 << 20}) {
    rc.bucket_bytes = bytes;
    const h8::RunResult got = h8::run<float>(rc);
    EXPECT_EQ(got.losses, one.losses) << bytes << " B buckets";
    EXPECT_EQ(got.params, one.params) << bytes << " B buckets";
    EXPECT_EQ(got.ranks[0].step_bytes, one.ranks[0].step_bytes) << bytes << " B buckets";
  }
}

TEST(ParallelDataParallel, ReplicasStayIdentical) {
  // DataParallel keeps full replicas: after training, every rank's weights are the same bits.
  using S = fw::DataParallelStrategy<Model, P, fw::Host, Comm>;
  std::vector<std::vector<std::vector<float>>> per_rank(4);
  fw::launch<fw::LocalWorld>(4, [&](fw::World<fw::LocalWorld>& w) {
    Comm dp = w.comm().split(0, w.rank(), "dp");
    Model model(w.ctx(), h8::tiny_gpt(), h8::kSeed);
    fw::Trainer<S> t(fw::TrainerOptions{}, w.ctx(), model, dp, h8::adamw(), fw::ShardedOptions{});
    for (int s = 0; s < 4; ++s) t.step(h8::batch(s).view());
    per_rank[static_cast<std::size_t>(w.rank())] = h8::model_params(model);
  });
  for (int r = 1; r < 4; ++r) EXPECT_EQ(per_rank[static_cast<std::size_t>(r)], per_rank[0]);
}

}  // namespace
