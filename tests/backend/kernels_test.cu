// The CUDA kernels (backend/cuda/kernels.cuh) against the host kernels, which the host tests
// pin to double-precision references. Random inputs, odd shapes, all three element types.
// Every test skips without a GPU. Tolerances: the two sides differ in summation order and in
// exp/tanh (device expf/tanhf vs the host polynomials, a few fp32 ulps), so fp32 results agree
// to ~1e-5 relative; 16-bit outputs may round to neighbouring values: 2 units of T's rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fourway/backend/cuda/attention_select.cuh"
#include "fourway/backend/cuda/fused_attention.cuh"
#include "fourway/backend/cuda/kernels.cuh"
#include "fourway/backend/host/kernels.hpp"
#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

#define FW_REQUIRE_GPU()                                                 \
  do {                                                                   \
    if (fw::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

namespace {

struct Env {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> host{acct};
  fw::Context<fw::Cuda> dev{acct, 0};
};

template <class T>
struct Dev {
  fw::Tensor<T, fw::Cuda> t;
  Dev(Env& e, const std::vector<T>& v)
      : t({static_cast<std::int64_t>(std::max<std::size_t>(v.size(), 1))}, fw::MemTag::workspace,
          e.acct) {
    fw::cuda::from_host(e.dev, t.data(), v.data(), static_cast<std::int64_t>(v.size()));
  }
  T* p() { return t.data(); }
  std::vector<T> get(Env& e, std::size_t n) {
    std::vector<T> h(n);
    fw::cuda::to_host(e.dev, h.data(), t.data(), static_cast<std::int64_t>(n));
    return h;
  }
};

template <class T>
double tol_rel() {
  return 2 * ft::unit_roundoff<T>() + 1e-5;
}

/// Expects the device result to match the host one (both of type T).
template <class T>
void expect_match(const std::vector<T>& dev, const std::vector<T>& host, double atol,
                  const std::string& what) {
  ft::expect_close(ft::to_double(dev), ft::to_double(host), atol, tol_rel<T>(),
                   what + " (" + ft::type_name<T>() + ")");
}

std::vector<std::int32_t> random_ids(std::size_t n, std::int64_t V, std::uint32_t seed) {
  const auto f = ft::random_floats(n, seed, 0.0f, 1.0f);
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) {
    t[i] = std::min<std::int32_t>(static_cast<std::int32_t>(f[i] * static_cast<float>(V)),
                                  static_cast<std::int32_t>(V - 1));
  }
  return t;
}

}  // namespace

template <class T>
class CudaKernels : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(CudaKernels, Dtypes);

TYPED_TEST(CudaKernels, GemmAllTransposesAndBatched) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  const std::int64_t shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {127, 45, 300}, {1023, 64, 96}};
  std::uint32_t seed = 1;
  for (const auto& s : shapes) {
    const auto [m, n, k] = std::tuple{s[0], s[1], s[2]};
    for (fw::Trans ta : {fw::Trans::none, fw::Trans::transpose}) {
      for (fw::Trans tb : {fw::Trans::none, fw::Trans::transpose}) {
        const std::int64_t lda = fw::detail::stored_cols(ta, m, k) + 1;
        const std::int64_t ldb = fw::detail::stored_cols(tb, k, n) + 2;
        const std::int64_t ldc = n + 3;
        const auto a = ft::random_typed<T>(
            static_cast<std::size_t>(fw::detail::stored_rows(ta, m, k) * lda), ++seed);
        const auto b = ft::random_typed<T>(
            static_cast<std::size_t>(fw::detail::stored_rows(tb, k, n) * ldb), ++seed);
        auto c = ft::random_typed<T>(static_cast<std::size_t>(m * ldc), ++seed);
        auto cf = ft::random_floats(static_cast<std::size_t>(m * ldc), ++seed);
        Dev<T> da(e, a), db(e, b), dc(e, c);
        Dev<float> dcf(e, cf);
        fw::cuda::gemm(e.dev, ta, tb, m, n, k, 0.75f, da.p(), lda, db.p(), ldb, 0.5f, dc.p(), ldc);
        fw::cuda::gemm(e.dev, ta, tb, m, n, k, -1.0f, da.p(), lda, db.p(), ldb, 1.0f, dcf.p(), ldc);
        fw::host::gemm(e.host, ta, tb, m, n, k, 0.75f, a.data(), lda, b.data(), ldb, 0.5f, c.data(),
                       ldc);
        fw::host::gemm(e.host, ta, tb, m, n, k, -1.0f, a.data(), lda, b.data(), ldb, 1.0f,
                       cf.data(), ldc);
        // both accumulate k products < 1 in fp32 in different orders: k * 2^-22 absolute
        const double atol = static_cast<double>(k) * 0x1p-22;
        expect_match(dc.get(e, c.size()), c, atol, "gemm");
        ft::expect_close(ft::to_double(dcf.get(e, cf.size())), ft::to_double(cf), atol, 1e-5,
                         "gemm fp32 C");
      }
    }
  }
  // strided batched: 3 matrices with gaps between them
  const std::int64_t m = 9, n = 7, k = 11, batch = 3, sa = m * k + 5, sb = k * n + 3,
                     sc = m * n + 2;
  const auto a = ft::random_typed<T>(static_cast<std::size_t>(sa * batch), 90);
  const auto b = ft::random_typed<T>(static_cast<std::size_t>(sb * batch), 91);
  auto c = ft::random_typed<T>(static_cast<std::size_t>(sc * batch), 92);
  Dev<T> da(e, a), db(e, b), dc(e, c);
  fw::cuda::gemm_strided_batched(e.dev, fw::Trans::none, fw::Trans::transpose, m, n, k, 1.0f,
                                 da.p(), k, sa, db.p(), k, sb, 0.0f, dc.p(), n, sc, batch);
  fw::host::gemm_strided_batched(e.host, fw::Trans::none, fw::Trans::transpose, m, n, k, 1.0f,
                                 a.data(), k, sa, b.data(), k, sb, 0.0f, c.data(), n, sc, batch);
  expect_match(dc.get(e, c.size()), c, 1e-5, "gemm_strided_batched");
}

// The cuBLASLt bias / bias + GELU epilogue against the host twin (the unfused sequence): every
// transpose, padded and unpadded C. Leading dimensions that are multiples of 8 on 16-byte
// pointers take cuBLASLt's fused kernel; the odd ones (ldc = n + 3) its fallback. The fused
// kernel adds the bias before rounding where the host rounds the GEMM first: within the GEMM's
// accumulation bound plus a few units of T at the GEMM's magnitude.
TYPED_TEST(CudaKernels, GemmBiasEpilogueMatchesHost) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  const std::int64_t shapes[][3] = {{8, 8, 8}, {7, 13, 5}, {64, 96, 128}, {1024, 768, 256}};
  std::uint32_t seed = 700;
  for (const auto& s : shapes) {
    const auto [m, n, k] = std::tuple{s[0], s[1], s[2]};
    for (std::int64_t pad : {std::int64_t{0}, std::int64_t{3}, std::int64_t{8}}) {
      for (fw::Trans ta : {fw::Trans::none, fw::Trans::transpose}) {
        for (fw::Trans tb : {fw::Trans::none, fw::Trans::transpose}) {
          for (bool gelu : {false, true}) {
            const std::int64_t lda = fw::detail::stored_cols(ta, m, k);
            const std::int64_t ldb = fw::detail::stored_cols(tb, k, n);
            const std::int64_t ldc = n + pad;
            const auto a = ft::random_typed<T>(
                static_cast<std::size_t>(fw::detail::stored_rows(ta, m, k) * lda), ++seed);
            const auto b = ft::random_typed<T>(
                static_cast<std::size_t>(fw::detail::stored_rows(tb, k, n) * ldb), ++seed);
            const auto bias = ft::random_typed<T>(static_cast<std::size_t>(n), ++seed);
            auto c = ft::random_typed<T>(static_cast<std::size_t>(m * ldc), ++seed);
            auto pre = c;
            Dev<T> da(e, a), db(e, b), dbias(e, bias), dc(e, c), dpre(e, pre);
            fw::cuda::gemm_bias(e.dev, ta, tb, m, n, k, da.p(), lda, db.p(), ldb, dbias.p(), dc.p(),
                                ldc, gelu ? dpre.p() : nullptr);
            fw::host::gemm_bias(e.host, ta, tb, m, n, k, a.data(), lda, b.data(), ldb, bias.data(),
                                c.data(), ldc, gelu ? pre.data() : nullptr);
            // + 1e-5 with GELU: cuBLASLt's epilogue evaluates tanh its own way; the first GPU
            // run saw fp32 outputs (|y| < 0.2) off the host's std::tanh by up to 5e-6
            const double atol = static_cast<double>(k) * 0x1p-22 +
                                4.0 * ft::unit_roundoff<T>() * static_cast<double>(k + 1) +
                                (gelu ? 1e-5 : 0.0);
            const std::string what = "gemm_bias m=" + std::to_string(m) +
                                     " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                     " ldc=" + std::to_string(ldc) + (gelu ? " +gelu" : "");
            expect_match(dc.get(e, c.size()), c, atol, what);
            if (gelu) expect_match(dpre.get(e, pre.size()), pre, atol, what + " (GELU input)");
          }
        }
      }
    }
  }
}

