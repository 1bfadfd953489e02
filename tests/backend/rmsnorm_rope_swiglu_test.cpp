// The Llama kernels (host): RMSNorm, rotary position embedding (rotate-half convention) and
// SwiGLU, forward against double-precision references written here, backward against the double
// reference of the analytic gradient for every element type and against central finite
// differences of the double forward in fp32. Tolerances are derived next to each check: fp32
// error bounds of the kernel's arithmetic, plus one rounding to T for 16-bit outputs (the inputs
// are already T values, so the reference sees exactly what the kernel sees).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/host/rmsnorm.hpp"
#include "fourway/backend/host/rope.hpp"
#include "fourway/backend/host/swiglu.hpp"
#include "fourway/core/error.hpp"
#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {
constexpr float eps = 1e-5f;
constexpr double u32 = 0x1p-24;  // one fp32 rounding

using Vec = std::vector<double>;

// ---- RMSNorm references ----
struct RmsRef {
  Vec out, rstd;
};
RmsRef rmsnorm_ref(const Vec& x, const Vec& w, std::int64_t rows, std::int64_t C) {
  RmsRef r{Vec(x.size()), Vec(static_cast<std::size_t>(rows))};
  for (std::int64_t i = 0; i < rows; ++i) {
    double ss = 0.0;
    for (std::int64_t c = 0; c < C; ++c) ss += x[i * C + c] * x[i * C + c];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(C) + static_cast<double>(eps));
    for (std::int64_t c = 0; c < C; ++c) r.out[i * C + c] = x[i * C + c] * s * w[c];
    r.rstd[i] = s;
  }
  return r;
}
/// Analytic gradient: y_c = x_c s w_c, s = (mean x² + eps)^-1/2, ds/dx_c = -s³ x_c / C.
/// dx_c = s (w_c g_c - x_c s² mean(w g x)), dw_c = Σ_r g x s.
struct RmsGrad {
  Vec dx, dw, scale;  // scale: s·(|w g| + |x| s² |mean(w g x)|) per element, the din error scale
};
RmsGrad rmsnorm_grad_ref(const Vec& x, const Vec& w, const Vec& g, std::int64_t rows,
                         std::int64_t C) {
  const RmsRef f = rmsnorm_ref(x, w, rows, C);
  RmsGrad r{Vec(x.size()), Vec(static_cast<std::size_t>(C), 0.0), Vec(x.size())};
  for (std::int64_t i = 0; i < rows; ++i) {
    const double s = f.rstd[i];
    double dot = 0.0;
    for (std::int64_t c = 0; c < C; ++c) dot += w[c] * g[i * C + c] * x[i * C + c];
    const double k = dot / static_cast<double>(C) * s * s;
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t j = static_cast<std::size_t>(i * C + c);
      r.dx[j] = s * (w[c] * g[j] - x[j] * k);
      r.scale[j] = s * (std::abs(w[c] * g[j]) + std::abs(x[j] * k));
      r.dw[c] += g[j] * x[j] * s;
    }
  }
  return r;
}

// ---- RoPE reference ----
struct RopeShape {
  std::int64_t rows, seq, heads, head_size, pad;
  float theta;
  [[nodiscard]] std::int64_t stride() const { return heads * head_size + pad; }
  [[nodiscard]] std::size_t numel() const { return static_cast<std::size_t>(rows * stride()); }
};
/// The rotation by sign·angle of every (i, i + hs/2) pair of each head. The angle is formed as
/// the convention defines it (HF Llama): inv_freq = 1/theta^(2i/hs) and t·inv_freq in fp32; its
/// cos and sin, the products and sums are double.
Vec rope_ref(const Vec& x, const RopeShape& s, double sign) {
  Vec y = x;
  const std::int64_t half = s.head_size / 2;
  for (std::int64_t r = 0; r < s.rows; ++r) {
    const auto t = static_cast<float>(r % s.seq);
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t i = 0; i < half; ++i) {
        const float inv_freq =
            1.0f / std::pow(s.theta, static_cast<float>(2 * i) / static_cast<float>(s.head_size));
        const double angle = static_cast<double>(t * inv_freq);
        const double c = std::cos(angle), sn = sign * std::sin(angle);
        const std::size_t ia = static_cast<std::size_t>(r * s.stride() + h * s.head_size + i);
        const std::size_t ib = ia + static_cast<std::size_t>(half);
        y[ia] = x[ia] * c - x[ib] * sn;
        y[ib] = x[ib] * c + x[ia] * sn;
      }
    }
  }
  return y;
}
/// |a| + |b| of each element's pair (the scale of its rotation error); 0 outside the heads.
Vec rope_pair_scale(const Vec& x, const RopeShape& s) {
  Vec m(x.size(), 0.0);
  const std::int64_t half = s.head_size / 2;
  for (std::int64_t r = 0; r < s.rows; ++r) {
    for (std::int64_t h = 0; h < s.heads; ++h) {
      for (std::int64_t i = 0; i < half; ++i) {
        const std::size_t ia = static_cast<std::size_t>(r * s.stride() + h * s.head_size + i);
        const std::size_t ib = ia + static_cast<std::size_t>(half);
        m[ia] = m[ib] = std::abs(x[ia]) + std::abs(x[ib]);
      }
    }
  }
  return m;
}

