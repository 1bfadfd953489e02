// One fp32 training step of the split models::Gpt on a LocalWorld tensor-parallel group of tp = 1,
// 2, 4 ranks (Arg 1: sequence parallelism): 4 layers, width 256, 8 heads, vocab 8192, B 4 x T 64.
// Counters: ms per step (the slowest rank: real time), the bytes one rank sent in the tp group as
// counted
// (`tp_bytes`) and as `plan::runtime_tensor_parallel_bytes` predicts (`tp_bytes_plan`), and the
// planner's FLOPs per token per rank.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fourway/comm/counting.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/plan/communication.hpp"
#include "fourway/plan/step_time.hpp"
#include "fourway/train/trainer.hpp"

namespace fw = fourway;

namespace {

void BM_TensorParallelStep(benchmark::State& state) {
  const int tp = static_cast<int>(state.range(0));
  const bool sp = state.range(1) != 0;
  fw::models::GptConfig cfg;
  cfg.layers = 4;
  cfg.dim = 256;
  cfg.heads = 8;
  cfg.vocab = 8192;
  cfg.max_seq = 64;
  const std::int64_t B = 4, T = 64;
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::int32_t> tok(0, cfg.vocab - 1);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(B * T)), targets(inputs.size());
  for (auto& t : inputs) t = tok(rng);
  for (auto& t : targets) t = tok(rng);
  const fw::Batch batch{inputs, targets, B, T};
  fw::AdamWConfig acfg;
  acfg.lr = 3e-4f;
  acfg.max_grad_norm = 1.0f;
  using Comm = fw::Counting<fw::LocalComm>;
  using S = fw::TensorParallelStrategy<0, float, fw::Host, Comm>;
  double bytes = 0;
  // every iteration is one step on all ranks; the ranks stay in one launch for the whole loop
  std::atomic<bool> go{true};
  fw::launch<fw::LocalWorld>(tp, [&](fw::World<fw::LocalWorld>& w) {
    Comm tpc(w.comm().split(0, w.rank(), "tp"));
    Comm dp(w.comm().split(w.rank(), 0, "dp"));
    fw::tp::TpOptions to;
    to.sequence_parallel = sp;
    fw::models::Gpt<float, fw::Host, Comm> model(w.ctx(), cfg, tpc, 1, to);
    fw::Trainer<S> trainer(fw::TrainerOptions{}, w.ctx(), model, dp, fw::AdamW(acfg));
    trainer.step(batch);  // warm-up
    if (w.rank() == 0) {
      for (auto _ : state) {
        tpc.counters().reset();
        tpc.barrier();
        trainer.step(batch);
        bytes = tpc.counters().modelled_bytes_sent("tp");
      }
      go = false;
      tpc.barrier();
    } else {
      for (;;) {
        tpc.barrier();
        if (!go) break;
        trainer.step(batch);
      }
    }
  });
  namespace fp = fw::plan;
  const auto arch = fp::gpt2_shape(cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq);
  state.counters["tp_bytes"] = bytes;
  state.counters["tp_bytes_plan"] = fp::runtime_tensor_parallel_bytes(
      fp::ActivationShape{double(T), double(B), double(cfg.dim), cfg.layers}, tp, sp,
      fp::Precision::fp32, false, 1);
  state.counters["plan_GFLOP_per_rank"] =
      fp::stage_flops_per_token(arch, tp, 1, 0) * double(B * T) / 1e9;
}
BENCHMARK(BM_TensorParallelStep)
    ->ArgsProduct({{1, 2, 4}, {0, 1}})
    ->ArgNames({"tp", "sp"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

}  // namespace

BENCHMARK_MAIN();
