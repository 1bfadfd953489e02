// Host GEMM at the shapes of GPT-2 small (B*T = 1024 rows, C = 768): fourway's dispatching
// host::gemm (the BLAS path when built with CBLAS), the built-in blocked GEMM, and a direct
// cblas_sgemm call as the baseline. Counter FLOP/s = 2 m n k per iteration. Each benchmark
// checks its result once against the double-precision product of a few sampled entries
// before it is timed. Single-threaded, as ranks are threads (see backend/host/gemm.hpp).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fourway/backend/host/gemm.hpp"

namespace fw = fourway;

namespace {

struct Problem {
  std::int64_t m, n, k;
  fw::Trans ta, tb;
  std::vector<float> a, b, c;
  std::int64_t lda, ldb;
  Problem(std::int64_t m_, std::int64_t n_, std::int64_t k_, fw::Trans ta_, fw::Trans tb_)
      : m(m_), n(n_), k(k_), ta(ta_), tb(tb_) {
    lda = fw::detail::stored_cols(ta, m, k);
    ldb = fw::detail::stored_cols(tb, k, n);
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    a.resize(static_cast<std::size_t>(m * k));
    b.resize(static_cast<std::size_t>(k * n));
    c.assign(static_cast<std::size_t>(m * n), 0.0f);
    for (auto& x : a) x = d(gen);
    for (auto& x : b) x = d(gen);
  }
  /// Max error of C at 64 sampled entries against a double dot product.
  [[nodiscard]] double check() const {
    std::mt19937 gen(3);
    double worst = 0.0;
    for (int s = 0; s < 64; ++s) {
      const std::int64_t i = static_cast<std::int64_t>(gen() % static_cast<std::uint32_t>(m));
      const std::int64_t j = static_cast<std::int64_t>(gen() % static_cast<std::uint32_t>(n));
      double ref = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av = ta == fw::Trans::none ? a[i * lda + p] : a[p * lda + i];
        const double bv = tb == fw::Trans::none ? b[p * ldb + j] : b[j * ldb + p];
        ref += av * bv;
      }
      worst = std::max(worst, std::abs(ref - c[i * n + j]));
    }
    return worst;
  }
};

enum class Impl { fourway, builtin, cblas };

void run(benchmark::State& state, Impl impl, fw::Trans ta, fw::Trans tb) {
  Problem p(state.range(0), state.range(1), state.range(2), ta, tb);
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  auto once = [&] {
    switch (impl) {
      case Impl::fourway:
        fw::host::gemm(ctx, ta, tb, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda, p.b.data(), p.ldb, 0.0f,
                       p.c.data(), p.n);
        break;
      case Impl::builtin:
        fw::host::detail::gemm_builtin(ta, tb, p.m, p.n, p.k, 1.0f, p.a.data(), p.lda, p.b.data(),
                                       p.ldb, 0.0f, p.c.data(), p.n);
        break;
      case Impl::cblas:
#if FOURWAY_HAS_CBLAS
        fw::host::detail::blas_single_thread_once();
        cblas_sgemm(CblasRowMajor, ta == fw::Trans::none ? CblasNoTrans : CblasTrans,
                    tb == fw::Trans::none ? CblasNoTrans : CblasTrans, static_cast<blasint>(p.m),
                    static_cast<blasint>(p.n), static_cast<blasint>(p.k), 1.0f, p.a.data(),
                    static_cast<blasint>(p.lda), p.b.data(), static_cast<blasint>(p.ldb), 0.0f,
                    p.c.data(), static_cast<blasint>(p.n));
#endif
        break;
    }
  };
#if !FOURWAY_HAS_CBLAS
  if (impl == Impl::cblas) {
    state.SkipWithError("built without CBLAS");
    return;
  }
#endif
  once();
  // fp32 accumulation over k <= 3072 products of size < 1: error well below 1e-3
  if (p.check() > 1e-3) {
    state.SkipWithError("GEMM result does not match the double-precision reference");
    return;
  }
  for (auto _ : state) {
    once();
    benchmark::DoNotOptimize(p.c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(p.m * p.n * p.k),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// (m, n, k) of GPT-2 small's linear layers at B*T = 1024: forward x.W for c_attn (3C), c_proj
// (C), c_fc (4C), mlp c_proj (k = 4C); backward dW = x^T dy (transposed A) and dx = dy W^T.
void gpt2_shapes(benchmark::internal::Benchmark* b) {
  b->Args({1024, 2304, 768})
      ->Args({1024, 768, 768})
      ->Args({1024, 3072, 768})
      ->Args({1024, 768, 3072});
  b->Unit(benchmark::kMillisecond);
}
void backward_shapes(benchmark::internal::Benchmark* b) {
  b->Args({768, 3072, 1024})->Args({1024, 768, 3072});
  b->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_CAPTURE(run, fourway_NN, Impl::fourway, fw::Trans::none, fw::Trans::none)
    ->Apply(gpt2_shapes);
BENCHMARK_CAPTURE(run, cblas_NN, Impl::cblas, fw::Trans::none, fw::Trans::none)->Apply(gpt2_shapes);
BENCHMARK_CAPTURE(run, builtin_NN, Impl::builtin, fw::Trans::none, fw::Trans::none)
    ->Apply(gpt2_shapes);
BENCHMARK_CAPTURE(run, fourway_TN, Impl::fourway, fw::Trans::transpose, fw::Trans::none)
    ->Apply(backward_shapes);
BENCHMARK_CAPTURE(run, cblas_TN, Impl::cblas, fw::Trans::transpose, fw::Trans::none)
    ->Apply(backward_shapes);
BENCHMARK_CAPTURE(run, builtin_TN, Impl::builtin, fw::Trans::transpose, fw::Trans::none)
    ->Apply(backward_shapes);
BENCHMARK_CAPTURE(run, fourway_NT, Impl::fourway, fw::Trans::none, fw::Trans::transpose)
    ->Apply(backward_shapes);
BENCHMARK_CAPTURE(run, cblas_NT, Impl::cblas, fw::Trans::none, fw::Trans::transpose)
    ->Apply(backward_shapes);
BENCHMARK_CAPTURE(run, builtin_NT, Impl::builtin, fw::Trans::none, fw::Trans::transpose)
    ->Apply(backward_shapes);

BENCHMARK_MAIN();
