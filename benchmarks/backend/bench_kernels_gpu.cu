// GPU kernel benchmarks (run by scripts/device-check.sh on a GPU machine; without a GPU the
// executable says so and exits 77, which ctest reports as Skipped). Figures a user compares:
//  - GEMM FLOP/s of fourway::cuda::gemm against a direct cublasGemmEx call with the same
//    arguments, at GPT-2 small shapes with B*T = 8192 rows (fp32 and bf16);
//  - AdamW, LayerNorm, GELU, softmax (forward + backward, the materialised attention's shape)
//    and cross-entropy (forward + backward over the padded 50304-wide vocabulary) bytes/s as a
//    percentage of the measured device-to-device copy bandwidth (`pct_of_copy`; a copy moves 2
//    bytes per byte copied): the roofline of a memory-bound kernel;
//  - gelu(x·W + b) at the MLP's shape as one cuBLASLt epilogue GEMM against the GEMM, bias and
//    GELU passes it replaces (TFLOP/s side by side), and the bias gradient's column sum in
//    bytes/s against the copy;
//  - causal attention forward + backward in bf16 at GPT-2 small's heads (12 x 64), B = 8,
//    T = 1024: the blockwise path the layers run (query blocks on cuBLAS, O(T) stash), the tiled
//    flash kernels (CUDA cores) and the materialised ones (cuBLAS GEMMs + softmax, T² stash),
//    in FLOP/s of the causal half (`causal_tflops`: 4·B·NH·T²·hs forward + 10·B·NH·T²·hs backward
//    over 2, the work a causal kernel must do at least; the materialised side does twice that).
// Times come from CUDA events around each iteration (manual time). Every benchmark checks its
// result once before timing (against the host kernel on a sample, or the direct call).
#include <benchmark/benchmark.h>
#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <utility>
#include <vector>

#include "fourway/backend/cuda/kernels.cuh"
#include "fourway/backend/host/kernels.hpp"
#include "support/cuda_timing.cuh"

namespace fw = fourway;

namespace {

double g_copy_bytes_per_s = 0.0;

struct Gpu {
  fw::MemoryAccountant acct;
  fw::Context<fw::Cuda> ctx{acct, 0};
  fw::Context<fw::Host> host{acct};
};

/// Deterministic pseudo-random values in [lo, hi) written on the device.
template <class T>
void fill_random(const fw::Context<fw::Cuda>& ctx, T* p, std::int64_t n, std::uint32_t seed,
                 float lo, float hi) {
  fw::cuda::detail::for_each(
      ctx, n,
      [=] __device__(std::int64_t i) {
        std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed * 40503u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const float u = static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
        fw::cuda::detail::store(p + i, lo + (hi - lo) * u);
      },
      "fill_random");
}

template <class T>
std::vector<T> download(const fw::Context<fw::Cuda>& ctx, const T* p, std::int64_t n) {
  std::vector<T> h(static_cast<std::size_t>(n));
  fw::cuda::to_host(ctx, h.data(), p, n);
  return h;
}

/// Times `body` per iteration with CUDA events on the context's stream.
template <class Body>
void timed_loop(benchmark::State& state, const fw::Context<fw::Cuda>& ctx, Body&& body) {
  cuda_timed_loop(state, ctx.stream(), body, [] {});
}

void report_bandwidth(benchmark::State& state, double bytes_per_iter) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iter) * state.iterations());
  state.counters["pct_of_copy"] = benchmark::Counter(100.0 * bytes_per_iter / g_copy_bytes_per_s,
                                                     benchmark::Counter::kIsIterationInvariantRate);
}

void device_copy(benchmark::State& state) {
  Gpu g;
  const std::int64_t n = std::int64_t{1} << 28;  // 1 GiB of floats
  fw::Tensor<float, fw::Cuda> a({n}, fw::MemTag::workspace, g.acct),
      b({n}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, a.data(), n, 1, -1.0f, 1.0f);
  timed_loop(state, g.ctx, [&] { fw::cuda::copy(g.ctx, b.data(), a.data(), n); });
  state.SetBytesProcessed(2 * n * 4 * state.iterations());
}