// The backward epilogues against their host twins (the unfused sequence): a weight gradient with
// its bias's (BGRADA; c and dbias accumulate onto random values) and GELU's input gradient with
// the previous layer's bias gradient (DGELU_BGRAD, and DGELU without it). Aligned shapes take
// cuBLASLt's fused kernels, the odd ones (n = 13, ldc = n + 3 without a bias gradient) the
// fallback. The fused kernels round once where the host rounds the GEMM's output first; the bias
// gradients are fp32 sums over k (bgrad) or m (dgelu) rows of values within the GEMM's bound.
TYPED_TEST(CudaKernels, BackwardEpiloguesMatchHost) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  const std::int64_t shapes[][3] = {{8, 8, 8}, {7, 13, 5}, {64, 96, 128}, {768, 1024, 256}};
  std::uint32_t seed = 900;
  for (const auto& s : shapes) {
    const auto [m, n, k] = std::tuple{s[0], s[1], s[2]};
    for (fw::Trans ta : {fw::Trans::none, fw::Trans::transpose}) {
      const std::int64_t lda = fw::detail::stored_cols(ta, m, k);
      const auto a = ft::random_typed<T>(
          static_cast<std::size_t>(fw::detail::stored_rows(ta, m, k) * lda), ++seed);
      const double atol = static_cast<double>(k) * 0x1p-22 +
                          4.0 * ft::unit_roundoff<T>() * static_cast<double>(k + 1) + 1e-5;
      const std::string shape = " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                " k=" + std::to_string(k) + (ta == fw::Trans::none ? "" : " A^T");
      {  // gemm_bgrad: B is the dense (k, n) output gradient
        const auto b = ft::random_typed<T>(static_cast<std::size_t>(k * n), ++seed);
        auto c = ft::random_typed<T>(static_cast<std::size_t>(m * n), ++seed);
        auto dbias = ft::random_typed<T>(static_cast<std::size_t>(n), ++seed);
        Dev<T> da(e, a), db(e, b), dc(e, c), ddb(e, dbias);
        fw::cuda::gemm_bgrad(e.dev, ta, fw::Trans::none, m, n, k, da.p(), lda, db.p(), n, dc.p(), n,
                             ddb.p());
        fw::host::gemm_bgrad(e.host, ta, fw::Trans::none, m, n, k, a.data(), lda, b.data(), n,
                             c.data(), n, dbias.data());
        expect_match(dc.get(e, c.size()), c, atol, "gemm_bgrad" + shape);
        expect_match(ddb.get(e, dbias.size()), dbias,
                     static_cast<double>(k) * 0x1p-20 + 4.0 * ft::unit_roundoff<T>() * k,
                     "gemm_bgrad" + shape + " (bias gradient)");
      }
      for (bool grad : {false, true}) {  // gemm_dgelu: c = gelu'(pre) ⊙ (A·B)
        const std::int64_t ldc = grad ? n : n + 3;
        const auto b = ft::random_typed<T>(static_cast<std::size_t>(k * n), ++seed);
        const auto pre =
            ft::random_typed<T>(static_cast<std::size_t>(m * ldc), ++seed, -3.0f, 3.0f);
        auto c = ft::random_typed<T>(static_cast<std::size_t>(m * ldc), ++seed);
        auto dbias = ft::random_typed<T>(static_cast<std::size_t>(n), ++seed);
        Dev<T> da(e, a), db(e, b), dpre(e, pre), dc(e, c), ddb(e, dbias);
        fw::cuda::gemm_dgelu(e.dev, ta, fw::Trans::none, m, n, k, da.p(), lda, db.p(), n, dpre.p(),
                             dc.p(), ldc, grad ? ddb.p() : nullptr);
        fw::host::gemm_dgelu(e.host, ta, fw::Trans::none, m, n, k, a.data(), lda, b.data(), n,
                             pre.data(), c.data(), ldc, grad ? dbias.data() : nullptr);
        const std::string what = "gemm_dgelu" + shape + (grad ? " +bgrad" : " ldc=n+3");
        expect_match(dc.get(e, c.size()), c, 1.2 * atol, what);
        if (grad) {
          expect_match(ddb.get(e, dbias.size()), dbias,
                       static_cast<double>(m) * 1.2 * atol + 4.0 * ft::unit_roundoff<T>() * m,
                       what + " (bias gradient)");
        }
      }
    }
  }
}

TYPED_TEST(CudaKernels, BiasResidualGeluCastScale) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  const std::int64_t shapes[][2] = {{1, 1}, {7, 5}, {127, 33}, {1023, 768}};
  std::uint32_t seed = 100;
  for (const auto& s : shapes) {
    const std::int64_t rows = s[0], cols = s[1], n = rows * cols;
    const auto N = static_cast<std::size_t>(n);
    auto out = ft::random_typed<T>(N, ++seed);
    const auto bias = ft::random_typed<T>(static_cast<std::size_t>(cols), ++seed);
    auto dbias = ft::random_typed<T>(static_cast<std::size_t>(cols), ++seed);
    const auto x = ft::random_typed<T>(N, ++seed, -4.0f, 4.0f);
    const auto dy = ft::random_typed<T>(N, ++seed);
    Dev<T> dout(e, out), dbi(e, bias), ddb(e, dbias), dx(e, x), ddy(e, dy);
    fw::cuda::bias_add(e.dev, dout.p(), dbi.p(), rows, cols);
    fw::host::bias_add(e.host, out.data(), bias.data(), rows, cols);
    expect_match(dout.get(e, N), out, 0.0, "bias_add");
    fw::cuda::bias_backward(e.dev, ddb.p(), ddy.p(), rows, cols);
    fw::host::bias_backward(e.host, dbias.data(), dy.data(), rows, cols);
    expect_match(ddb.get(e, dbias.size()), dbias, static_cast<double>(rows) * 0x1p-22,
                 "bias_backward");

    std::vector<T> r(N);
    Dev<T> dr(e, r);
    fw::cuda::residual_forward(e.dev, dr.p(), dx.p(), ddy.p(), n);
    fw::host::residual_forward(e.host, r.data(), x.data(), dy.data(), n);
    expect_match(dr.get(e, N), r, 0.0, "residual_forward");
    fw::cuda::gelu_forward(e.dev, dr.p(), dx.p(), n);
    fw::host::gelu_forward(e.host, r.data(), x.data(), n);
    expect_match(dr.get(e, N), r, 2e-6, "gelu_forward");  // tanhf vs tanh_poly: ~2e-7 x |x|
    fw::cuda::gelu_backward(e.dev, dr.p(), dx.p(), ddy.p(), n);
    fw::host::gelu_backward(e.host, r.data(), x.data(), dy.data(), n);
    expect_match(dr.get(e, N), r, 4e-6, "gelu_backward");

    const auto f = ft::random_floats(N, ++seed, -70.0f, 70.0f);
    Dev<float> df(e, f);
    std::vector<T> cast_host(N);
    fw::cuda::cast(e.dev, dr.p(), df.p(), n);
    fw::host::cast(e.host, cast_host.data(), f.data(), n);
    const auto cast_dev = dr.get(e, N);
    for (std::size_t i = 0; i < N; ++i)
      ASSERT_EQ(cast_dev[i], cast_host[i]) << "cast differs at " << i;
    fw::cuda::scale(e.dev, dx.p(), n, 0.3f);
    auto xs = x;
    fw::host::scale(e.host, xs.data(), n, 0.3f);
    expect_match(dx.get(e, N), xs, 0.0, "scale");
  }
}

