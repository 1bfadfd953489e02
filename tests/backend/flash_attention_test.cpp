// The flash-style attention host twin (backend/host/flash_attention.hpp) against the attention
// of its definition in double (tests/backend/attention_reference.hpp), finite differences of it,
// and the materialised kernels (backend/host/attention.hpp), at odd shapes — one token, partial
// tiles, several tiles, a head size of 1 — and all three element types.
#include "fourway/backend/host/flash_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attention_reference.hpp"
#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {
// (B, T, C, NH): one token; under one tile; one tile exactly; a tile and one row; several tiles
// with a partial last one; a head size of 1 over three tiles.
constexpr std::int64_t shapes[][4] = {{1, 1, 4, 1},  {2, 7, 12, 3},   {1, 64, 16, 2},
                                      {1, 65, 8, 2}, {1, 150, 16, 2}, {1, 200, 3, 3}};

template <class E>
struct Run {
  std::vector<E> qkv, out, dout, dqkv;
  std::vector<float> lse, delta;
};
template <class E>
Run<E> run_flash(const fw::Context<fw::Host>& ctx, std::int64_t B, std::int64_t T, std::int64_t C,
                 std::int64_t NH, std::uint32_t seed) {
  Run<E> r;
  r.qkv = ft::random_typed<E>(static_cast<std::size_t>(B * T * 3 * C), seed, -1.5f, 1.5f);
  r.out.resize(static_cast<std::size_t>(B * T * C));
  r.lse.resize(static_cast<std::size_t>(B * NH * T));
  r.delta.resize(r.lse.size());
  fw::host::flash_attention_forward(ctx, r.out.data(), r.lse.data(), r.qkv.data(), B, T, C, NH);
  r.dout = ft::random_typed<E>(r.out.size(), seed + 1000);
  r.dqkv.resize(r.qkv.size());
  fw::host::flash_attention_backward(ctx, r.dqkv.data(), r.delta.data(), r.dout.data(),
                                     r.qkv.data(), r.out.data(), r.lse.data(), B, T, C, NH);
  return r;
}
std::string tag_of(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  return ::testing::PrintToString(std::vector<std::int64_t>{B, T, C, NH});
}
}  // namespace

template <class T>
class HostFlashAttention : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostFlashAttention, Dtypes);

// Output, log-sum-exp and gradient against the double reference. Everything inside is fp32 and
// the 16-bit outputs are rounded once, so the bounds are one rounding of E (u relative) plus fp32
// arithmetic (~1e-6 of the value's scale): tighter than the materialised kernel's, which rounds
// the scores and P to E.
TYPED_TEST(HostFlashAttention, MatchesTheDefinitionAndItsFiniteDifferences) {
  using E = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::uint32_t seed = 70;
  for (const auto& [B, T, C, NH] : shapes) {
    const auto r = run_flash<E>(ctx, B, T, C, NH, ++seed);
    const auto qd = ft::to_double(r.qkv);
    const auto ref = ft::attention_ref(qd, B, T, C, NH);
    const double u = std::is_same_v<E, float> ? 0.0 : ft::unit_roundoff<E>();
    const std::string tag = tag_of(B, T, C, NH);
    ft::expect_close_t(r.out, ref.out, 4e-6, 1.01 * u, "flash out " + tag);
    ft::expect_close(ft::to_double(r.lse), ref.lse, 4e-6, 1e-6, "flash lse " + tag);

    const auto at = ft::sample_indices(r.qkv.size(), 48, seed);
    const auto fd = ft::finite_difference(
        [&](const std::vector<double>& x) { return ft::attention_ref(x, B, T, C, NH).out; }, qd,
        ft::to_double(r.dout), at);
    // 16-bit: D = rowsum(dO ∘ O) reads the rounded O (as every flash backward does), which
    // moves dS by ~u·|D|: a term of u times the gradient scale (observed: 0.1 u).
    const double g_scale = std::max(1.0, ft::max_abs(ft::pick(fd, at)));
    ft::expect_close(ft::pick(ft::to_double(r.dqkv), at), ft::pick(fd, at), (2e-5 + u) * g_scale,
                     1.01 * u, "flash dqkv vs FD " + tag);
    // delta ends holding rowsum(dO ∘ O)
    const std::int64_t hs = C / NH;
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t h = 0; h < NH; ++h) {
        for (std::int64_t t = 0; t < T; ++t) {
          double d = 0.0;
          for (std::int64_t i = 0; i < hs; ++i) {
            const auto k = static_cast<std::size_t>((b * T + t) * C + h * hs + i);
            d += static_cast<double>(fw::convert<float>(r.dout[k])) *
                 static_cast<double>(fw::convert<float>(r.out[k]));
          }
          EXPECT_NEAR(r.delta[static_cast<std::size_t>((b * NH + h) * T + t)], d,
                      1e-5 * std::max(1.0, std::abs(d)))
              << tag;
        }
      }
    }
  }
}