// ---- SwiGLU references ----
double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }
Vec swiglu_ref(const Vec& in, std::int64_t rows, std::int64_t F) {
  Vec y(static_cast<std::size_t>(rows * F));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < F; ++c) {
      const double g = in[r * 2 * F + c], u = in[r * 2 * F + F + c];
      y[r * F + c] = g * sigmoid(g) * u;
    }
  }
  return y;
}
/// d/dg (g σ(g)) = σ + g σ (1 − σ); d/du = silu(g).
Vec swiglu_grad_ref(const Vec& in, const Vec& dy, std::int64_t rows, std::int64_t F) {
  Vec d(in.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < F; ++c) {
      const double g = in[r * 2 * F + c], u = in[r * 2 * F + F + c], gy = dy[r * F + c];
      const double sg = sigmoid(g);
      d[r * 2 * F + c] = gy * u * (sg + g * sg * (1.0 - sg));
      d[r * 2 * F + F + c] = gy * g * sg;
    }
  }
  return d;
}

/// |got − ref| ≤ atol[i] + rtol·|ref| element-wise, with a per-element absolute bound.
void expect_within(const Vec& got, const Vec& ref, const Vec& atol, double rtol,
                   const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  std::size_t bad = 0, worst = 0;
  double worst_ratio = -1.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double lim = atol[i] + rtol * std::abs(ref[i]);
    const double err = std::abs(got[i] - ref[i]);
    if (!(err <= lim)) ++bad;
    const double ratio = err / (lim > 0 ? lim : 1e-300);
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " off; worst [" << worst
                     << "] got " << got[worst] << " want " << ref[worst] << " (bound "
                     << atol[worst] + rtol * std::abs(ref[worst]) << ")";
}
Vec scaled(const Vec& v, double k) {
  Vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = k * v[i];
  return r;
}

/// Central differences of L(x) = Σ_j w_j f(x)_j at the indices `at` (h = 1e-5), formed as
/// Σ_j w_j (f(x + h)_j − f(x − h)_j) / 2h: the outputs that do not depend on x_i cancel exactly
/// before the sum, so the result has no rounding noise from the rest of the tensor (the two full
/// sums of `ft::finite_difference` lose ~1e-16·Σ|w f| / h, 1e-9 at these sizes). Truncation
/// error O(h²·f‴) is about 1e-10 relative for these smooth f.
Vec fd_local(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& w,
             const std::vector<std::size_t>& at, double h = 1e-5) {
  Vec g(x.size(), 0.0);
  for (std::size_t i : at) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const Vec yp = f(x);
    x[i] = x0 - h;
    const Vec ym = f(x);
    x[i] = x0;
    double d = 0.0;
    for (std::size_t j = 0; j < yp.size(); ++j) d += w[j] * (yp[j] - ym[j]);
    g[i] = d / (2.0 * h);
  }
  return g;
}
}  // namespace

template <class T>
class HostLlamaKernels : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostLlamaKernels, Dtypes);