// The elementwise maps move 16-byte packs when every pointer is on a 16-byte boundary and one
// element a thread otherwise: every offset of a pack (aligned, and each misalignment) and lengths
// around a pack's size give the host twins' results, bitwise where the host rounds the same.
TYPED_TEST(CudaKernels, ElementwiseMapsAtEveryAlignmentAndLength) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  constexpr std::int64_t V = 16 / static_cast<std::int64_t>(sizeof(T));
  std::uint32_t seed = 150;
  for (std::int64_t off = 0; off <= V; ++off) {
    for (std::int64_t n : {std::int64_t{1}, V - 1, V, V + 1, 3 * V + 2, std::int64_t{1000}}) {
      if (n < 1) continue;
      const auto N = static_cast<std::size_t>(n);
      const auto O = static_cast<std::size_t>(off);
      const std::string at = " at offset " + std::to_string(off) + ", n " + std::to_string(n);
      auto x = ft::random_typed<T>(N + O, ++seed, -4.0f, 4.0f);
      const auto y = ft::random_typed<T>(N + O, ++seed);
      Dev<T> dx(e, x), dy(e, y), dr(e, std::vector<T>(N + O));
      std::vector<T> r(N + O);
      fw::cuda::residual_forward(e.dev, dr.p() + off, dx.p() + off, dy.p() + off, n);
      fw::host::residual_forward(e.host, r.data() + off, x.data() + off, y.data() + off, n);
      expect_match(dr.get(e, N + O), r, 0.0, "residual_forward" + at);
      fw::cuda::gelu_forward(e.dev, dr.p() + off, dx.p() + off, n);
      fw::host::gelu_forward(e.host, r.data() + off, x.data() + off, n);
      expect_match(dr.get(e, N + O), r, 2e-6, "gelu_forward" + at);
      fw::cuda::gelu_backward(e.dev, dr.p() + off, dx.p() + off, dy.p() + off, n);
      fw::host::gelu_backward(e.host, r.data() + off, x.data() + off, y.data() + off, n);
      expect_match(dr.get(e, N + O), r, 4e-6, "gelu_backward" + at);
      fw::cuda::scale(e.dev, dx.p() + off, n, 0.3f);
      fw::host::scale(e.host, x.data() + off, n, 0.3f);
      expect_match(dx.get(e, N + O), x, 0.0, "scale" + at);
      const std::int64_t cols = n % 3 == 0 ? 3 : 1;
      const auto bias = ft::random_typed<T>(static_cast<std::size_t>(cols), ++seed);
      Dev<T> db(e, bias);
      fw::cuda::bias_add(e.dev, dx.p() + off, db.p(), n / cols, cols);
      fw::host::bias_add(e.host, x.data() + off, bias.data(), n / cols, cols);
      expect_match(dx.get(e, N + O), x, 0.0, "bias_add" + at);
    }
  }
}

// Column sums split their rows into fixed slices of 512 (full occupancy) and add the slices in
// order: a tall sum gives bitwise the same result twice and the host's within fp32 rounding.
TYPED_TEST(CudaKernels, ColumnSumsAreDeterministicAtFullOccupancy) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{8195, 773}, {513, 33}}) {
    const auto N = static_cast<std::size_t>(rows * cols);
    const auto C = static_cast<std::size_t>(cols);
    const auto dy = ft::random_typed<T>(N, 300);
    const auto dbias0 = ft::random_typed<T>(C, 301);
    Dev<T> ddy(e, dy), d1(e, dbias0), d2(e, dbias0);
    fw::cuda::bias_backward(e.dev, d1.p(), ddy.p(), rows, cols);
    fw::cuda::bias_backward(e.dev, d2.p(), ddy.p(), rows, cols);
    const auto first = d1.get(e, C), second = d2.get(e, C);
    for (std::size_t c = 0; c < C; ++c) ASSERT_EQ(first[c], second[c]) << "column " << c;
    auto dbias = dbias0;
    fw::host::bias_backward(e.host, dbias.data(), dy.data(), rows, cols);
    expect_match(first, dbias, static_cast<double>(rows) * 0x1p-22,
                 "bias_backward over " + std::to_string(rows) + " rows");
  }
}

TYPED_TEST(CudaKernels, InfNanAndSumSquaresWithCub) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  for (std::int64_t n : {1, 7, 1023, 1 << 20}) {
    auto p = ft::random_typed<T>(static_cast<std::size_t>(n), 7, -3.0f, 3.0f);
    Dev<T> dp(e, p);
    EXPECT_FALSE(fw::cuda::has_inf_nan(e.dev, dp.p(), n));
    // double accumulation on both sides, different order: 1e-12 relative
    const double want = fw::host::sum_squares(e.host, p.data(), n);
    EXPECT_NEAR(fw::cuda::sum_squares(e.dev, dp.p(), n), want, 1e-12 * want);
    p[static_cast<std::size_t>(n - 1)] = fw::convert<T>(std::nanf(""));
    Dev<T> dq(e, p);
    EXPECT_TRUE(fw::cuda::has_inf_nan(e.dev, dq.p(), n));
    p[static_cast<std::size_t>(n - 1)] = fw::convert<T>(-INFINITY);
    Dev<T> dr(e, p);
    EXPECT_TRUE(fw::cuda::has_inf_nan(e.dev, dr.p(), n));
  }
}

// The multi-tensor Σx² (several launches of at most 64 tensors, partials summed by one block) and
// the scaled sum, into device accumulators that already hold a value, against the host twins;
// neither synchronises (the context's count is unchanged until the read-back).
TYPED_TEST(CudaKernels, SumSquaresIntoAndSumIntoMatchTheHostTwins) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  std::vector<std::vector<T>> host;
  std::vector<Dev<T>> dev;
  std::vector<std::span<const T>> hl, dl;
  for (int i = 0; i < 150; ++i) {  // three launches
    const std::int64_t n = i == 7 ? 0 : (i * 977) % 20000 + (i == 3 ? (1 << 20) : 1);
    host.push_back(ft::random_typed<T>(static_cast<std::size_t>(n), 100 + i, -3.0f, 3.0f));
  }
  dev.reserve(host.size());
  for (const auto& h : host) {
    dev.emplace_back(e, h);
    hl.emplace_back(h.data(), h.size());
    dl.emplace_back(dev.back().p(), h.size());
  }
  double want = 1.5;
  fw::host::sum_squares_into(e.host, &want, hl);
  const std::vector<double> init = {1.5, -2.0};
  Dev<double> acc(e, init);
  const auto x = ft::random_typed<float>(70001, 9, -2.0f, 4.0f);
  Dev<float> dx(e, x);
  e.dev.synchronize();
  const auto before = e.dev.syncs();
  fw::cuda::sum_squares_into(e.dev, acc.p(), dl);
  fw::cuda::sum_into(e.dev, acc.p() + 1, dx.p(), 70001, 0.25);
  EXPECT_EQ(e.dev.syncs(), before);
  double want_sum = -2.0;
  fw::host::sum_into(e.host, &want_sum, x.data(), 70001, 0.25);
  const auto got = acc.get(e, 2);
  EXPECT_NEAR(got[0], want, 1e-12 * want);
  EXPECT_NEAR(got[1], want_sum, 1e-12 * std::abs(want_sum));
}

// The fused residual + LayerNorm against its host twin (GPT-2's width among the shapes).
TYPED_TEST(CudaKernels, ResidualLayerNormMatchesHost) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  const std::int64_t shapes[][2] = {{1, 8}, {7, 13}, {127, 768}, {1023, 48}};
  std::uint32_t seed = 700;
  for (const auto& s : shapes) {
    const std::int64_t rows = s[0], C = s[1];
    const auto N = static_cast<std::size_t>(rows * C), R = static_cast<std::size_t>(rows);
    const auto a = ft::random_typed<T>(N, ++seed, -2.0f, 3.0f);
    const auto b = ft::random_typed<T>(N, ++seed, -1.0f, 1.0f);
    const auto w = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed, 0.5f, 1.5f);
    const auto bias = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    std::vector<T> r(N), out(N);
    std::vector<float> mean(R), rstd(R);
    Dev<T> da(e, a), db(e, b), dw(e, w), dbias(e, bias), dr(e, r), dout(e, out);
    Dev<float> dmean(e, mean), drstd(e, rstd);
    fw::cuda::residual_layernorm_forward(e.dev, dr.p(), dout.p(), dmean.p(), drstd.p(), da.p(),
                                         db.p(), dw.p(), dbias.p(), rows, C, 1e-5f);
    fw::host::residual_layernorm_forward(e.host, r.data(), out.data(), mean.data(), rstd.data(),
                                         a.data(), b.data(), w.data(), bias.data(), rows, C, 1e-5f);
    expect_match(dr.get(e, N), r, 0.0, "residual");
    expect_match(dout.get(e, N), out, 1e-5, "residual layernorm out");
    ft::expect_close(ft::to_double(drstd.get(e, R)), ft::to_double(rstd), 1e-6, 1e-5,
                     "residual layernorm rstd");
  }
}