// Against the materialised kernels on the same inputs: both are within their bounds of the
// definition (attention_test.cpp, above), so they are within the sum of the bounds of each other.
TYPED_TEST(HostFlashAttention, MatchesTheMaterialisedKernels) {
  using E = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::uint32_t seed = 170;
  for (const auto& [B, T, C, NH] : shapes) {
    const auto r = run_flash<E>(ctx, B, T, C, NH, ++seed);
    std::vector<E> out(r.out.size()), att(static_cast<std::size_t>(B * NH * T * T));
    fw::host::attention_forward(ctx, out.data(), att.data(), r.qkv.data(), B, T, C, NH);
    std::vector<E> dqkv(r.qkv.size()), datt(att.size());
    fw::host::attention_backward(ctx, dqkv.data(), datt.data(), r.dout.data(), r.qkv.data(),
                                 att.data(), B, T, C, NH);
    const double u = ft::unit_roundoff<E>();
    const double hs = static_cast<double>(C / NH);
    const bool f32 = std::is_same_v<E, float>;
    const std::string tag = tag_of(B, T, C, NH);
    ft::expect_close(ft::to_double(r.out), ft::to_double(out), f32 ? 4e-6 : 3 * u * std::sqrt(hs),
                     3 * u, "flash vs materialised out " + tag);
    const double g_scale = std::max(1.0, ft::max_abs(ft::to_double(dqkv)));
    ft::expect_close(ft::to_double(r.dqkv), ft::to_double(dqkv),
                     f32 ? 2e-5 * g_scale : 5 * u * std::sqrt(hs) * g_scale, 5 * u,
                     "flash vs materialised dqkv " + tag);
  }
}

// Causality and the skipped tiles: changing the keys and values after position p changes no
// output row <= p, bit for bit (their tiles are never read for those rows), and changes the
// gradient of no q, k, v at or before p when the upstream gradient of rows > p is zero.
TEST(HostFlashAttention, LaterTokensChangeNothingBefore) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t B = 1, T = 150, C = 16, NH = 2, p = 70;
  auto a = ft::random_floats(static_cast<std::size_t>(B * T * 3 * C), 5);
  auto b = a;
  for (std::int64_t t = p + 1; t < T; ++t) {
    for (std::int64_t c = 0; c < 3 * C; ++c) b[static_cast<std::size_t>(t * 3 * C + c)] += 0.5f;
  }
  std::vector<float> oa(static_cast<std::size_t>(T * C)), ob(oa.size()),
      la(static_cast<std::size_t>(NH * T)), lb(la.size());
  fw::host::flash_attention_forward(ctx, oa.data(), la.data(), a.data(), B, T, C, NH);
  fw::host::flash_attention_forward(ctx, ob.data(), lb.data(), b.data(), B, T, C, NH);
  for (std::int64_t t = 0; t <= p; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      const auto i = static_cast<std::size_t>(t * C + c);
      ASSERT_EQ(oa[i], ob[i]) << "row " << t;
    }
  }
  std::vector<float> dout(oa.size(), 0.0f), da(a.size()), db(a.size()), delta(la.size());
  for (std::int64_t i = 0; i < (p + 1) * C; ++i) dout[static_cast<std::size_t>(i)] = 0.25f;
  fw::host::flash_attention_backward(ctx, da.data(), delta.data(), dout.data(), a.data(), oa.data(),
                                     la.data(), B, T, C, NH);
  fw::host::flash_attention_backward(ctx, db.data(), delta.data(), dout.data(), b.data(), ob.data(),
                                     lb.data(), B, T, C, NH);
  for (std::int64_t i = 0; i < (p + 1) * 3 * C; ++i) {
    ASSERT_EQ(da[static_cast<std::size_t>(i)], db[static_cast<std::size_t>(i)]) << "element " << i;
  }
}

// Huge scores: the online softmax rescales instead of overflowing (a score of 1e4 in a later tile
// than the first maximum), and the result equals the definition.
TEST(HostFlashAttention, LargeScoresInALaterTileStayFinite) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t B = 1, T = 130, C = 4, NH = 1;
  auto x = ft::random_floats(static_cast<std::size_t>(T * 3 * C), 9, -0.1f, 0.1f);
  for (std::int64_t c = 0; c < C; ++c) {
    x[static_cast<std::size_t>(129 * 3 * C + c)] = 60.0f;      // q of the last row
    x[static_cast<std::size_t>(100 * 3 * C + C + c)] = 60.0f;  // k of key 100 (second tile)
  }
  std::vector<float> out(static_cast<std::size_t>(T * C)), lse(static_cast<std::size_t>(T));
  fw::host::flash_attention_forward(ctx, out.data(), lse.data(), x.data(), B, T, C, NH);
  const auto ref = ft::attention_ref(ft::to_double(x), B, T, C, NH);
  ft::expect_close_t(out, ref.out, 1e-5, 1e-5, "out with a 7200 score");
  ft::expect_close(ft::to_double(lse), ref.lse, 1e-5, 1e-6, "lse with a 7200 score");
}

TEST(HostFlashAttention, HeadsMustDivideChannels) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> buf(1024), lse(64);
  EXPECT_THROW(
      fw::host::flash_attention_forward(ctx, buf.data(), lse.data(), buf.data(), 1, 2, 10, 3),
      fw::ShapeError);
}
