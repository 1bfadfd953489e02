// Bandwidth-bound host kernels against single-core memcpy bandwidth. Each benchmark reports
// bytes/s for the bytes the kernel must move (every input read once, every output written
// once); memcpy moves 2 x 4 bytes per float. Arrays are 2^23 elements (32 MiB per fp32
// array), past the 32 MiB L3 of the machine this was tuned on, so this is DRAM bandwidth.
// Each kernel's output is checked once against a double-precision value before timing.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "fourway/backend/host/adamw.hpp"
#include "fourway/backend/host/elementwise.hpp"
#include "fourway/backend/host/layernorm.hpp"

namespace fw = fourway;

namespace {

constexpr std::int64_t n_elems = std::int64_t{1} << 23;

template <class T>
std::vector<T> random_vec(std::int64_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = fw::convert<T>(d(gen));
  return v;
}

void set_bytes(benchmark::State& state, double bytes_per_iter) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iter) * state.iterations());
}

void memcpy_baseline(benchmark::State& state) {
  const auto src = random_vec<float>(n_elems, 1);
  std::vector<float> dst(src.size());
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  if (dst[12345] != src[12345]) state.SkipWithError("memcpy mismatch");
  set_bytes(state, 8.0 * static_cast<double>(n_elems));
}

template <class T>
void residual(benchmark::State& state) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const auto a = random_vec<T>(n_elems, 1), b = random_vec<T>(n_elems, 2);
  std::vector<T> out(a.size());
  fw::host::residual_forward(ctx, out.data(), a.data(), b.data(), n_elems);
  const double want = static_cast<double>(fw::convert<float>(a[777])) + fw::convert<float>(b[777]);
  if (std::abs(fw::convert<float>(out[777]) - want) > 1e-2 * std::abs(want) + 1e-6) {
    state.SkipWithError("residual result is wrong");
  }
  for (auto _ : state) {
    fw::host::residual_forward(ctx, out.data(), a.data(), b.data(), n_elems);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 3.0 * sizeof(T) * static_cast<double>(n_elems));
}

template <class T>
void gelu(benchmark::State& state) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const auto in = random_vec<T>(n_elems, 3);
  std::vector<T> out(in.size());
  fw::host::gelu_forward(ctx, out.data(), in.data(), n_elems);
  const double x = fw::convert<float>(in[4321]);
  const double want = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  if (std::abs(fw::convert<float>(out[4321]) - want) > 1e-2 * std::abs(want) + 1e-5) {
    state.SkipWithError("gelu result is wrong");
  }
  for (auto _ : state) {
    fw::host::gelu_forward(ctx, out.data(), in.data(), n_elems);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * sizeof(T) * static_cast<double>(n_elems));
}

template <class T>
void gelu_backward(benchmark::State& state) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const auto in = random_vec<T>(n_elems, 3), dout = random_vec<T>(n_elems, 4);
  std::vector<T> din(in.size());
  for (auto _ : state) {
    fw::host::gelu_backward(ctx, din.data(), in.data(), dout.data(), n_elems);
    benchmark::DoNotOptimize(din.data());
    benchmark::ClobberMemory();
  }
  if (!std::isfinite(fw::convert<float>(din[99])))
    state.SkipWithError("gelu_backward is not finite");
  set_bytes(state, 3.0 * sizeof(T) * static_cast<double>(n_elems));
}

template <class T>
void layernorm(benchmark::State& state) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t C = 768, rows = n_elems / C;
  const auto in = random_vec<T>(rows * C, 5), w = random_vec<T>(C, 6), b = random_vec<T>(C, 7);
  std::vector<T> out(in.size());
  std::vector<float> mean(static_cast<std::size_t>(rows)), rstd(static_cast<std::size_t>(rows));
  fw::host::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), in.data(), w.data(),
                              b.data(), rows, C, 1e-5f);
  double m = 0.0;
  for (std::int64_t c = 0; c < C; ++c) m += fw::convert<float>(in[c]);
  if (std::abs(m / C - mean[0]) > 1e-4) state.SkipWithError("layernorm mean is wrong");
  for (auto _ : state) {
    fw::host::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), in.data(), w.data(),
                                b.data(), rows, C, 1e-5f);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, 2.0 * sizeof(T) * static_cast<double>(rows * C));
}

