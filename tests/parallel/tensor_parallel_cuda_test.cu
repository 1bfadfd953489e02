// models::Gpt split over a tp group on CUDA: tp = 2 (with and without sequence parallelism) on a
// 2-rank LocalWorld whose ranks share one GPU (one stream each), vocabulary 301 padded with the
// CUDA default alignment (128: Vp = 512, rank 1 holds 45 real rows), against the one-rank host run.
// Skips without a GPU; scripts/device-check.sh runs it on a GPU machine.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/backend/ops.cuh"
#include "tp_harness.hpp"

namespace {

using fw::Cuda;

std::vector<float> device_losses(bool sp, int steps) {
  using Model = fw::models::Gpt<float, Cuda, fw::LocalComm>;
  using S = fw::TensorParallelStrategy<0, float, Cuda, fw::LocalComm>;
  std::vector<float> losses;
  std::mutex mu;
  fw::launch<fw::LocalWorld>(2, [&](fw::World<fw::LocalWorld>& w) {
    fw::Context<Cuda> dctx(w.memory(), 0);
    fw::LocalComm tp = w.comm().split(0, w.rank(), "tp");
    fw::LocalComm dp = w.comm().split(w.rank(), 0, "dp");
    tp.set_stream(dctx.stream());
    dp.set_stream(dctx.stream());
    fw::tp::TpOptions to;
    to.sequence_parallel = sp;  // vocab_alignment 0: 128 on CUDA
    Model model(dctx, tph::config(), tp, tph::kSeed, to);
    EXPECT_EQ(model.padded_vocab(), 512);
    fw::Trainer<S> t(fw::TrainerOptions{}, dctx, model, dp, tph::adamw(), fw::ShardedOptions{});
    std::vector<float> mine;
    for (int s = 0; s < steps; ++s) mine.push_back(t.step(tph::batch(s).view()));
    dctx.synchronize();
    std::lock_guard lock(mu);
    if (w.rank() == 0) losses = mine;
  });
  return losses;
}

void check_against_host(bool sp) {
  if (fw::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr int kSteps = 10;
  const auto host = tph::run_single<float>(kSteps).losses;
  const auto dev = device_losses(sp, kSteps);
  ASSERT_EQ(dev.size(), host.size());
  for (int s = 0; s < kSteps; ++s) {
    // fp32 on both; cuBLAS and the host GEMM sum in different orders: 1e-4 relative over 10
    // AdamW steps (as parallel_sharded_cuda_test)
    EXPECT_NEAR(dev[s], host[s], 1e-4 * std::abs(host[s])) << "step " << s;
  }
}

TEST(TensorParallelCuda, Tp2OneGpuMatchesHost) { check_against_host(false); }
TEST(TensorParallelCuda, Tp2SequenceParallelOneGpuMatchesHost) { check_against_host(true); }

}  // namespace