TYPED_TEST(CudaKernels, LayerNormAndSoftmax) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  const std::int64_t shapes[][2] = {{1, 8}, {7, 13}, {127, 768}, {1023, 48}};
  std::uint32_t seed = 200;
  for (const auto& s : shapes) {
    const std::int64_t rows = s[0], C = s[1];
    const auto N = static_cast<std::size_t>(rows * C), R = static_cast<std::size_t>(rows);
    const auto in = ft::random_typed<T>(N, ++seed, -2.0f, 3.0f);
    const auto w = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed, 0.5f, 1.5f);
    const auto b = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    const auto dy = ft::random_typed<T>(N, ++seed);
    auto dw = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    auto db = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    std::vector<T> out(N), din(N);
    std::vector<float> mean(R), rstd(R);
    Dev<T> di(e, in), dwt(e, w), dbs(e, b), ddy(e, dy), ddw(e, dw), ddb(e, db), dout(e, out),
        ddin(e, din);
    Dev<float> dmean(e, mean), drstd(e, rstd);
    fw::cuda::layernorm_forward(e.dev, dout.p(), dmean.p(), drstd.p(), di.p(), dwt.p(), dbs.p(),
                                rows, C, 1e-5f);
    fw::host::layernorm_forward(e.host, out.data(), mean.data(), rstd.data(), in.data(), w.data(),
                                b.data(), rows, C, 1e-5f);
    expect_match(dout.get(e, N), out, 1e-5, "layernorm out");
    ft::expect_close(ft::to_double(dmean.get(e, R)), ft::to_double(mean), 1e-6, 1e-5,
                     "layernorm mean");
    ft::expect_close(ft::to_double(drstd.get(e, R)), ft::to_double(rstd), 1e-6, 1e-5,
                     "layernorm rstd");
    fw::cuda::layernorm_backward(e.dev, ddin.p(), ddw.p(), ddb.p(), ddy.p(), di.p(), dwt.p(),
                                 dmean.p(), drstd.p(), rows, C);
    fw::host::layernorm_backward(e.host, din.data(), dw.data(), db.data(), dy.data(), in.data(),
                                 w.data(), mean.data(), rstd.data(), rows, C);
    expect_match(ddin.get(e, N), din, 1e-4, "layernorm din");
    expect_match(ddw.get(e, dw.size()), dw, static_cast<double>(rows) * 0x1p-20,
                 "layernorm dweight");
    expect_match(ddb.get(e, db.size()), db, static_cast<double>(rows) * 0x1p-20, "layernorm dbias");
    // with the residual branch's gradient added in the same pass (the host adds it after
    // rounding din: within a unit of T of the sum, |din + dy| < ~10)
    const auto dres = ft::random_typed<T>(N, ++seed);
    Dev<T> ddres(e, dres), ddin2(e, din);
    std::vector<T> din2(N);
    fw::cuda::layernorm_backward(e.dev, ddin2.p(), ddw.p(), ddb.p(), ddy.p(), di.p(), dwt.p(),
                                 dmean.p(), drstd.p(), rows, C, ddres.p());
    fw::host::layernorm_backward(e.host, din2.data(), dw.data(), db.data(), dy.data(), in.data(),
                                 w.data(), mean.data(), rstd.data(), rows, C, dres.data());
    expect_match(ddin2.get(e, N), din2, 1e-4 + 20.0 * ft::unit_roundoff<T>(),
                 "layernorm din + residual gradient");

    std::vector<T> sm(N), dsm(N);
    Dev<T> dsmo(e, sm), ddsm(e, dsm);
    fw::cuda::softmax_forward(e.dev, dsmo.p(), di.p(), rows, C);
    fw::host::softmax_forward(e.host, sm.data(), in.data(), rows, C);
    expect_match(dsmo.get(e, N), sm, 1e-7, "softmax_forward");
    fw::cuda::softmax_backward(e.dev, ddsm.p(), dsmo.p(), ddy.p(), rows, C);
    fw::host::softmax_backward(e.host, dsm.data(), sm.data(), dy.data(), rows, C);
    expect_match(ddsm.get(e, N), dsm, 1e-6, "softmax_backward");
  }
}

TYPED_TEST(CudaKernels, Attention) {
  FW_REQUIRE_GPU();
  using E = TypeParam;
  Env e;
  const std::int64_t shapes[][4] = {{1, 1, 4, 1}, {2, 7, 12, 3}, {1, 127, 64, 4}, {4, 64, 96, 2}};
  std::uint32_t seed = 300;
  for (const auto& s : shapes) {
    const std::int64_t B = s[0], T = s[1], C = s[2], NH = s[3];
    const auto nqkv = static_cast<std::size_t>(B * T * 3 * C),
               nout = static_cast<std::size_t>(B * T * C),
               natt = static_cast<std::size_t>(B * NH * T * T);
    const auto qkv = ft::random_typed<E>(nqkv, ++seed, -1.5f, 1.5f);
    const auto dy = ft::random_typed<E>(nout, ++seed);
    std::vector<E> out(nout), att(natt), dqkv(nqkv), datt(natt);
    Dev<E> dq(e, qkv), ddy(e, dy), dout(e, out), datt_d(e, att), ddq(e, dqkv), dscratch(e, datt);
    fw::cuda::attention_forward(e.dev, dout.p(), datt_d.p(), dq.p(), B, T, C, NH);
    fw::host::attention_forward(e.host, out.data(), att.data(), qkv.data(), B, T, C, NH);
    // the scores round to E before the softmax on both sides; a flip of one rounding there moves
    // a probability by ~u * |score|: 16-bit atol scaled by the score size (~2 sqrt(hs))
    const double hs = static_cast<double>(C / NH);
    const double atol =
        std::is_same_v<E, float> ? 1e-5 : 8 * ft::unit_roundoff<E>() * std::sqrt(hs);
    expect_match(datt_d.get(e, natt), att, atol, "attention att");
    expect_match(dout.get(e, nout), out, atol, "attention out");
    fw::cuda::attention_backward(e.dev, ddq.p(), dscratch.p(), ddy.p(), dq.p(), datt_d.p(), B, T, C,
                                 NH);
    fw::host::attention_backward(e.host, dqkv.data(), datt.data(), dy.data(), qkv.data(),
                                 att.data(), B, T, C, NH);
    // each side is within ~0.5 u sqrt(hs) x scale of the exact gradient (host test): 4x the sum
    const double g_scale = std::max(1.0, ft::max_abs(ft::to_double(dqkv)));
    const double g_tol = std::is_same_v<E, float>
                             ? 1e-5 * std::sqrt(static_cast<double>(T))
                             : 4 * ft::unit_roundoff<E>() * std::sqrt(hs) * g_scale;
    expect_match(ddq.get(e, nqkv), dqkv, g_tol, "attention dqkv");
  }
}

// The device attention paths against the host twin (pinned to the definition by
// flash_attention_test.cpp): the tiled kernels, and the blockwise path the layers run with its
// default plan (one block up to T = 256, the whole batch in each launch), with 16-row blocks
// (many blocks, a partial last one), and with a score budget of one sequence's block (groups of
// one sequence: every group offset); partial tiles, one token, a head size of 1 and of 128
// (shared memory past 48 KiB), and T = 300 (two default blocks).
// Tolerances: the tiled kernels are fp32 inside and round once, so they differ from the host by
// summation order and expf vs the host polynomial: fp32 ~1e-5, 16-bit a flip of the last
// rounding. The blockwise path also rounds P and dS to a 16-bit E before their products (the
// host twin keeps them fp32): each product term moves by at most u relative, independently, so
// an output moves by ~u · 0.6 · sqrt(Σ P²) · |v| ≤ 0.5 u (4u is eight of those), a gradient by
// ~0.3 u from dS and ~0.5 u from P at these inputs (8u · scale); in fp32 it rounds nothing.
enum class AttentionPath { tiled, blockwise, blockwise16, grouped, fused };
constexpr std::pair<AttentionPath, const char*> attention_path_names[] = {
    {AttentionPath::tiled, "tiled"},
    {AttentionPath::blockwise, "blockwise"},
    {AttentionPath::blockwise16, "blockwise16"},
    {AttentionPath::grouped, "grouped"},
    {AttentionPath::fused, "fused"}};

const char* attention_path_name(AttentionPath path) {
  for (const auto& [p, name] : attention_path_names) {
    if (p == path) return name;
  }
  return "?";
}

// The paths the attention test runs: all five, or those FOURWAY_TEST_ATTENTION_PATHS names
// (comma-separated). scripts/device-check.sh sets it to `tiled,fused` for racecheck alone:
// racecheck looks for shared-memory hazards, the tiled and fused kernels are the attention's
// users of shared memory (the blockwise paths are cuBLAS and warp-shuffle element kernels), and
// cuBLAS under racecheck outlasts the step's limit. The plain run and memcheck run all five.
std::vector<AttentionPath> attention_paths_under_test() {
  const char* only = std::getenv("FOURWAY_TEST_ATTENTION_PATHS");
  std::vector<AttentionPath> paths;
  if (only == nullptr || *only == '\0') {
    for (const auto& [p, name] : attention_path_names) paths.push_back(p);
    return paths;
  }
  std::string list = only;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string item = list.substr(at, comma - at);
    bool known = false;
    for (const auto& [p, name] : attention_path_names) {
      if (item == name) {
        paths.push_back(p);
        known = true;
      }
    }
    if (!known) {
      ADD_FAILURE() << "FOURWAY_TEST_ATTENTION_PATHS='" << only << "': unknown path '" << item
                    << "' (tiled, blockwise, blockwise16, grouped, fused; unset: every path)";
    }
    at = comma + 1;
  }
  return paths;
}