TYPED_TEST(HostLlamaKernels, RmsNormForwardAndBackward) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  constexpr double uT = ft::unit_roundoff<T>();
  const std::int64_t shapes[][2] = {{1, 5}, {7, 33}, {127, 257}};
  std::uint32_t seed = 500;
  for (const auto& [rows, C] : shapes) {
    SCOPED_TRACE(::testing::Message() << ft::type_name<T>() << " rows=" << rows << " C=" << C);
    const auto n = static_cast<std::size_t>(rows * C);
    const auto in = ft::random_typed<T>(n, ++seed, -2.0f, 3.0f);
    const auto w = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed, 0.5f, 1.5f);
    const Vec xd = ft::to_double(in), wd = ft::to_double(w);
    std::vector<T> out(n);
    std::vector<float> rstd(static_cast<std::size_t>(rows));
    fw::host::rmsnorm_forward(ctx, out.data(), rstd.data(), in.data(), w.data(), rows, C, eps);
    const RmsRef ref = rmsnorm_ref(xd, wd, rows, C);
    // fp32: Σx² over C terms ≤ C roundings relative (all terms positive), then /C, +eps, sqrt,
    // divide: rstd within (C + 4)·2⁻²⁴ relative; out = x·s·w two more roundings; then one T
    // rounding. Relative bounds hold element by element (no cancellation).
    const double rel = (static_cast<double>(C) + 8) * u32;
    ft::expect_close(ft::to_double(rstd), ref.rstd, 0.0, rel, "rmsnorm rstd");
    ft::expect_close_t(out, ref.out, ft::subnormal_step<T>(), rel + uT, "rmsnorm out");

    const auto dout = ft::random_typed<T>(n, ++seed);
    const Vec gd = ft::to_double(dout);
    std::vector<T> din(n);
    auto dw = ft::random_typed<T>(static_cast<std::size_t>(C), ++seed);
    const Vec dw0 = ft::to_double(dw);
    fw::host::rmsnorm_backward(ctx, din.data(), dw.data(), dout.data(), in.data(), w.data(),
                               rstd.data(), rows, C);
    const RmsGrad g = rmsnorm_grad_ref(xd, wd, gd, rows, C);
    // din = s·(w·g − x·k): each term carries the rstd and Σ(w g x) errors, ≤ (C + 16)·2⁻²⁴ of
    // its own size, and the difference may cancel, so the bound is absolute per element in the
    // scale s·(|w g| + |x k|); then one T rounding.
    const Vec din_atol = scaled(g.scale, (static_cast<double>(C) + 16) * u32);
    expect_within(ft::to_double(din), g.dx, din_atol, uT, "rmsnorm din vs analytic");
    // dweight: fp32 sum over rows of |g x s| ≤ 3·1·1.6 terms, each with ~4 roundings, plus the
    // pre-filled value; then one T rounding of the accumulated value.
    Vec dw_want(static_cast<std::size_t>(C)), dw_atol(dw_want.size());
    for (std::int64_t c = 0; c < C; ++c) {
      dw_want[c] = dw0[c] + g.dw[c];
      dw_atol[c] = (static_cast<double>(rows) + 8) * 5.0 * u32;
    }
    expect_within(ft::to_double(dw), dw_want, dw_atol, uT, "rmsnorm dweight vs analytic");

    if constexpr (std::is_same_v<T, float>) {
      // The analytic formula itself against central differences of ⟨dout, rmsnorm(x, w)⟩.
      const auto at = ft::sample_indices(n, 64, seed);
      std::vector<std::size_t> all_c(static_cast<std::size_t>(C));
      for (std::size_t c = 0; c < all_c.size(); ++c) all_c[c] = c;
      const Vec fd_x =
          fd_local([&](const Vec& xx) { return rmsnorm_ref(xx, wd, rows, C).out; }, xd, gd, at);
      const Vec fd_w =
          fd_local([&](const Vec& ww) { return rmsnorm_ref(xd, ww, rows, C).out; }, wd, gd, all_c);
      // FD truncation and cancellation ≈ 1e-9 of the scale; the kernel's bound as above
      expect_within(ft::pick(ft::to_double(din), at), ft::pick(fd_x, at),
                    ft::pick(scaled(g.scale, (static_cast<double>(C) + 16) * u32 + 1e-8), at), 0.0,
                    "rmsnorm din vs FD");
      Vec fw_want(static_cast<std::size_t>(C));
      for (std::int64_t c = 0; c < C; ++c) fw_want[c] = dw0[c] + fd_w[c];
      Vec fw_atol = dw_atol;
      for (auto& a : fw_atol) a += 1e-7 * static_cast<double>(rows);
      expect_within(ft::to_double(dw), fw_want, fw_atol, 0.0, "rmsnorm dweight vs FD");
    }
  }
}

