// One fp32 GPT-2 training step through the Trainer (what fourway-train runs per step), in
// tokens/s: the fourway side of benchmarks/train/compare_pytorch.sh as a Google Benchmark, so
// the figure cannot rot. Model: 4 layers, width 256, 8 heads, vocab 50257, T 128, B 8.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/train/strategy.hpp"
#include "fourway/train/trainer.hpp"

namespace fw = fourway;

namespace {

void BM_Gpt2TrainStepFp32(benchmark::State& state) {
  fw::models::GptConfig cfg;
  cfg.layers = 4;
  cfg.dim = 256;
  cfg.heads = 8;
  cfg.vocab = 50257;
  cfg.max_seq = 128;
  const std::int64_t B = state.range(0), T = 128;
  fw::MemoryAccountant memory(0);
  fw::Context<fw::Host> ctx(memory);
  using Model = fw::models::Gpt<float, fw::Host>;
  Model model(ctx, cfg, 1);
  fw::AdamWConfig acfg;
  acfg.lr = 3e-4f;
  acfg.beta2 = 0.95f;
  acfg.weight_decay = 0.1f;
  acfg.max_grad_norm = 1.0f;
  fw::Trainer<fw::SingleRank<Model, fw::Precision<float>, fw::Host>> trainer(
      fw::TrainerOptions{}, ctx, model, fw::AdamW(acfg));
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::int32_t> tok(0, cfg.vocab - 1);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(B * T)), targets(inputs.size());
  for (auto& t : inputs) t = tok(rng);
  for (auto& t : targets) t = tok(rng);
  const fw::Batch batch{inputs, targets, B, T};
  // validate once: at GPT-2's init the logits are near 0, so the loss is near ln(V)
  const float first = trainer.step(batch);
  if (!(std::fabs(first - std::log(static_cast<float>(cfg.vocab))) < 0.5f)) {
    state.SkipWithError("initial loss is not near ln(vocab)");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step(batch));
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(B * T) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.counters["peak_MiB"] = static_cast<double>(memory.total_peak()) / (1024.0 * 1024.0);
}
BENCHMARK(BM_Gpt2TrainStepFp32)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