template <class E>
void device_attention_forward(AttentionPath path, const fw::Context<fw::Cuda>& c, E* out,
                              float* lse, const E* qkv, std::int64_t B, std::int64_t T,
                              std::int64_t C, std::int64_t NH) {
  if (path == AttentionPath::tiled) {
    fw::cuda::tiled_flash_attention_forward(c, out, lse, qkv, B, T, C, NH);
  } else if (path == AttentionPath::fused) {
    if constexpr (fw::cuda::detail::fused_element<E>) {
      fw::cuda::fused_attention_forward(c, out, lse, qkv, B, T, C, NH);
    } else {
      ADD_FAILURE() << "the fused attention runs in bf16 or fp16 only";
    }
  } else if (path == AttentionPath::blockwise) {
    fw::cuda::flash_attention_forward(c, out, lse, qkv, B, T, C, NH);  // the layers' entry
  } else if (path == AttentionPath::blockwise16) {
    fw::cuda::blockwise_attention_forward(c, out, lse, qkv, B, T, C, NH, 16);
  } else {
    fw::cuda::blockwise_attention_forward(c, out, lse, qkv, B, T, C, NH, 16,
                                          NH * T * std::min<std::int64_t>(16, T));
  }
}
template <class E>
void device_attention_backward(AttentionPath path, const fw::Context<fw::Cuda>& c, E* dqkv,
                               float* delta, const E* dy, const E* qkv, const E* out,
                               const float* lse, std::int64_t B, std::int64_t T, std::int64_t C,
                               std::int64_t NH) {
  if (path == AttentionPath::tiled) {
    fw::cuda::tiled_flash_attention_backward(c, dqkv, delta, dy, qkv, out, lse, B, T, C, NH);
  } else if (path == AttentionPath::fused) {
    if constexpr (fw::cuda::detail::fused_element<E>) {
      fw::cuda::fused_attention_backward(c, dqkv, delta, dy, qkv, out, lse, B, T, C, NH);
    } else {
      ADD_FAILURE() << "the fused attention runs in bf16 or fp16 only";
    }
  } else if (path == AttentionPath::blockwise) {
    fw::cuda::flash_attention_backward(c, dqkv, delta, dy, qkv, out, lse, B, T, C, NH);
  } else if (path == AttentionPath::blockwise16) {
    fw::cuda::blockwise_attention_backward(c, dqkv, delta, dy, qkv, out, lse, B, T, C, NH, 16);
  } else {
    fw::cuda::blockwise_attention_backward(c, dqkv, delta, dy, qkv, out, lse, B, T, C, NH, 16,
                                           NH * T * std::min<std::int64_t>(16, T));
  }
}

TYPED_TEST(CudaKernels, FlashAttentionMatchesItsHostTwin) {
  FW_REQUIRE_GPU();
  using E = TypeParam;
  Env e;
  const std::int64_t shapes[][4] = {{1, 1, 4, 1},    {2, 7, 12, 3},   {1, 65, 3, 3},
                                    {3, 100, 64, 2}, {1, 70, 256, 2}, {2, 300, 48, 3},
                                    {2, 130, 128, 2}};
  std::uint32_t seed = 900;
  const bool fp32 = std::is_same_v<E, float>;
  int fused_shapes = 0;
  for (AttentionPath path : attention_paths_under_test()) {
    const std::string name = std::string(attention_path_name(path)) + " ";
    const double u = ft::unit_roundoff<E>();
    const bool rounds_p = !fp32 && path != AttentionPath::tiled;
    for (const auto& s : shapes) {
      const std::int64_t B = s[0], T = s[1], C = s[2], NH = s[3];
      const auto nqkv = static_cast<std::size_t>(B * T * 3 * C),
                 nout = static_cast<std::size_t>(B * T * C),
                 nrow = static_cast<std::size_t>(B * NH * T);
      // the fused kernels take 16-bit types and head sizes 16, 32, 64, 128 (four of the shapes)
      if (path == AttentionPath::fused) {
        const std::int64_t hs = C / NH;
        const bool takes = !fp32 && (hs == 16 || hs == 32 || hs == 64 || hs == 128);
        EXPECT_EQ(fw::cuda::fused_attention_supports<E>(e.dev, B, T, C, NH), takes)
            << "C=" << C << " NH=" << NH;
        if (!takes) continue;
        ++fused_shapes;
      }
      const auto qkv = ft::random_typed<E>(nqkv, ++seed, -1.5f, 1.5f);
      const auto dy = ft::random_typed<E>(nout, ++seed);
      std::vector<E> out(nout), dqkv(nqkv);
      std::vector<float> lse(nrow), delta(nrow);
      fw::host::flash_attention_forward(e.host, out.data(), lse.data(), qkv.data(), B, T, C, NH);
      fw::host::flash_attention_backward(e.host, dqkv.data(), delta.data(), dy.data(), qkv.data(),
                                         out.data(), lse.data(), B, T, C, NH);
      Dev<E> dq(e, qkv), ddy(e, dy), dout(e, out), ddq(e, dqkv);
      Dev<float> dlse(e, lse), ddelta(e, delta);
      device_attention_forward(path, e.dev, dout.p(), dlse.p(), dq.p(), B, T, C, NH);
      const double atol = fp32 ? 1e-5 : (rounds_p ? 4 : 2) * u;
      expect_match(dout.get(e, nout), out, atol, name + "out");
      ft::expect_close(ft::to_double(dlse.get(e, nrow)), ft::to_double(lse), 1e-5, 1e-6,
                       name + "lse");
      // the backward reads the device's own out and lse, as a training step does
      device_attention_backward(path, e.dev, ddq.p(), ddelta.p(), ddy.p(), dq.p(), dout.p(),
                                dlse.p(), B, T, C, NH);
      const double g_scale = std::max(1.0, ft::max_abs(ft::to_double(dqkv)));
      expect_match(ddq.get(e, nqkv), dqkv, (fp32 ? 2e-5 : (rounds_p ? 8 : 4) * u) * g_scale,
                   name + "dqkv");
    }
  }
  const auto paths = attention_paths_under_test();
  if (!fp32 && std::find(paths.begin(), paths.end(), AttentionPath::fused) != paths.end()) {
    EXPECT_EQ(fused_shapes, 4) << "the fused path ran on too few shapes";
  }
}

// What the fused attention refuses, and why, asked without a device (no context): the layers
// fall back to the blockwise path on each of these, and fused_attention_forward names the reason.
TEST(FusedAttention, RefusalsNameTheirReason) {
  namespace d = fw::cuda::detail;
  alignas(16) static fw::bf16 buf[16];
  const fw::bf16* ok = buf;
  const fw::bf16* off = buf + 1;  // 2 bytes past a 16-byte boundary
  const auto why = [](const d::FusedRefusal& r) { return r.empty() ? "(taken)" : r.text(); };
  EXPECT_EQ(why(d::fused_refusal<fw::bf16>(nullptr, 8, 1024, 768, 12, ok)), "(taken)");
  EXPECT_EQ(why(d::fused_refusal<fw::fp16>(nullptr, 1, 70, 256, 2)), "(taken)");
  for (const std::int64_t hs : {16, 32, 64, 128}) {
    EXPECT_EQ(why(d::fused_refusal<fw::bf16>(nullptr, 2, 100, 3 * hs, 3, ok)), "(taken)") << hs;
  }
  EXPECT_NE(why(d::fused_refusal<float>(nullptr, 8, 1024, 768, 12)).find("bf16 or fp16"),
            std::string::npos);
  EXPECT_NE(why(d::fused_refusal<fw::bf16>(nullptr, 8, 1024, 960, 12)).find("head size"),
            std::string::npos);  // hs 80
  EXPECT_NE(why(d::fused_refusal<fw::bf16>(nullptr, 8, 1024, 768, 5)).find("multiple of NH"),
            std::string::npos);
  EXPECT_NE(why(d::fused_refusal<fw::bf16>(nullptr, 8, 1024, 768, 12, ok, off)).find("16-byte"),
            std::string::npos);
  EXPECT_NE(why(d::fused_refusal<fw::bf16>(nullptr, 5462, 64, 768, 12)).find("65535"),
            std::string::npos);  // 5462 * 12 = 65544
  EXPECT_NE(
      why(d::fused_refusal<fw::bf16>(nullptr, 1, std::int64_t{1} << 20, 1024, 16)).find("32 bits"),
      std::string::npos);  // T * 3C = 3 * 2^30
}