template <class T>
void layernorm_backward(benchmark::State& state) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t C = 768, rows = n_elems / C;
  const auto in = random_vec<T>(rows * C, 5), dout = random_vec<T>(rows * C, 11);
  const auto w = random_vec<T>(C, 6), b = random_vec<T>(C, 7);
  std::vector<T> out(in.size()), din(in.size()), dw(static_cast<std::size_t>(C)),
      db(static_cast<std::size_t>(C));
  std::vector<float> mean(static_cast<std::size_t>(rows)), rstd(static_cast<std::size_t>(rows));
  fw::host::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), in.data(), w.data(),
                              b.data(), rows, C, 1e-5f);
  fw::host::layernorm_backward(ctx, din.data(), dw.data(), db.data(), dout.data(), in.data(),
                               w.data(), mean.data(), rstd.data(), rows, C);
  // dbias[3] is the column sum of dout
  double want = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) want += fw::convert<float>(dout[r * C + 3]);
  if (std::abs(fw::convert<float>(db[3]) - want) > 1e-2 * std::abs(want) + 1e-2) {
    state.SkipWithError("layernorm_backward dbias is wrong");
  }
  for (auto _ : state) {
    fw::host::layernorm_backward(ctx, din.data(), dw.data(), db.data(), dout.data(), in.data(),
                                 w.data(), mean.data(), rstd.data(), rows, C);
    benchmark::DoNotOptimize(din.data());
    benchmark::ClobberMemory();
  }
  // read dout, in; write din (mean, rstd, weight and the parameter gradients are per row / column)
  set_bytes(state, 3.0 * sizeof(T) * static_cast<double>(rows * C));
}

template <class T>
void adamw(benchmark::State& state) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  auto master = random_vec<float>(n_elems, 8);
  std::vector<float> m(master.size(), 0.0f), v(master.size(), 0.0f);
  const auto grad = random_vec<T>(n_elems, 9);
  std::vector<T> working(master.size());
  fw::AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
  const double p0 = master[5];
  fw::host::adamw_update(ctx, master.data(), m.data(), v.data(), working.data(), grad.data(),
                         n_elems, s);
  // first step: p (1 - lr wd) - lr sign(g) (up to eps)
  const double g = fw::convert<float>(grad[5]);
  if (std::abs(master[5] - (p0 * (1 - 1e-4) - 1e-3 * (g > 0 ? 1 : -1))) > 1e-6) {
    state.SkipWithError("adamw result is wrong");
  }
  for (auto _ : state) {
    ++s.step;
    fw::host::adamw_update(ctx, master.data(), m.data(), v.data(), working.data(), grad.data(),
                           n_elems, s);
    benchmark::DoNotOptimize(master.data());
    benchmark::ClobberMemory();
  }
  // read p, m, v, grad; write p, m, v, working
  set_bytes(state, (24.0 + 2.0 * sizeof(T)) * static_cast<double>(n_elems));
}

template <class To, class From>
void cast(benchmark::State& state) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const auto src = random_vec<From>(n_elems, 10);
  std::vector<To> dst(src.size());
  fw::host::cast(ctx, dst.data(), src.data(), n_elems);
  const float a = fw::convert<float>(src[31]), b = fw::convert<float>(dst[31]);
  if (std::abs(a - b) > 1e-2f * std::abs(a)) state.SkipWithError("cast result is wrong");
  for (auto _ : state) {
    fw::host::cast(ctx, dst.data(), src.data(), n_elems);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state, (sizeof(To) + sizeof(From)) * static_cast<double>(n_elems));
}

}  // namespace

BENCHMARK(memcpy_baseline)->Unit(benchmark::kMillisecond);
BENCHMARK(residual<float>)->Unit(benchmark::kMillisecond);
BENCHMARK(residual<fw::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(gelu<float>)->Unit(benchmark::kMillisecond);
BENCHMARK(gelu<fw::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(gelu<fw::fp16>)->Unit(benchmark::kMillisecond);
BENCHMARK(gelu_backward<float>)->Unit(benchmark::kMillisecond);
BENCHMARK(gelu_backward<fw::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(layernorm<float>)->Unit(benchmark::kMillisecond);
BENCHMARK(layernorm<fw::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(layernorm_backward<float>)->Unit(benchmark::kMillisecond);
BENCHMARK(layernorm_backward<fw::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(adamw<float>)->Unit(benchmark::kMillisecond);
BENCHMARK(adamw<fw::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(cast<fw::bf16, float>)->Unit(benchmark::kMillisecond);
BENCHMARK(cast<float, fw::bf16>)->Unit(benchmark::kMillisecond);
BENCHMARK(cast<fw::fp16, float>)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