TYPED_TEST(HostLlamaKernels, RopeForwardAndBackward) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  constexpr double uT = ft::unit_roundoff<T>();
  const RopeShape shapes[] = {{1, 1, 1, 8, 0, 10000.0f},
                              {7, 3, 2, 8, 5, 10000.0f},
                              {127, 50, 3, 64, 17, 10000.0f},
                              {127, 127, 1, 64, 0, 500000.0f}};
  std::uint32_t seed = 600;
  for (const RopeShape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << ft::type_name<T>() << " rows=" << s.rows << " seq="
                                      << s.seq << " heads=" << s.heads << " hs=" << s.head_size);
    const std::size_t n = s.numel();
    const auto x0 = ft::random_typed<T>(n, ++seed, -2.0f, 2.0f);
    const Vec xd = ft::to_double(x0);
    auto x = x0;
    fw::host::rope_forward(ctx, x.data(), s.rows, s.seq, s.stride(), s.heads, s.head_size, s.theta);
    // fp32: cos and sin each within an ulp (≤ 2⁻²⁴ absolute, |value| ≤ 1), two products and a
    // sum: ≤ 4·2⁻²⁴·(|a| + |b|) absolute; then one T rounding. Elements past the heads
    // (row_stride padding) are untouched, so bound 0 there.
    const Vec pair = rope_pair_scale(xd, s);
    const Vec want = rope_ref(xd, s, 1.0);
    expect_within(ft::to_double(x), want, scaled(pair, 4 * u32), uT, "rope forward");
    for (std::int64_t r = 0; r < s.rows; ++r) {
      for (std::int64_t j = s.heads * s.head_size; j < s.stride(); ++j) {
        const auto k = static_cast<std::size_t>(r * s.stride() + j);
        ASSERT_EQ(ft::to_double(std::vector<T>{x[k]})[0], xd[k]) << "padding changed at " << k;
      }
    }
    // position 0 is the identity (the rows at t = 0 come back unchanged, bit for bit)
    for (std::int64_t r = 0; r < s.rows; r += s.seq) {
      for (std::int64_t j = 0; j < s.stride(); ++j) {
        const auto k = static_cast<std::size_t>(r * s.stride() + j);
        ASSERT_EQ(fw::convert<float>(x[k]), fw::convert<float>(x0[k])) << "t = 0 moved " << k;
      }
    }

    // backward: the transpose rotation of dout, against the double transpose and (fp32) central
    // differences of ⟨dout, rope(x)⟩.
    const auto g0 = ft::random_typed<T>(n, ++seed);
    const Vec gd = ft::to_double(g0);
    auto g = g0;
    fw::host::rope_backward(ctx, g.data(), s.rows, s.seq, s.stride(), s.heads, s.head_size,
                            s.theta);
    const Vec gpair = rope_pair_scale(gd, s);
    expect_within(ft::to_double(g), rope_ref(gd, s, -1.0), scaled(gpair, 4 * u32), uT,
                  "rope backward vs transpose");
    if constexpr (std::is_same_v<T, float>) {
      const auto at = ft::sample_indices(n, 96, seed);
      const Vec fd = fd_local([&](const Vec& xx) { return rope_ref(xx, s, 1.0); }, xd, gd, at);
      Vec atol = ft::pick(gpair, at);
      for (auto& a : atol) a = a * 4 * u32 + 1e-9;
      expect_within(ft::pick(ft::to_double(g), at), ft::pick(fd, at), atol, 0.0,
                    "rope backward vs FD");
      // and backward ∘ forward ≈ identity (a rotation and its transpose)
      auto y = x;
      fw::host::rope_backward(ctx, y.data(), s.rows, s.seq, s.stride(), s.heads, s.head_size,
                              s.theta);
      expect_within(ft::to_double(y), xd, scaled(pair, 16 * u32), 0.0, "rope round trip");
    }
  }
}