// The shared memory a block must opt in to, against what GPUs allow (CUDA's programming guide:
// 163 KiB = 166912 bytes at compute capability 8.0, 99 KiB = 101376 at 8.6 and 8.9, 227 KiB at
// 9.0). The need is the dK/dV kernel's: four 16-bit tiles of 64 rows (hs + 8 apart), two fp32
// regions of 4 warps x 16 rows (max(hs, 64) + 4 apart), two 16-bit ones (72 apart) and two rows
// of 64 floats, each rounded up to 128 bytes — by hand: hs 16 66048, hs 32 74240, hs 64 90624,
// hs 128 156160.
TEST(FusedAttention, SharedMemoryRefusalNamesBothSizes) {
  namespace d = fw::cuda::detail;
  const std::pair<std::int64_t, std::int64_t> need[] = {
      {16, 66048}, {32, 74240}, {64, 90624}, {128, 156160}};
  for (const auto& [hs, bytes] : need) {
    EXPECT_EQ(d::fused_shared_refusal<fw::bf16>(hs, bytes).text(), "") << hs;
    EXPECT_EQ(d::fused_shared_refusal<fw::fp16>(hs, bytes).text(), "") << hs;
    const std::string why = d::fused_shared_refusal<fw::bf16>(hs, bytes - 1).text();
    EXPECT_NE(why.find(std::to_string(bytes) + " bytes"), std::string::npos) << why;
    EXPECT_NE(why.find("allows " + std::to_string(bytes - 1)), std::string::npos) << why;
    EXPECT_NE(why.find("head size " + std::to_string(hs)), std::string::npos) << why;
  }
  EXPECT_EQ(d::fused_shared_refusal<fw::bf16>(64, 101376).text(),
            "");  // GPT-2's heads on an L4 / A10
  EXPECT_NE(d::fused_shared_refusal<fw::bf16>(128, 101376).text(), "");  // Llama's there: blockwise
  EXPECT_EQ(d::fused_shared_refusal<fw::bf16>(128, 166912).text(), "");  // an A100
}

TYPED_TEST(CudaKernels, CrossEntropyAndVocabPieces) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  const std::int64_t shapes[][2] = {{1, 2}, {7, 13}, {127, 1001}, {64, 50257}};
  std::uint32_t seed = 400;
  for (const auto& s : shapes) {
    const std::int64_t rows = s[0], V = s[1];
    const auto N = static_cast<std::size_t>(rows * V), R = static_cast<std::size_t>(rows);
    const auto logits = ft::random_typed<T>(N, ++seed, -6.0f, 6.0f);
    const auto tgt = random_ids(R, V, ++seed);
    Dev<T> dl(e, logits);
    Dev<std::int32_t> dt(e, tgt);
    std::vector<float> loss(R);
    Dev<float> dloss(e, loss);
    fw::cuda::cross_entropy_forward(e.dev, dloss.p(), dl.p(), dt.p(), rows, V);
    fw::host::cross_entropy_forward(e.host, loss.data(), logits.data(), tgt.data(), rows, V);
    ft::expect_close(ft::to_double(dloss.get(e, R)), ft::to_double(loss), 1e-5, 1e-5,
                     "cross_entropy_forward");
    std::vector<T> g(N);
    fw::host::cross_entropy_backward(e.host, g.data(), logits.data(), tgt.data(), rows, V, 0.5f);
    Dev<T> dg(e, logits);  // in place on a copy of the logits
    fw::cuda::cross_entropy_backward(e.dev, dg.p(), dg.p(), dt.p(), rows, V, 0.5f);
    expect_match(dg.get(e, N), g, 1e-8 + ft::subnormal_step<T>(), "cross_entropy_backward");

    // rows padded to a multiple of 128 columns (16-byte aligned rows: the packed reads and
    // writes), the padding holding 50s that must be masked; the host on the same layout
    const std::int64_t ld = (V + 127) / 128 * 128;
    const auto Np = static_cast<std::size_t>(rows * ld);
    std::vector<T> padded(Np, fw::convert<T>(50.0f));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < V; ++c) padded[r * ld + c] = logits[r * V + c];
    }
    Dev<T> dpad(e, padded);
    std::vector<float> ploss(R);
    Dev<float> dploss(e, ploss);
    fw::cuda::cross_entropy_forward(e.dev, dploss.p(), dpad.p(), dt.p(), rows, V, ld);
    fw::host::cross_entropy_forward(e.host, ploss.data(), padded.data(), tgt.data(), rows, V, ld);
    ft::expect_close(ft::to_double(dploss.get(e, R)), ft::to_double(ploss), 1e-5, 1e-5,
                     "cross_entropy_forward (padded)");
    std::vector<T> pg(Np);
    fw::host::cross_entropy_backward(e.host, pg.data(), padded.data(), tgt.data(), rows, V, 0.5f,
                                     ld);
    fw::cuda::cross_entropy_backward(e.dev, dpad.p(), dpad.p(), dt.p(), rows, V, 0.5f, ld);
    expect_match(dpad.get(e, Np), pg, 1e-8 + ft::subnormal_step<T>(),
                 "cross_entropy_backward (padded)");

    // one shard [start, start + vl) of the vocabulary
    const std::int64_t start = V / 3, vl = V - V / 3;
    std::vector<T> shard(R * static_cast<std::size_t>(vl));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < vl; ++c) shard[r * vl + c] = logits[r * V + start + c];
    }
    Dev<T> ds(e, shard);
    std::vector<float> mx(R), se(R), tl(R), ls(R);
    Dev<float> dmx(e, mx), dse(e, se), dtl(e, tl), dls(e, ls);
    fw::cuda::vocab_local_max(e.dev, dmx.p(), ds.p(), rows, vl);
    fw::host::vocab_local_max(e.host, mx.data(), shard.data(), rows, vl);
    ft::expect_close(ft::to_double(dmx.get(e, R)), ft::to_double(mx), 0.0, 0.0,
                     "vocab_local_max");  // exact
    fw::cuda::vocab_local_sumexp(e.dev, dse.p(), ds.p(), dmx.p(), rows, vl);
    fw::host::vocab_local_sumexp(e.host, se.data(), shard.data(), mx.data(), rows, vl);
    ft::expect_close(ft::to_double(dse.get(e, R)), ft::to_double(se), 0.0, 1e-5,
                     "vocab_local_sumexp");
    fw::cuda::vocab_target_logit(e.dev, dtl.p(), ds.p(), dt.p(), rows, vl, start);
    fw::host::vocab_target_logit(e.host, tl.data(), shard.data(), tgt.data(), rows, vl, start);
    ft::expect_close(ft::to_double(dtl.get(e, R)), ft::to_double(tl), 0.0, 0.0,
                     "vocab_target_logit");
    fw::cuda::vocab_loss(e.dev, dls.p(), dmx.p(), dse.p(), dtl.p(), rows);
    fw::host::vocab_loss(e.host, ls.data(), mx.data(), se.data(), tl.data(), rows);
    ft::expect_close(ft::to_double(dls.get(e, R)), ft::to_double(ls), 1e-5, 1e-5, "vocab_loss");
    std::vector<T> lg(shard.size());
    Dev<T> dlg(e, lg);
    fw::cuda::vocab_local_grad(e.dev, dlg.p(), ds.p(), dt.p(), dmx.p(), dse.p(), rows, vl, start,
                               0.5f);
    fw::host::vocab_local_grad(e.host, lg.data(), shard.data(), tgt.data(), mx.data(), se.data(),
                               rows, vl, start, 0.5f);
    expect_match(dlg.get(e, lg.size()), lg, 1e-8 + ft::subnormal_step<T>(), "vocab_local_grad");
  }
}

