#include "fourway/backend/host/layernorm.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {
constexpr float eps = 1e-5f;

struct LnRef {
  std::vector<double> out, mean, rstd;
};
LnRef layernorm_ref(const std::vector<double>& x, const std::vector<double>& w,
                    const std::vector<double>& b, std::int64_t rows, std::int64_t C) {
  LnRef r{std::vector<double>(x.size()), std::vector<double>(rows), std::vector<double>(rows)};
  for (std::int64_t i = 0; i < rows; ++i) {
    double m = 0.0, v = 0.0;
    for (std::int64_t c = 0; c < C; ++c) m += x[i * C + c];
    m /= static_cast<double>(C);
    for (std::int64_t c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    const double s = 1.0 / std::sqrt(v / static_cast<double>(C) + eps);
    for (std::int64_t c = 0; c < C; ++c) r.out[i * C + c] = (x[i * C + c] - m) * s * w[c] + b[c];
    r.mean[i] = m;
    r.rstd[i] = s;
  }
  return r;
}
}  // namespace

template <class T>
class HostLayerNorm : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostLayerNorm, Dtypes);

TYPED_TEST(HostLayerNorm, ForwardAndFiniteDifferenceBackward) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t shapes[][2] = {{1, 8}, {7, 13}, {127, 64}, {1023, 48}};
  std::uint32_t seed = 30;
  for (const auto& [rows, C] : shapes) {
    const auto n = static_cast<std::size_t>(rows * C);
    const auto in = ft::random_typed<T>(n, ++seed, -2.0f, 3.0f);
    const auto w = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed, 0.5f, 1.5f);
    const auto b = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    const auto xd = ft::to_double(in), wd = ft::to_double(w), bd = ft::to_double(b);
    std::vector<T> out(n);
    std::vector<float> mean(static_cast<std::size_t>(rows)), rstd(static_cast<std::size_t>(rows));
    fw::host::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), in.data(), w.data(),
                                b.data(), rows, C, eps);
    const auto ref = layernorm_ref(xd, wd, bd, rows, C);
    // normalised values are O(3); fp32 mean/variance over C terms cost ~C ulps relative
    const double fl = static_cast<double>(C) * 0x1p-24 * 8;
    ft::expect_close_t(out, ref.out, fl, 2 * ft::unit_roundoff<T>(), "layernorm out");
    ft::expect_close(ft::to_double(mean), ref.mean, fl, fl, "layernorm mean");
    ft::expect_close(ft::to_double(rstd), ref.rstd, fl, fl, "layernorm rstd");

    // backward vs central differences of the double forward, L = sum dout * out
    const auto dout = ft::random_typed<T>(n, ++seed);
    const auto dd = ft::to_double(dout);
    std::vector<T> din(n);
    auto dw = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    auto db = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    const auto dw0 = ft::to_double(dw), db0 = ft::to_double(db);
    fw::host::layernorm_backward(ctx, din.data(), dw.data(), db.data(), dout.data(), in.data(),
                                 w.data(), mean.data(), rstd.data(), rows, C);
    const auto at = ft::sample_indices(n, 64, seed);
    const auto fd_x = ft::finite_difference(
        [&](const std::vector<double>& xx) { return layernorm_ref(xx, wd, bd, rows, C).out; }, xd,
        dd, at);
    auto fd_w = ft::finite_difference(
        [&](const std::vector<double>& ww) { return layernorm_ref(xd, ww, bd, rows, C).out; }, wd,
        dd);
    auto fd_b = ft::finite_difference(
        [&](const std::vector<double>& bb) { return layernorm_ref(xd, wd, bb, rows, C).out; }, bd,
        dd);
    for (std::int64_t c = 0; c < C; ++c) {
      fd_w[c] += dw0[c];  // parameter gradients accumulate
      fd_b[c] += db0[c];
    }
    // din: O(rstd) values from fp32 row sums; 16-bit: the saved out-of-T rounding of din
    const double scale_x = ft::max_abs(ft::pick(fd_x, at));
    ft::expect_close(ft::pick(ft::to_double(din), at), ft::pick(fd_x, at),
                     scale_x * (4 * ft::unit_roundoff<T>() + fl), 2 * ft::unit_roundoff<T>(),
                     "layernorm din vs FD");
    // dweight/dbias: fp32 sums over `rows` terms of size O(3), one rounding to T
    const double sum_tol = static_cast<double>(rows) * 3.0 * 0x1p-24 * 16;
    ft::expect_close_t(dw, fd_w, sum_tol + 1e-6, 2 * ft::unit_roundoff<T>(),
                       "layernorm dweight vs FD");
    ft::expect_close_t(db, fd_b, sum_tol + 1e-6, 2 * ft::unit_roundoff<T>(),
                       "layernorm dbias vs FD");
  }
}