TEST(HostLlamaKernelsRope, HeadSizeAndTwoByTwoRotationByHand) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  // head_size 2: inv_freq[0] = 1, so row t turns (a, b) by t radians: (1, 0) at t = 1 becomes
  // (cos 1, sin 1) — the sign convention a' = a cos − b sin, b' = b cos + a sin.
  std::vector<float> x = {1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1.0f};
  fw::host::rope_forward(ctx, x.data(), 3, 3, 2, 1, 2, 10000.0f);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_NEAR(x[2], std::cos(1.0), 1e-7);
  EXPECT_NEAR(x[3], std::sin(1.0), 1e-7);
  EXPECT_NEAR(x[4], -std::sin(2.0), 1e-7);
  EXPECT_NEAR(x[5], std::cos(2.0), 1e-7);
  // head_size 4: the pairs are (0, 2) and (1, 3) (rotate half), not (0, 1) and (2, 3).
  // inv_freq = {1, 1/theta^(1/2)} = {1, 0.01} for theta = 10000; t = 1.
  std::vector<float> y = {0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f};
  fw::host::rope_forward(ctx, y.data(), 2, 2, 4, 1, 4, 10000.0f);
  EXPECT_NEAR(y[4], std::cos(1.0), 1e-7);
  EXPECT_EQ(y[5], 0.0f);
  EXPECT_NEAR(y[6], std::sin(1.0), 1e-7);
  EXPECT_EQ(y[7], 0.0f);
  std::vector<float> z = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f, 0.0f};
  fw::host::rope_forward(ctx, z.data(), 2, 2, 4, 1, 4, 10000.0f);
  EXPECT_NEAR(z[5], std::cos(0.01), 1e-7);
  EXPECT_NEAR(z[7], std::sin(0.01), 1e-7);

  std::vector<float> bad(12);
  try {
    fw::host::rope_forward(ctx, bad.data(), 2, 2, 6, 2, 3, 10000.0f);
    ADD_FAILURE() << "odd head_size accepted";
  } catch (const fw::ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("fourway: ", 0), 0u) << msg;
    EXPECT_NE(msg.find("head_size=3"), std::string::npos) << msg;
  }
  EXPECT_THROW(fw::host::rope_backward(ctx, bad.data(), 2, 2, 6, 2, 3, 10000.0f), fw::ShapeError);
  EXPECT_THROW(fw::host::rope_forward(ctx, bad.data(), 2, 2, 6, 2, 0, 10000.0f), fw::ShapeError);
  // row_stride too small for heads·head_size
  EXPECT_THROW(fw::host::rope_forward(ctx, bad.data(), 2, 2, 6, 2, 4, 10000.0f), fw::ShapeError);
}

// A run of rows in the middle of the sequence (a context-parallel rank's chunk) turns by its
// positions in the whole sequence: rotating rows [a, a + n) of each sequence alone, from
// first_position a, gives exactly those rows of the whole sequence's rotation, and the backward
// turns them back.
TEST(HostLlamaKernelsRope, FirstPositionRotatesARunAsTheWholeSequenceDoes) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t seq = 12, heads = 2, hs = 8, stride = heads * hs + 3, batch = 2;
  const auto whole0 = ft::random_typed<float>(static_cast<std::size_t>(batch * seq * stride), 91);
  auto whole = whole0;
  fw::host::rope_forward(ctx, whole.data(), batch * seq, seq, stride, heads, hs, 500.0f);
  const std::pair<std::int64_t, std::int64_t> runs[] = {{0, 3}, {3, 3}, {5, 7}};
  for (const auto& [a, n] : runs) {
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::size_t at = static_cast<std::size_t>((b * seq + a) * stride);
      const std::size_t len = static_cast<std::size_t>(n * stride);
      std::vector<float> run(whole0.begin() + at, whole0.begin() + at + len);
      fw::host::rope_forward(ctx, run.data(), n, n, stride, heads, hs, 500.0f, a);
      for (std::size_t i = 0; i < len; ++i)
        ASSERT_EQ(run[i], whole[at + i]) << "rows [" << a << ", " << a + n << ") at " << i;
      fw::host::rope_backward(ctx, run.data(), n, n, stride, heads, hs, 500.0f, a);
      for (std::size_t i = 0; i < len; ++i) ASSERT_NEAR(run[i], whole0[at + i], 1e-5);
    }
  }
  std::vector<float> x(16);
  EXPECT_THROW(fw::host::rope_forward(ctx, x.data(), 1, 1, 16, 2, 8, 500.0f, -1), fw::ShapeError);
}