TYPED_TEST(CudaKernels, EmbeddingMatchesHost) {
  FW_REQUIRE_GPU();
  using E = TypeParam;
  Env e;
  const std::int64_t shapes[][5] = {
      {1, 1, 1, 1, 1}, {2, 7, 5, 11, 9}, {4, 127, 64, 50, 128}, {8, 64, 768, 1000, 64}};
  std::uint32_t seed = 500;
  for (const auto& s : shapes) {
    const std::int64_t B = s[0], T = s[1], C = s[2], V = s[3], maxT = s[4];
    const auto wte = ft::random_typed<E>(static_cast<std::size_t>(V * C), ++seed);
    const auto wpe = ft::random_typed<E>(static_cast<std::size_t>(maxT * C), ++seed);
    const auto tok = random_ids(static_cast<std::size_t>(B * T), V, ++seed);
    const auto dy = ft::random_typed<E>(static_cast<std::size_t>(B * T * C), ++seed);
    auto dwte = ft::random_typed<E>(wte.size(), ++seed);
    auto dwpe = ft::random_typed<E>(wpe.size(), ++seed);
    std::vector<E> out(dy.size());
    Dev<E> d_wte(e, wte), d_wpe(e, wpe), d_dy(e, dy), d_dwte(e, dwte), d_dwpe(e, dwpe),
        d_out(e, out);
    Dev<std::int32_t> d_tok(e, tok);
    fw::cuda::embedding_forward(e.dev, d_out.p(), d_tok.p(), d_wte.p(), d_wpe.p(), B, T, C);
    fw::host::embedding_forward(e.host, out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    expect_match(d_out.get(e, out.size()), out, 0.0, "embedding_forward");
    fw::cuda::embedding_backward(e.dev, d_dwte.p(), d_dwpe.p(), d_dy.p(), d_tok.p(), B, T, C);
    fw::host::embedding_backward(e.host, dwte.data(), dwpe.data(), dy.data(), tok.data(), B, T, C);
    // same buckets, same fp32 order for dwte: bitwise equal; dwpe sums B rows in order too
    const auto got_te = d_dwte.get(e, dwte.size());
    const auto got_pe = d_dwpe.get(e, dwpe.size());
    for (std::size_t i = 0; i < dwte.size(); ++i) ASSERT_EQ(got_te[i], dwte[i]) << "dwte at " << i;
    for (std::size_t i = 0; i < dwpe.size(); ++i) ASSERT_EQ(got_pe[i], dwpe[i]) << "dwpe at " << i;
  }
}

// Token ids outside the vocabulary: the device kernel reads nothing for them, writes zero rows
// and records the first bad position, exactly as the host twin of the checked forward.
TYPED_TEST(CudaKernels, CheckedEmbeddingFlagsTheFirstBadIdLikeTheHost) {
  FW_REQUIRE_GPU();
  using E = TypeParam;
  Env e;
  const std::int64_t B = 3, T = 5, C = 7, V = 11;
  const auto wte = ft::random_typed<E>(static_cast<std::size_t>(V * C), 901);
  const auto wpe = ft::random_typed<E>(static_cast<std::size_t>(T * C), 902);
  auto tok = random_ids(static_cast<std::size_t>(B * T), V, 903);
  tok[12] = static_cast<std::int32_t>(V);  // later bad ids must not win
  tok[6] = -3;
  tok[9] = 1 << 30;
  std::vector<E> out(static_cast<std::size_t>(B * T * C));
  Dev<E> d_wte(e, wte), d_wpe(e, wpe), d_out(e, out);
  Dev<std::int32_t> d_tok(e, tok);
  std::vector<std::int64_t> flag{fw::TokenGuard::none};
  Dev<std::int64_t> d_flag(e, flag);
  fw::cuda::embedding_forward(e.dev, d_out.p(), d_tok.p(), d_wte.p(), d_wpe.p(), B, T, C,
                              fw::TokenGuard{V, d_flag.p()});
  std::int64_t host_flag = fw::TokenGuard::none;
  fw::host::embedding_forward(e.host, out.data(), tok.data(), wte.data(), wpe.data(), B, T, C,
                              fw::TokenGuard{V, &host_flag});
  EXPECT_EQ(host_flag, 6);
  EXPECT_EQ(d_flag.get(e, 1)[0], 6);
  expect_match(d_out.get(e, out.size()), out, 0.0, "checked embedding_forward");
}

// The vocabulary-parallel lookup and scatter-add (TP) on a shard [start, start + Vlocal) of the
// vocabulary, including an empty shard: bitwise equal to the host (same buckets, same order).
TYPED_TEST(CudaKernels, VocabEmbedMatchesHost) {
  FW_REQUIRE_GPU();
  using E = TypeParam;
  Env e;
  const std::int64_t shapes[][4] = {
      {40, 24, 301, 0}, {40, 24, 301, 152}, {40, 24, 301, 304}, {64, 64, 1000, 990}};
  std::uint32_t seed = 900;
  for (const auto& s : shapes) {
    const std::int64_t rows = s[0], C = s[1], V = s[2], start = s[3];
    const std::int64_t Vlocal = std::min<std::int64_t>(152, std::max<std::int64_t>(V - start, 0));
    const auto wte = ft::random_typed<E>(
        static_cast<std::size_t>(std::max<std::int64_t>(Vlocal, 1) * C), ++seed);
    const auto tok = random_ids(static_cast<std::size_t>(rows), V, ++seed);
    const auto dy = ft::random_typed<E>(static_cast<std::size_t>(rows * C), ++seed);
    auto dwte = ft::random_typed<E>(wte.size(), ++seed);
    std::vector<E> out(dy.size());
    Dev<E> d_wte(e, wte), d_dy(e, dy), d_dwte(e, dwte), d_out(e, out);
    Dev<std::int32_t> d_tok(e, tok);
    fw::cuda::vocab_embed_forward(e.dev, d_out.p(), d_tok.p(), d_wte.p(), rows, C, start, Vlocal);
    fw::host::vocab_embed_forward(e.host, out.data(), tok.data(), wte.data(), rows, C, start,
                                  Vlocal);
    expect_match(d_out.get(e, out.size()), out, 0.0, "vocab_embed_forward");
    fw::cuda::vocab_embed_backward(e.dev, d_dwte.p(), d_dy.p(), d_tok.p(), rows, C, start, Vlocal);
    fw::host::vocab_embed_backward(e.host, dwte.data(), dy.data(), tok.data(), rows, C, start,
                                   Vlocal);
    const auto got = d_dwte.get(e, dwte.size());
    for (std::size_t i = 0; i < dwte.size(); ++i) ASSERT_EQ(got[i], dwte[i]) << "dwte at " << i;
  }
}

TYPED_TEST(CudaKernels, AdamWMatchesHost) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  for (std::int64_t n : {1, 7, 1023, 1 << 20}) {
    const auto N = static_cast<std::size_t>(n);
    auto master = ft::random_floats(N, 1);
    std::vector<float> m(N, 0.0f), v(N, 0.0f);
    std::vector<T> working(N);
    Dev<float> dp(e, master), dm(e, m), dv(e, v);
    Dev<T> dw(e, working);
    for (int step = 1; step <= 3; ++step) {
      const auto grad = ft::random_typed<T>(N, 10 + static_cast<std::uint32_t>(step), -2.0f, 2.0f);
      Dev<T> dg(e, grad);
      const fw::AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, step == 2 ? 0.0f : 0.1f, 0.5f, step};
      fw::cuda::adamw_update(e.dev, dp.p(), dm.p(), dv.p(), dw.p(), dg.p(), n, s);
      fw::host::adamw_update(e.host, master.data(), m.data(), v.data(), working.data(), grad.data(),
                             n, s);
    }
    // identical fp32 formula; the device may contract a*b+c into an FMA: a few ulps
    ft::expect_close(ft::to_double(dp.get(e, N)), ft::to_double(master), 1e-7, 1e-6,
                     "adamw master");
    ft::expect_close(ft::to_double(dm.get(e, N)), ft::to_double(m), 1e-7, 1e-6, "adamw m");
    ft::expect_close(ft::to_double(dv.get(e, N)), ft::to_double(v), 1e-7, 1e-6, "adamw v");
    expect_match(dw.get(e, N), working, 1e-7, "adamw working");
  }
}

// The multi-tensor AdamW: 60 tensors (three launches of 24), one of 2^20 elements, one empty,
// every other one without decay, against the host twin.
TYPED_TEST(CudaKernels, AdamWListMatchesHost) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  constexpr int count = 60;
  std::vector<std::vector<float>> master(count), m(count), v(count);
  std::vector<std::vector<T>> working(count), grad(count);
  std::vector<Dev<float>> dp, dm, dv;
  std::vector<Dev<T>> dw, dg;
  dp.reserve(count), dm.reserve(count), dv.reserve(count), dw.reserve(count), dg.reserve(count);
  std::vector<fw::AdamWTensor<T, T>> hl, dl;
  for (int t = 0; t < count; ++t) {
    const auto n = static_cast<std::size_t>(t == 5 ? 0 : t == 9 ? (1 << 20) : (t * 613) % 5000 + 1);
    master[t] = ft::random_floats(n, 70 + static_cast<std::uint32_t>(t));
    m[t].assign(n, 0.0f);
    v[t].assign(n, 0.0f);
    working[t].resize(n);
    grad[t] = ft::random_typed<T>(n, 300 + static_cast<std::uint32_t>(t), -2.0f, 2.0f);
    dp.emplace_back(e, master[t]), dm.emplace_back(e, m[t]), dv.emplace_back(e, v[t]);
    dw.emplace_back(e, working[t]), dg.emplace_back(e, grad[t]);
    const auto nn = static_cast<std::int64_t>(n);
    hl.push_back({master[t].data(), m[t].data(), v[t].data(), working[t].data(), grad[t].data(), nn,
                  t % 2 == 0});
    dl.push_back({dp[t].p(), dm[t].p(), dv[t].p(), dw[t].p(), dg[t].p(), nn, t % 2 == 0});
  }
  for (int step = 1; step <= 2; ++step) {
    const fw::AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, step};
    fw::cuda::adamw_update_list(e.dev, dl, s);
    fw::host::adamw_update_list(e.host, hl, s);
  }
  for (int t = 0; t < count; ++t) {
    const auto N = master[t].size();
    if (N == 0) continue;
    ft::expect_close(ft::to_double(dp[t].get(e, N)), ft::to_double(master[t]), 1e-7, 1e-6,
                     "adamw list master");
    ft::expect_close(ft::to_double(dv[t].get(e, N)), ft::to_double(v[t]), 1e-7, 1e-6,
                     "adamw list v");
    expect_match(dw[t].get(e, N), working[t], 1e-7, "adamw list working");
  }
}