TEST(HostLayerNormBf16, NanScalarsGiveNanNotInfinity) {
  // bf16 results are rounded without a NaN select (bf16_bits_rne); a NaN eps or a saved
  // mean/rstd NaN with a full payload (0x7fffffff) would carry into the sign and round to -0
  // without canonical_nan. Every output must stay NaN.
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t rows = 3, C = 13;
  const auto n = static_cast<std::size_t>(rows * C);
  const auto in = ft::random_typed<fw::bf16>(n, 70, -2.0f, 3.0f);
  const auto w = ft::random_typed<fw::bf16>(static_cast<std::size_t>(C), 71, 0.5f, 1.5f);
  const auto b = ft::random_typed<fw::bf16>(static_cast<std::size_t>(C), 72);
  const float full_payload_nan = std::bit_cast<float>(0x7fffffffu);
  std::vector<fw::bf16> out(n);
  std::vector<float> mean(static_cast<std::size_t>(rows)), rstd(mean.size());
  fw::host::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), in.data(), w.data(),
                              b.data(), rows, C, full_payload_nan);
  for (const auto& v : out) ASSERT_TRUE(std::isnan(static_cast<float>(v))) << v.bits;

  fw::host::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), in.data(), w.data(),
                              b.data(), rows, C, eps);
  mean[1] = full_payload_nan;
  const auto dout = ft::random_typed<fw::bf16>(n, 73);
  std::vector<fw::bf16> din(n), dw(static_cast<std::size_t>(C)), db(dw.size());
  fw::host::layernorm_backward(ctx, din.data(), dw.data(), db.data(), dout.data(), in.data(),
                               w.data(), mean.data(), rstd.data(), rows, C);
  for (std::int64_t c = 0; c < C; ++c) {
    ASSERT_TRUE(std::isnan(static_cast<float>(din[C + c]))) << din[C + c].bits;
    ASSERT_FALSE(std::isnan(static_cast<float>(din[c])));
  }
}

// The fused residual + LayerNorm: r = a + b rounded to T, then the LayerNorm of the stored r,
// against the double reference of that LayerNorm (the tolerance of the unfused test above) and
// bitwise against the two unfused kernels; rows on both sides of its 16-row blocks.
// The backward with the residual path's gradient (a pre-LayerNorm block's input gradient):
// bitwise the unfused sequence, layernorm_backward then residual_forward, and the gains' and
// biases' gradients untouched by it.
TYPED_TEST(HostLayerNorm, BackwardAddsTheResidualGradientAsTheUnfusedSequence) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::uint32_t seed = 90;
  for (const auto& [rows, C] :
       {std::pair<std::int64_t, std::int64_t>{1, 8}, {7, 13}, {16, 64}, {37, 77}}) {
    const auto N = static_cast<std::size_t>(rows * C);
    const auto R = static_cast<std::size_t>(rows);
    const auto x = ft::random_typed<T>(N, ++seed, -2.0f, 3.0f);
    const auto w = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed, 0.5f, 1.5f);
    const auto bias = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    const auto dy = ft::random_typed<T>(N, ++seed);
    const auto dres = ft::random_typed<T>(N, ++seed);
    std::vector<T> out(N);
    std::vector<float> mean(R), rstd(R);
    fw::host::layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                bias.data(), rows, C, eps);
    std::vector<T> din(N), din2(N);
    auto dw = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed), dw2 = dw;
    auto db = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed), db2 = db;
    fw::host::layernorm_backward(ctx, din.data(), dw.data(), db.data(), dy.data(), x.data(),
                                 w.data(), mean.data(), rstd.data(), rows, C, dres.data());
    fw::host::layernorm_backward(ctx, din2.data(), dw2.data(), db2.data(), dy.data(), x.data(),
                                 w.data(), mean.data(), rstd.data(), rows, C);
    std::vector<double> sum(N);
    for (std::size_t i = 0; i < N; ++i) {
      sum[i] = fw::convert<double>(din2[i]) + fw::convert<double>(dres[i]);
    }
    fw::host::residual_forward(ctx, din2.data(), din2.data(), dres.data(), rows * C);
    EXPECT_EQ(ft::to_double(din), ft::to_double(din2));
    EXPECT_EQ(ft::to_double(dw), ft::to_double(dw2));
    EXPECT_EQ(ft::to_double(db), ft::to_double(db2));
    ft::expect_close_t(din, sum, 0.0, ft::unit_roundoff<T>(), "din + dres");
  }
}

TYPED_TEST(HostLayerNorm, ResidualThenLayerNormInOnePass) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::uint32_t seed = 40;
  for (const auto& [rows, C] :
       {std::pair<std::int64_t, std::int64_t>{1, 8}, {7, 13}, {16, 64}, {37, 77}}) {
    const auto N = static_cast<std::size_t>(rows * C);
    const auto a = ft::random_typed<T>(N, ++seed, -2.0f, 3.0f);
    const auto b = ft::random_typed<T>(N, ++seed, -1.0f, 1.0f);
    const auto w = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed, 0.5f, 1.5f);
    const auto bias = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    std::vector<T> r(N), out(N), r2(N), out2(N);
    const auto R = static_cast<std::size_t>(rows);
    std::vector<float> mean(R), rstd(R), mean2(R), rstd2(R);
    fw::host::residual_layernorm_forward(ctx, r.data(), out.data(), mean.data(), rstd.data(),
                                         a.data(), b.data(), w.data(), bias.data(), rows, C, eps);
    std::vector<double> sum(N);
    for (std::size_t i = 0; i < N; ++i) {
      sum[i] = fw::convert<float>(a[i]) + fw::convert<float>(b[i]);
    }
    ft::expect_close_t(r, sum, 0.0, ft::unit_roundoff<T>(), "r = a + b");
    const LnRef ref =
        layernorm_ref(ft::to_double(r), ft::to_double(w), ft::to_double(bias), rows, C);
    const double fl = static_cast<double>(C) * 0x1p-24 * 8;  // as the unfused test above
    ft::expect_close_t(out, ref.out, fl, 2 * ft::unit_roundoff<T>(), "fused layernorm out");
    fw::host::residual_forward(ctx, r2.data(), a.data(), b.data(), rows * C);
    fw::host::layernorm_forward(ctx, out2.data(), mean2.data(), rstd2.data(), r2.data(), w.data(),
                                bias.data(), rows, C, eps);
    EXPECT_EQ(ft::to_double(r), ft::to_double(r2));
    EXPECT_EQ(ft::to_double(out), ft::to_double(out2));
    EXPECT_EQ(mean, mean2);
    EXPECT_EQ(rstd, rstd2);
  }
}