TYPED_TEST(HostLlamaKernels, SwiGluForwardAndBackward) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  constexpr double uT = ft::unit_roundoff<T>();
  const std::int64_t shapes[][2] = {{1, 5}, {7, 33}, {127, 257}};
  std::uint32_t seed = 700;
  for (const auto& [rows, F] : shapes) {
    SCOPED_TRACE(::testing::Message() << ft::type_name<T>() << " rows=" << rows << " F=" << F);
    const auto n = static_cast<std::size_t>(rows * F);
    const auto in = ft::random_typed<T>(2 * n, ++seed, -6.0f, 6.0f);
    const Vec xd = ft::to_double(in);
    std::vector<T> out(n);
    fw::host::swiglu_forward(ctx, out.data(), in.data(), rows, F);
    // fp32: exp within 1 ulp, 1 + e, divide, two products: ≤ 8·2⁻²⁴ relative (σ(g) has relative
    // condition ≤ |g| (1 − σ) ≤ 6 in the argument, which is exact); then one T rounding.
    ft::expect_close_t(out, swiglu_ref(xd, rows, F), ft::subnormal_step<T>(), 16 * u32 + uT,
                       "swiglu out");

    const auto dout = ft::random_typed<T>(n, ++seed);
    const Vec gd = ft::to_double(dout);
    std::vector<T> din(2 * n);
    fw::host::swiglu_backward(ctx, din.data(), dout.data(), in.data(), rows, F);
    const Vec want = swiglu_grad_ref(xd, gd, rows, F);
    // dgate = g_y·u·σ·(1 + g(1 − σ)): the bracket cancels near g ≈ −1.28 and 1 − σ loses
    // 2⁻²⁴ absolute, so the bound is absolute in |g_y u σ|·(1 + |g|); dup is relative.
    Vec atol(2 * n);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < F; ++c) {
        const double g = xd[r * 2 * F + c], u = xd[r * 2 * F + F + c], gy = gd[r * F + c];
        atol[r * 2 * F + c] = 16 * u32 * std::abs(gy * u * sigmoid(g)) * (1.0 + std::abs(g));
        atol[r * 2 * F + F + c] = 16 * u32 * std::abs(gy * g * sigmoid(g));
      }
    }
    for (auto& a : atol) a += ft::subnormal_step<T>();
    expect_within(ft::to_double(din), want, atol, uT, "swiglu din vs analytic");
    if constexpr (std::is_same_v<T, float>) {
      const auto at = ft::sample_indices(2 * n, 128, seed);
      const Vec fd = fd_local([&](const Vec& xx) { return swiglu_ref(xx, rows, F); }, xd, gd, at);
      Vec fd_atol = ft::pick(atol, at);
      for (auto& a : fd_atol) a += 1e-8;
      expect_within(ft::pick(ft::to_double(din), at), ft::pick(fd, at), fd_atol, 0.0,
                    "swiglu din vs FD");
    }
  }
}

TEST(HostLlamaKernelsSwiGlu, SaturatedGatesStayFinite) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  // exp(−g) overflows for g < −88: σ = 0 exactly, no inf·0 NaN; g = +100: σ = 1.
  const std::vector<float> in = {-100.0f, 100.0f, 0.0f, 2.0f, 3.0f, 5.0f};
  std::vector<float> out(3), din(6);
  const std::vector<float> dout = {1.0f, 1.0f, 1.0f};
  fw::host::swiglu_forward(ctx, out.data(), in.data(), 1, 3);
  EXPECT_EQ(std::abs(out[0]), 0.0f);
  EXPECT_EQ(out[1], 300.0f);
  EXPECT_EQ(out[2], 0.0f);
  fw::host::swiglu_backward(ctx, din.data(), dout.data(), in.data(), 1, 3);
  for (float v : din) EXPECT_TRUE(std::isfinite(v)) << v;
  EXPECT_EQ(std::abs(din[0]), 0.0f);
  EXPECT_EQ(din[1], 3.0f);
  EXPECT_EQ(din[2], 2.5f);  // σ(0)·(1 + 0) = 1/2, times up = 5
  EXPECT_EQ(din[4], 100.0f);
  EXPECT_EQ(din[5], 0.0f);
}