// RMSNorm, RoPE (in place, strided rows, padding past the heads) and SwiGLU against their host
// twins. RMSNorm sums in another order (warp shuffles vs 16 lanes): C·2⁻²⁴-scale differences.
// RoPE: both sides turn by bitwise the same fp32 angles (the CUDA twin takes the host's inverse
// frequencies); device sincosf vs host cos/sin differ by an ulp or two. SwiGLU: expf vs std::exp.
TYPED_TEST(CudaKernels, RmsNormRopeSwiGluMatchHost) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  const std::int64_t shapes[][2] = {{1, 5}, {7, 33}, {127, 257}, {1023, 768}};
  std::uint32_t seed = 900;
  for (const auto& s : shapes) {
    const std::int64_t rows = s[0], C = s[1];
    const auto N = static_cast<std::size_t>(rows * C), R = static_cast<std::size_t>(rows);
    const auto in = ft::random_typed<T>(N, ++seed, -2.0f, 3.0f);
    const auto w = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed, 0.5f, 1.5f);
    const auto dy = ft::random_typed<T>(N, ++seed);
    auto dw = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    std::vector<T> out(N), din(N);
    std::vector<float> rstd(R);
    Dev<T> di(e, in), dwt(e, w), ddy(e, dy), ddw(e, dw), dout(e, out), ddin(e, din);
    Dev<float> drstd(e, rstd);
    fw::cuda::rmsnorm_forward(e.dev, dout.p(), drstd.p(), di.p(), dwt.p(), rows, C, 1e-5f);
    fw::host::rmsnorm_forward(e.host, out.data(), rstd.data(), in.data(), w.data(), rows, C, 1e-5f);
    expect_match(dout.get(e, N), out, 1e-5, "rmsnorm out");
    ft::expect_close(ft::to_double(drstd.get(e, R)), ft::to_double(rstd), 1e-6, 1e-5,
                     "rmsnorm rstd");
    fw::cuda::rmsnorm_backward(e.dev, ddin.p(), ddw.p(), ddy.p(), di.p(), dwt.p(), drstd.p(), rows,
                               C);
    fw::host::rmsnorm_backward(e.host, din.data(), dw.data(), dy.data(), in.data(), w.data(),
                               rstd.data(), rows, C);
    expect_match(ddin.get(e, N), din, 1e-4, "rmsnorm din");
    expect_match(ddw.get(e, dw.size()), dw, static_cast<double>(rows) * 0x1p-20, "rmsnorm dweight");

    // SwiGLU over (rows, 2C) -> (rows, C)
    const auto gu = ft::random_typed<T>(2 * N, ++seed, -6.0f, 6.0f);
    std::vector<T> sw(N), dsw(2 * N);
    Dev<T> dgu(e, gu), dswo(e, sw), ddsw(e, dsw);
    fw::cuda::swiglu_forward(e.dev, dswo.p(), dgu.p(), rows, C);
    fw::host::swiglu_forward(e.host, sw.data(), gu.data(), rows, C);
    expect_match(dswo.get(e, N), sw, 1e-6, "swiglu_forward");
    fw::cuda::swiglu_backward(e.dev, ddsw.p(), ddy.p(), dgu.p(), rows, C);
    fw::host::swiglu_backward(e.host, dsw.data(), dy.data(), gu.data(), rows, C);
    expect_match(ddsw.get(e, 2 * N), dsw, 1e-5, "swiglu_backward");
  }

  // RoPE: (rows, seq, heads, head_size, padding) with seq not dividing rows
  const std::int64_t rope[][5] = {
      {1, 1, 1, 8, 0}, {7, 3, 2, 8, 5}, {127, 50, 3, 64, 17}, {1023, 256, 8, 128, 0}};
  for (const auto& r : rope) {
    const std::int64_t rows = r[0], seq = r[1], heads = r[2], hs = r[3];
    const std::int64_t stride = heads * hs + r[4];
    const auto N = static_cast<std::size_t>(rows * stride);
    auto x = ft::random_typed<T>(N, ++seed, -2.0f, 2.0f);
    Dev<T> dx(e, x);
    fw::cuda::rope_forward(e.dev, dx.p(), rows, seq, stride, heads, hs, 10000.0f);
    fw::host::rope_forward(e.host, x.data(), rows, seq, stride, heads, hs, 10000.0f);
    // |a|, |b| ≤ 2: a few ulps of cos/sin at angles up to seq radians, times 4
    expect_match(dx.get(e, N), x, 1e-5, "rope_forward");
    // the backward from the same input on both sides (the forward's last-ulp differences would
    // otherwise be rotated again: 2-3 ulps in 16 bits, as the first GPU run saw)
    Dev<T> dg(e, x);
    fw::cuda::rope_backward(e.dev, dg.p(), rows, seq, stride, heads, hs, 10000.0f);
    fw::host::rope_backward(e.host, x.data(), rows, seq, stride, heads, hs, 10000.0f);
    expect_match(dg.get(e, N), x, 2e-5, "rope_backward");
  }
  // a context-parallel rank's run of rows: positions from first_position
  {
    const std::int64_t rows = 10, seq = 5, heads = 2, hs = 16, stride = heads * hs, first = 37;
    const auto N = static_cast<std::size_t>(rows * stride);
    auto x = ft::random_typed<T>(N, ++seed, -2.0f, 2.0f);
    Dev<T> dx(e, x);
    fw::cuda::rope_forward(e.dev, dx.p(), rows, seq, stride, heads, hs, 10000.0f, first);
    fw::host::rope_forward(e.host, x.data(), rows, seq, stride, heads, hs, 10000.0f, first);
    expect_match(dx.get(e, N), x, 1e-5, "rope_forward from position 37");
    Dev<T> dg(e, x);
    fw::cuda::rope_backward(e.dev, dg.p(), rows, seq, stride, heads, hs, 10000.0f, first);
    fw::host::rope_backward(e.host, x.data(), rows, seq, stride, heads, hs, 10000.0f, first);
    expect_match(dg.get(e, N), x, 2e-5, "rope_backward from position 37");
  }
  std::vector<T> bad(12);
  Dev<T> dbad(e, bad);
  EXPECT_THROW(fw::cuda::rope_forward(e.dev, dbad.p(), 2, 2, 6, 2, 3, 10000.0f), fw::ShapeError);
}

// Grouped-query packing against its host twin: the forward is a copy (bitwise), the backward
// sums each group in fp32 in the same order (bitwise too, up to the element type's rounding).
TYPED_TEST(CudaKernels, GqaPackAndUnpackMatchHost) {
  FW_REQUIRE_GPU();
  using T = TypeParam;
  Env e;
  // (rows, heads, kv_heads, head size)
  const std::int64_t shapes[][4] = {
      {1, 1, 1, 8}, {7, 4, 2, 16}, {129, 8, 1, 64}, {1023, 12, 4, 64}};
  std::uint32_t seed = 1300;
  for (const auto& s : shapes) {
    const std::int64_t rows = s[0], H = s[1], KV = s[2], hs = s[3];
    const auto nq = static_cast<std::size_t>(rows * H * hs);
    const auto nkv = static_cast<std::size_t>(rows * 2 * KV * hs);
    const auto q = ft::random_typed<T>(nq, ++seed);
    const auto kv = ft::random_typed<T>(nkv, ++seed);
    const auto dqkv = ft::random_typed<T>(3 * nq, ++seed);
    std::vector<T> qkv(3 * nq), dq(nq), dkv(nkv);
    Dev<T> dq_in(e, q), dkv_in(e, kv), dpacked(e, qkv), dgrad(e, dqkv), ddq(e, dq), ddkv(e, dkv);
    fw::cuda::gqa_pack(e.dev, dpacked.p(), dq_in.p(), dkv_in.p(), rows, H, KV, hs);
    fw::host::gqa_pack(e.host, qkv.data(), q.data(), kv.data(), rows, H, KV, hs);
    expect_match(dpacked.get(e, 3 * nq), qkv, 0.0, "gqa_pack");
    fw::cuda::gqa_unpack_grad(e.dev, ddq.p(), ddkv.p(), dgrad.p(), rows, H, KV, hs);
    fw::host::gqa_unpack_grad(e.host, dq.data(), dkv.data(), dqkv.data(), rows, H, KV, hs);
    expect_match(ddq.get(e, nq), dq, 0.0, "gqa_unpack_grad dq");
    expect_match(ddkv.get(e, nkv), dkv, 1e-6, "gqa_unpack_grad dkv");
  }
}
