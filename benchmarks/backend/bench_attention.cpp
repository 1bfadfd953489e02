// Host causal attention, forward then backward, on one core: the flash-style kernels
// (backend/host/flash_attention.hpp, what the layers run) against the materialised ones
// (backend/host/attention.hpp), at GPT-2 small's heads (12 x 64), B = 1, T = 256 and 1024, fp32
// and bf16. Counters: `causal_gflops` (7·B·NH·T²·hs FLOPs per iteration: the causal half of the
// forward's 4 and the backward's 10, recomputation included — a causal kernel's least work; the
// materialised side computes the masked half too) and `saved_bytes` (what the forward keeps for the
// backward: the log-sum-exp, or the probabilities). Each benchmark first checks the two kernels'
// outputs against each other on its own inputs.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fourway/backend/host/attention.hpp"
#include "fourway/backend/host/flash_attention.hpp"

namespace fw = fourway;

namespace {

template <class T>
std::vector<T> random_vec(std::int64_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.5f, 1.5f);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = fw::convert<T>(d(gen));
  return v;
}

template <class E>
void attention(benchmark::State& state, bool flash) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t B = 1, T = state.range(0), NH = 12, hs = 64, C = NH * hs;
  const auto qkv = random_vec<E>(B * T * 3 * C, 1);
  const auto dout = random_vec<E>(B * T * C, 2);
  std::vector<E> out(static_cast<std::size_t>(B * T * C)), dqkv(qkv.size());
  std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), delta(lse.size());
  std::vector<E> att(flash ? 0 : static_cast<std::size_t>(B * NH * T * T)), datt(att.size());
  auto run = [&] {
    if (flash) {
      fw::host::flash_attention_forward(ctx, out.data(), lse.data(), qkv.data(), B, T, C, NH);
      fw::host::flash_attention_backward(ctx, dqkv.data(), delta.data(), dout.data(), qkv.data(),
                                         out.data(), lse.data(), B, T, C, NH);
    } else {
      fw::host::attention_forward(ctx, out.data(), att.data(), qkv.data(), B, T, C, NH);
      fw::host::attention_backward(ctx, dqkv.data(), datt.data(), dout.data(), qkv.data(),
                                   att.data(), B, T, C, NH);
    }
  };
  run();
  {  // the other kernel's output on the same inputs
    std::vector<E> other(out.size());
    if (flash) {
      std::vector<E> a(static_cast<std::size_t>(B * NH * T * T));
      fw::host::attention_forward(ctx, other.data(), a.data(), qkv.data(), B, T, C, NH);
    } else {
      std::vector<float> l(lse.size());
      fw::host::flash_attention_forward(ctx, other.data(), l.data(), qkv.data(), B, T, C, NH);
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      const float a = fw::convert<float>(out[i]), e = fw::convert<float>(other[i]);
      if (std::abs(a - e) > 3e-2f * std::abs(e) + 1e-2f) {
        state.SkipWithError("the flash and materialised outputs differ");
        return;
      }
    }
  }
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(dqkv.data());
    benchmark::ClobberMemory();
  }
  const double causal = 7.0 * static_cast<double>(B * NH * T * T * hs);
  state.counters["causal_gflops"] =
      benchmark::Counter(causal * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["saved_bytes"] =
      static_cast<double>(flash ? B * NH * T * 4 : B * NH * T * T * sizeof(E));
}

void flash_fp32(benchmark::State& s) { attention<float>(s, true); }
void materialised_fp32(benchmark::State& s) { attention<float>(s, false); }
void flash_bf16(benchmark::State& s) { attention<fw::bf16>(s, true); }
void materialised_bf16(benchmark::State& s) { attention<fw::bf16>(s, false); }

}  // namespace

BENCHMARK(flash_fp32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(materialised_fp32)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(flash_bf16)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(materialised_bf16)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