template <class T>
void gemm(benchmark::State& state, bool direct) {
  Gpu g;
  const std::int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  fw::Tensor<T, fw::Cuda> a({m, k}, fw::MemTag::workspace, g.acct),
      b({k, n}, fw::MemTag::workspace, g.acct), c({m, n}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, a.data(), m * k, 2, -1.0f, 1.0f);
  fill_random(g.ctx, b.data(), k * n, 3, -1.0f, 1.0f);
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t type = fw::cuda::detail::cuda_type<T>();
  auto run = [&] {
    if (direct) {
      cublasGemmEx(g.ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n),
                   static_cast<int>(m), static_cast<int>(k), &alpha, b.data(), type,
                   static_cast<int>(n), a.data(), type, static_cast<int>(k), &beta, c.data(), type,
                   static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
      fw::cuda::gemm(g.ctx, fw::Trans::none, fw::Trans::none, m, n, k, 1.0f, a.data(), k, b.data(),
                     n, 0.0f, c.data(), n);
    }
  };
  run();
  {  // check 16 entries against a double dot product
    const auto ha = download(g.ctx, a.data(), m * k), hb = download(g.ctx, b.data(), k * n),
               hc = download(g.ctx, c.data(), m * n);
    for (int s = 0; s < 16; ++s) {
      const std::int64_t i = (s * 7919) % m, j = (s * 104729) % n;
      double ref = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        ref += static_cast<double>(fw::convert<float>(ha[i * k + p])) *
               fw::convert<float>(hb[p * n + j]);
      }
      // fp32 accumulation, then (bf16) one rounding of the output
      const double tol = 1e-3 * std::sqrt(static_cast<double>(k)) + 1e-2 * std::abs(ref);
      if (std::abs(fw::convert<float>(hc[i * n + j]) - ref) > tol) {
        state.SkipWithError("GEMM result does not match the double-precision reference");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, run);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void adamw(benchmark::State& state) {
  Gpu g;
  const std::int64_t n = std::int64_t{1} << 26;
  fw::Tensor<float, fw::Cuda> p({n}, fw::MemTag::workspace, g.acct),
      m({n}, fw::MemTag::workspace, g.acct), v({n}, fw::MemTag::workspace, g.acct);
  fw::Tensor<fw::bf16, fw::Cuda> grad({n}, fw::MemTag::workspace, g.acct),
      working({n}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, p.data(), n, 4, -1.0f, 1.0f);
  fill_random(g.ctx, m.data(), n, 5, -0.1f, 0.1f);
  fill_random(g.ctx, v.data(), n, 6, 0.0f, 0.01f);
  fill_random(g.ctx, grad.data(), n, 7, -1.0f, 1.0f);
  fw::AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10};
  {  // one step on the first 4096 elements against the host kernel
    const std::int64_t c = 4096;
    auto hp = download(g.ctx, p.data(), c), hm = download(g.ctx, m.data(), c),
         hv = download(g.ctx, v.data(), c);
    const auto hg = download(g.ctx, grad.data(), c);
    std::vector<fw::bf16> hw(static_cast<std::size_t>(c));
    fw::host::adamw_update(g.host, hp.data(), hm.data(), hv.data(), hw.data(), hg.data(), c, s);
    fw::cuda::adamw_update(g.ctx, p.data(), m.data(), v.data(), working.data(), grad.data(), n, s);
    const auto dp = download(g.ctx, p.data(), c);
    for (std::int64_t i = 0; i < c; ++i) {
      if (std::abs(dp[i] - hp[i]) > 1e-6f + 1e-6f * std::abs(hp[i])) {
        state.SkipWithError("AdamW result differs from the host kernel");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, [&] {
    ++s.step;
    fw::cuda::adamw_update(g.ctx, p.data(), m.data(), v.data(), working.data(), grad.data(), n, s);
  });
  report_bandwidth(state, 28.0 * static_cast<double>(n));  // r/w p, m, v (24 B), r grad, w working
}

/// The multi-tensor AdamW a training step runs: GPT-2 124M's 148 parameter tensors (vocabulary
/// padded to 50304), slices of one buffer each on a 16-byte boundary, decay on the 2-D ones; one
/// call (a launch per 24 tensors).
void adamw_list(benchmark::State& state) {
  Gpu g;
  std::vector<std::pair<std::int64_t, bool>> shapes = {{50304 * 768, true}, {1024 * 768, true}};
  for (int l = 0; l < 12; ++l) {
    for (const auto& t : std::initializer_list<std::pair<std::int64_t, bool>>{{768, false},
                                                                              {768, false},
                                                                              {768 * 2304, true},
                                                                              {2304, false},
                                                                              {768 * 768, true},
                                                                              {768, false},
                                                                              {768, false},
                                                                              {768, false},
                                                                              {768 * 3072, true},
                                                                              {3072, false},
                                                                              {3072 * 768, true},
                                                                              {768, false}}) {
      shapes.push_back(t);
    }
  }
  shapes.push_back({768, false});
  shapes.push_back({768, false});
  std::int64_t total = 0;
  for (const auto& t : shapes) total += (t.first + 7) / 8 * 8;
  fw::Tensor<float, fw::Cuda> p({total}, fw::MemTag::workspace, g.acct),
      m({total}, fw::MemTag::workspace, g.acct), v({total}, fw::MemTag::workspace, g.acct);
  fw::Tensor<fw::bf16, fw::Cuda> grad({total}, fw::MemTag::workspace, g.acct),
      working({total}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, p.data(), total, 4, -1.0f, 1.0f);
  fill_random(g.ctx, m.data(), total, 5, -0.1f, 0.1f);
  fill_random(g.ctx, v.data(), total, 6, 0.0f, 0.01f);
  fill_random(g.ctx, grad.data(), total, 7, -1.0f, 1.0f);
  std::vector<fw::AdamWTensor<fw::bf16, fw::bf16>> list;
  std::int64_t at = 0, params = 0;
  for (const auto& [n, decay] : shapes) {
    list.push_back({p.data() + at, m.data() + at, v.data() + at, working.data() + at,
                    grad.data() + at, n, decay});
    at += (n + 7) / 8 * 8;
    params += n;
  }
  fw::AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10};
  {  // one step against the host kernel on a decayed and an undecayed tensor (1-D: list[2])
    const auto& t = list[2];
    const std::int64_t c = t.n;
    const std::int64_t off = t.master - p.data();
    auto hp = download(g.ctx, p.data() + off, c), hm = download(g.ctx, m.data() + off, c),
         hv = download(g.ctx, v.data() + off, c);
    const auto hg = download(g.ctx, grad.data() + off, c);
    const auto w0 = download(g.ctx, p.data(), 4096), m0 = download(g.ctx, m.data(), 4096),
               v0 = download(g.ctx, v.data(), 4096);
    const auto g0 = download(g.ctx, grad.data(), 4096);
    std::vector<fw::bf16> hw(static_cast<std::size_t>(c)), hw0(4096);
    fw::AdamWStep plain = s;
    plain.weight_decay = 0.0f;
    fw::host::adamw_update(g.host, hp.data(), hm.data(), hv.data(), hw.data(), hg.data(), c, plain);
    auto hp0 = w0, hm0 = m0, hv0 = v0;
    fw::host::adamw_update(g.host, hp0.data(), hm0.data(), hv0.data(), hw0.data(), g0.data(), 4096,
                           s);
    fw::cuda::adamw_update_list(g.ctx, list, s);
    const auto dp = download(g.ctx, p.data() + off, c), dp0 = download(g.ctx, p.data(), 4096);
    for (std::int64_t i = 0; i < c; ++i) {
      if (std::abs(dp[i] - hp[i]) > 1e-6f + 1e-6f * std::abs(hp[i])) {
        state.SkipWithError("multi-tensor AdamW differs from the host kernel (no decay)");
        return;
      }
    }
    for (std::int64_t i = 0; i < 4096; ++i) {
      if (std::abs(dp0[i] - hp0[i]) > 1e-6f + 1e-6f * std::abs(hp0[i])) {
        state.SkipWithError("multi-tensor AdamW differs from the host kernel (decay)");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, [&] {
    ++s.step;
    fw::cuda::adamw_update_list(g.ctx, list, s);
  });
  state.counters["params"] = static_cast<double>(params);
  report_bandwidth(state, 28.0 * static_cast<double>(params));
}

void layernorm(benchmark::State& state) {
  Gpu g;
  const std::int64_t rows = 65536, C = 768;
  fw::Tensor<fw::bf16, fw::Cuda> in({rows, C}, fw::MemTag::workspace, g.acct),
      out({rows, C}, fw::MemTag::workspace, g.acct), w({C}, fw::MemTag::workspace, g.acct),
      b({C}, fw::MemTag::workspace, g.acct);
  fw::Tensor<float, fw::Cuda> mean({rows}, fw::MemTag::workspace, g.acct),
      rstd({rows}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, in.data(), rows * C, 8, -2.0f, 2.0f);
  fill_random(g.ctx, w.data(), C, 9, 0.5f, 1.5f);
  fill_random(g.ctx, b.data(), C, 10, -0.5f, 0.5f);
  auto run = [&] {
    fw::cuda::layernorm_forward(g.ctx, out.data(), mean.data(), rstd.data(), in.data(), w.data(),
                                b.data(), rows, C, 1e-5f);
  };
  run();
  {  // first 16 rows against the host kernel
    const auto hi = download(g.ctx, in.data(), 16 * C), hw = download(g.ctx, w.data(), C),
               hb = download(g.ctx, b.data(), C), ho = download(g.ctx, out.data(), 16 * C);
    std::vector<fw::bf16> want(hi.size());
    std::vector<float> hm(16), hr(16);
    fw::host::layernorm_forward(g.host, want.data(), hm.data(), hr.data(), hi.data(), hw.data(),
                                hb.data(), 16, C, 1e-5f);
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float a = fw::convert<float>(ho[i]), e = fw::convert<float>(want[i]);
      if (std::abs(a - e) > 2e-2f * std::abs(e) + 1e-3f) {
        state.SkipWithError("LayerNorm result differs from the host kernel");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, run);
  report_bandwidth(state, 4.0 * static_cast<double>(rows * C));  // read x, write out (bf16)
}

/// Row softmax at the materialised attention's shape (B·NH·T = 8·12·1024 rows of T = 1024
/// scores, bf16), forward and backward: read in + write out, then read out and dout + write din.
void softmax(benchmark::State& state) {
  Gpu g;
  const std::int64_t rows = 8 * 12 * 1024, cols = 1024;
  fw::Tensor<fw::bf16, fw::Cuda> in({rows, cols}, fw::MemTag::workspace, g.acct),
      out({rows, cols}, fw::MemTag::workspace, g.acct),
      dout({rows, cols}, fw::MemTag::workspace, g.acct),
      din({rows, cols}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, in.data(), rows * cols, 21, -6.0f, 6.0f);
  fill_random(g.ctx, dout.data(), rows * cols, 22, -1.0f, 1.0f);
  auto run = [&] {
    fw::cuda::softmax_forward(g.ctx, out.data(), in.data(), rows, cols);
    fw::cuda::softmax_backward(g.ctx, din.data(), out.data(), dout.data(), rows, cols);
  };
  run();
  {  // first 8 rows against the host kernels
    const auto hi = download(g.ctx, in.data(), 8 * cols),
               hd = download(g.ctx, dout.data(), 8 * cols),
               hg = download(g.ctx, din.data(), 8 * cols);
    std::vector<fw::bf16> ho(hi.size()), want(hi.size());
    fw::host::softmax_forward(g.host, ho.data(), hi.data(), 8, cols);
    fw::host::softmax_backward(g.host, want.data(), ho.data(), hd.data(), 8, cols);
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float a = fw::convert<float>(hg[i]), e = fw::convert<float>(want[i]);
      if (std::abs(a - e) > 3e-2f * std::abs(e) + 1e-3f) {
        state.SkipWithError("softmax gradient differs from the host kernels");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, run);
  report_bandwidth(state, 2.0 * 5.0 * static_cast<double>(rows * cols));
}

/// Cross-entropy forward and backward over GPT-2's padded vocabulary (8192 rows of 50304 bf16
/// logits, 50257 real): read the logits for the losses, then read them and write the gradient.
void cross_entropy(benchmark::State& state) {
  Gpu g;
  const std::int64_t rows = 8192, V = 50257, ld = 50304;
  fw::Tensor<fw::bf16, fw::Cuda> logits({rows, ld}, fw::MemTag::workspace, g.acct),
      dlogits({rows, ld}, fw::MemTag::workspace, g.acct);
  fw::Tensor<float, fw::Cuda> losses({rows}, fw::MemTag::workspace, g.acct);
  fw::Tensor<std::int32_t, fw::Cuda> targets({rows}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, logits.data(), rows * ld, 23, -8.0f, 8.0f);
  std::vector<std::int32_t> ht(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) ht[static_cast<std::size_t>(r)] = (r * 7919) % V;
  fw::cuda::from_host(g.ctx, targets.data(), ht.data(), rows);
  auto run = [&] {
    fw::cuda::cross_entropy_forward(g.ctx, losses.data(), logits.data(), targets.data(), rows, V,
                                    ld);
    fw::cuda::cross_entropy_backward(g.ctx, dlogits.data(), logits.data(), targets.data(), rows, V,
                                     1.0f / static_cast<float>(rows), ld);
  };
  run();
  {  // first 4 rows' losses against the host kernel
    const auto hl = download(g.ctx, logits.data(), 4 * ld);
    const auto got = download(g.ctx, losses.data(), 4);
    std::vector<float> want(4);
    fw::host::cross_entropy_forward(g.host, want.data(), hl.data(), ht.data(), 4, V, ld);
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (std::abs(got[i] - want[i]) > 1e-3f * std::abs(want[i]) + 1e-3f) {
        state.SkipWithError("cross-entropy loss differs from the host kernel");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, run);
  report_bandwidth(state, 3.0 * 2.0 * static_cast<double>(rows * ld));
}

void gelu(benchmark::State& state) {
  Gpu g;
  const std::int64_t n = 8192 * 3072 * 4;
  fw::Tensor<fw::bf16, fw::Cuda> in({n}, fw::MemTag::workspace, g.acct),
      out({n}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, in.data(), n, 11, -4.0f, 4.0f);
  auto run = [&] { fw::cuda::gelu_forward(g.ctx, out.data(), in.data(), n); };
  run();
  {
    const auto hi = download(g.ctx, in.data(), 4096), ho = download(g.ctx, out.data(), 4096);
    std::vector<fw::bf16> want(hi.size());
    fw::host::gelu_forward(g.host, want.data(), hi.data(), 4096);
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float a = fw::convert<float>(ho[i]), e = fw::convert<float>(want[i]);
      if (std::abs(a - e) > 1e-2f * std::abs(e) + 1e-5f) {
        state.SkipWithError("GELU result differs from the host kernel");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, run);
  report_bandwidth(state, 4.0 * static_cast<double>(n));  // read in, write out (bf16)
}

/// The MLP's first matrix in bf16 at GPT-2 small's shape (8192 x 768 -> 3072): gelu(x·W + b)
/// with its GELU input kept, as one cuBLASLt epilogue GEMM (`fused`) or as the GEMM, the bias
/// pass and the GELU pass (the sequence before the epilogue). TFLOP/s of the GEMM.
void linear_gelu(benchmark::State& state, bool fused) {
  Gpu g;
  const std::int64_t m = 8192, k = 768, n = 3072;
  using E = fw::bf16;
  fw::Tensor<E, fw::Cuda> x({m, k}, fw::MemTag::workspace, g.acct),
      w({k, n}, fw::MemTag::workspace, g.acct), b({n}, fw::MemTag::workspace, g.acct),
      pre({m, n}, fw::MemTag::workspace, g.acct), out({m, n}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, x.data(), m * k, 21, -1.0f, 1.0f);
  fill_random(g.ctx, w.data(), k * n, 22, -0.05f, 0.05f);
  fill_random(g.ctx, b.data(), n, 23, -0.5f, 0.5f);
  const fw::Trans N = fw::Trans::none;
  auto run = [&] {
    if (fused) {
      fw::cuda::gemm_bias(g.ctx, N, N, m, n, k, x.data(), k, w.data(), n, b.data(), out.data(), n,
                          pre.data());
    } else {
      fw::cuda::gemm(g.ctx, N, N, m, n, k, 1.0f, x.data(), k, w.data(), n, 0.0f, pre.data(), n);
      fw::cuda::bias_add(g.ctx, pre.data(), b.data(), m, n);
      fw::cuda::gelu_forward(g.ctx, out.data(), pre.data(), m * n);
    }
  };
  run();
  {  // the first 4 rows against the host twin
    const auto hx = download(g.ctx, x.data(), 4 * k), hw = download(g.ctx, w.data(), k * n),
               hb = download(g.ctx, b.data(), n), ho = download(g.ctx, out.data(), 4 * n);
    std::vector<E> want(ho.size()), wpre(ho.size());
    fw::host::gemm_bias(g.host, N, N, 4, n, k, hx.data(), k, hw.data(), n, hb.data(), want.data(),
                        n, wpre.data());
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float a = fw::convert<float>(ho[i]), e = fw::convert<float>(want[i]);
      if (std::abs(a - e) > 2e-2f * std::abs(e) + 1e-2f) {
        state.SkipWithError("gelu(x·W + b) differs from the host twin");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, run);
  state.counters["tflops"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k) * 1e-12,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
void linear_gelu_fused(benchmark::State& state) { linear_gelu(state, true); }
void linear_gelu_unfused(benchmark::State& state) { linear_gelu(state, false); }

/// The bias gradient (a column sum) of GPT-2 small's (8192, 3072) MLP activation in bf16, in
/// bytes/s against the copy: the rows split into 512-row slices, added in order.
void column_sum(benchmark::State& state) {
  Gpu g;
  const std::int64_t rows = 8192, cols = 3072;
  using E = fw::bf16;
  fw::Tensor<E, fw::Cuda> dy({rows, cols}, fw::MemTag::workspace, g.acct),
      db({cols}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, dy.data(), rows * cols, 24, -1.0f, 1.0f);
  fw::cuda::fill(g.ctx, db.data(), cols, fw::convert<E>(0.0f));
  fw::cuda::bias_backward(g.ctx, db.data(), dy.data(), rows, cols);
  {  // the first 64 columns against the host's sum
    const auto hy = download(g.ctx, dy.data(), rows * cols), hd = download(g.ctx, db.data(), cols);
    std::vector<E> want(static_cast<std::size_t>(cols), fw::convert<E>(0.0f));
    fw::host::bias_backward(g.host, want.data(), hy.data(), rows, cols);
    for (std::size_t c = 0; c < 64; ++c) {
      const float a = fw::convert<float>(hd[c]), e = fw::convert<float>(want[c]);
      if (std::abs(a - e) > 2e-2f * std::abs(e) + 1e-2f) {
        state.SkipWithError("column sum differs from the host's");
        return;
      }
    }
  }
  timed_loop(state, g.ctx,
             [&] { fw::cuda::bias_backward(g.ctx, db.data(), dy.data(), rows, cols); });
  report_bandwidth(state, 2.0 * static_cast<double>(rows * cols));  // read dy (bf16)
}

enum class Attention { fused, blockwise, tiled, materialised };

/// Causal attention, forward then backward, bf16, by one of the four paths.
void attention(benchmark::State& state, Attention path) {
  const bool flash = path != Attention::materialised;
  Gpu g;
  const std::int64_t B = 8, T = 1024, NH = 12, hs = 64, C = NH * hs;
  using E = fw::bf16;
  fw::Tensor<E, fw::Cuda> qkv({B, T, 3 * C}, fw::MemTag::workspace, g.acct),
      out({B, T, C}, fw::MemTag::workspace, g.acct), dout({B, T, C}, fw::MemTag::workspace, g.acct),
      dqkv({B, T, 3 * C}, fw::MemTag::workspace, g.acct);
  fill_random(g.ctx, qkv.data(), qkv.numel(), 12, -1.5f, 1.5f);
  fill_random(g.ctx, dout.data(), dout.numel(), 13, -1.0f, 1.0f);
  fw::Tensor<float, fw::Cuda> lse({B, NH, T}, fw::MemTag::workspace, g.acct),
      delta({B, NH, T}, fw::MemTag::workspace, g.acct);
  const std::int64_t att_elems = flash ? 1 : B * NH * T * T;
  fw::Tensor<E, fw::Cuda> att({att_elems}, fw::MemTag::workspace, g.acct),
      datt({att_elems}, fw::MemTag::workspace, g.acct);
  auto run = [&] {
    if (path == Attention::fused) {
      fw::cuda::fused_attention_forward(g.ctx, out.data(), lse.data(), qkv.data(), B, T, C, NH);
      fw::cuda::fused_attention_backward(g.ctx, dqkv.data(), delta.data(), dout.data(), qkv.data(),
                                         out.data(), lse.data(), B, T, C, NH);
    } else if (path == Attention::blockwise) {
      fw::cuda::flash_attention_forward(g.ctx, out.data(), lse.data(), qkv.data(), B, T, C, NH);
      fw::cuda::flash_attention_backward(g.ctx, dqkv.data(), delta.data(), dout.data(), qkv.data(),
                                         out.data(), lse.data(), B, T, C, NH);
    } else if (path == Attention::tiled) {
      fw::cuda::tiled_flash_attention_forward(g.ctx, out.data(), lse.data(), qkv.data(), B, T, C,
                                              NH);
      fw::cuda::tiled_flash_attention_backward(g.ctx, dqkv.data(), delta.data(), dout.data(),
                                               qkv.data(), out.data(), lse.data(), B, T, C, NH);
    } else {
      fw::cuda::attention_forward(g.ctx, out.data(), att.data(), qkv.data(), B, T, C, NH);
      fw::cuda::attention_backward(g.ctx, dqkv.data(), datt.data(), dout.data(), qkv.data(),
                                   att.data(), B, T, C, NH);
    }
  };
  run();
  {  // the first sequence's output against the host flash twin
    const auto hq = download(g.ctx, qkv.data(), T * 3 * C), ho = download(g.ctx, out.data(), T * C);
    std::vector<E> want(ho.size());
    std::vector<float> hl(static_cast<std::size_t>(NH * T));
    fw::host::flash_attention_forward(g.host, want.data(), hl.data(), hq.data(), 1, T, C, NH);
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float a = fw::convert<float>(ho[i]), e = fw::convert<float>(want[i]);
      if (std::abs(a - e) > 3e-2f * std::abs(e) + 1e-2f) {
        state.SkipWithError("attention output differs from the host flash twin");
        return;
      }
    }
  }
  timed_loop(state, g.ctx, run);
  const double causal = 14.0 * static_cast<double>(B * NH * T * T * hs) / 2.0;
  state.counters["causal_tflops"] =
      benchmark::Counter(causal * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["saved_bytes_per_layer"] =
      static_cast<double>(flash ? B * NH * T * 4 : B * NH * T * T * 2);
}

void gemm_fp32(benchmark::State& state, bool direct) { gemm<float>(state, direct); }
void gemm_bf16(benchmark::State& state, bool direct) { gemm<fw::bf16>(state, direct); }

void gpt2_shapes(benchmark::internal::Benchmark* b) {
  b->Args({8192, 2304, 768})
      ->Args({8192, 768, 768})
      ->Args({8192, 3072, 768})
      ->Args({8192, 768, 3072});
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(device_copy)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(gemm_fp32, fourway, false)->Apply(gpt2_shapes);
BENCHMARK_CAPTURE(gemm_fp32, cublas, true)->Apply(gpt2_shapes);
BENCHMARK_CAPTURE(gemm_bf16, fourway, false)->Apply(gpt2_shapes);
BENCHMARK_CAPTURE(gemm_bf16, cublas, true)->Apply(gpt2_shapes);
BENCHMARK(adamw)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(adamw_list)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(layernorm)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(gelu)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(softmax)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(cross_entropy)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(linear_gelu_fused)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(linear_gelu_unfused)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(column_sum)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(attention, blockwise, Attention::blockwise)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(attention, tiled, Attention::tiled)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(attention, materialised, Attention::materialised)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// last: new kernels (stop 39) whose failure should cost no other row
BENCHMARK_CAPTURE(attention, fused, Attention::fused)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  if (fw::cuda::device_count() == 0) {
    std::printf("bench_kernels_gpu: no CUDA device; nothing measured (GPU figures stay pending)\n");
    return 77;  // ctest: Skipped
  }
  {  // the copy bandwidth the pct_of_copy counters divide by: best of 20 1-GiB copies
    Gpu g;
    const std::int64_t n = std::int64_t{1} << 28;
    fw::Tensor<float, fw::Cuda> a({n}, fw::MemTag::workspace, g.acct),
        b({n}, fw::MemTag::workspace, g.acct);
    cudaEvent_t s, e;
    cudaEventCreate(&s);
    cudaEventCreate(&e);
    float best = 1e30f;
    for (int i = 0; i < 20; ++i) {
      cudaEventRecord(s, g.ctx.stream());
      fw::cuda::copy(g.ctx, b.data(), a.data(), n);
      cudaEventRecord(e, g.ctx.stream());
      cudaEventSynchronize(e);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, s, e);
      best = std::min(best, ms);
    }
    g_copy_bytes_per_s = 2.0 * static_cast<double>(n) * 4.0 / (static_cast<double>(best) * 1e-3);
    std::printf("device copy bandwidth (best of 20, 1 GiB): %.1f GB/s\n",
                g_copy_bytes_per_s * 1e-9);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
