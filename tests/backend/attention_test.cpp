#include "fourway/backend/host/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "attention_reference.hpp"
#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;
using ft::attention_ref;

template <class T>
class HostAttention : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostAttention, Dtypes);

TYPED_TEST(HostAttention, ForwardAndFiniteDifferenceBackward) {
  using E = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  // (B, T, C, NH): one token, odd lengths, several heads, a head size of 1
  const std::int64_t shapes[][4] = {
      {1, 1, 4, 1}, {2, 7, 12, 3}, {1, 33, 16, 2}, {1, 127, 8, 2}, {2, 20, 3, 3}};
  std::uint32_t seed = 40;
  for (const auto& [B, T, C, NH] : shapes) {
    const auto nqkv = static_cast<std::size_t>(B * T * 3 * C);
    const auto qkv = ft::random_typed<E>(nqkv, ++seed, -1.5f, 1.5f);
    const auto qd = ft::to_double(qkv);
    std::vector<E> out(static_cast<std::size_t>(B * T * C));
    std::vector<E> att(static_cast<std::size_t>(B * NH * T * T));
    fw::host::attention_forward(ctx, out.data(), att.data(), qkv.data(), B, T, C, NH);
    const auto ref = attention_ref(qd, B, T, C, NH);
    // fp32: GEMM and softmax errors ~1e-6. 16-bit: the unscaled scores (random walks of size
    // ~sqrt(hs)) are rounded to E before the softmax, moving each scaled score by ~u, then P and
    // out are rounded (u each): errors of a few u, growing like sqrt(hs). Observed worst: 1.3 u
    // on out at hs = 8; the bounds below leave 3-4x.
    const double u = ft::unit_roundoff<E>();
    const double hs = static_cast<double>(C / NH);
    const double fwd_tol = std::is_same_v<E, float> ? 2e-6 : 2 * u * std::sqrt(hs);
    const std::string tag = ::testing::PrintToString(std::vector<std::int64_t>{B, T, C, NH});
    ft::expect_close_t(att, ref.att, fwd_tol, 2 * u, "attention att " + tag);
    ft::expect_close_t(out, ref.out, fwd_tol + 2 * u, 2 * u, "attention out " + tag);
    for (std::int64_t b = 0; b < B; ++b) {  // exact zeros above the diagonal
      for (std::int64_t t = 0; t < T; ++t) {
        for (std::int64_t j = t + 1; j < T; ++j) {
          ASSERT_EQ(fw::convert<float>(att[((b * NH) * T + t) * T + j]), 0.0f);
        }
      }
    }

    const auto dout = ft::random_typed<E>(out.size(), ++seed);
    std::vector<E> dqkv(nqkv), datt(att.size());
    fw::host::attention_backward(ctx, dqkv.data(), datt.data(), dout.data(), qkv.data(), att.data(),
                                 B, T, C, NH);
    const auto at = ft::sample_indices(nqkv, 96, seed);
    const auto fd = ft::finite_difference(
        [&](const std::vector<double>& x) { return attention_ref(x, B, T, C, NH).out; }, qd,
        ft::to_double(dout), at);
    // gradients are O(1) sums over T terms; 16-bit: dP, dS and the saved P are rounded to E.
    // Observed worst: 0.43 u sqrt(hs) x the gradient scale; the bound leaves ~10x.
    const double g_scale = std::max(1.0, ft::max_abs(ft::pick(fd, at)));
    const double g_tol = std::is_same_v<E, float> ? 1e-5 : g_scale * 4 * u * std::sqrt(hs);
    ft::expect_close(ft::pick(ft::to_double(dqkv), at), ft::pick(fd, at), g_tol, 4 * u,
                     "attention dqkv vs FD " + tag);
  }
}

TEST(HostAttention, HeadsMustDivideChannels) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> buf(1024);
  EXPECT_THROW(fw::host::attention_forward(ctx, buf.data(), buf.data(), buf.data(), 1, 2, 10, 3),
               fw::ShapeError);
}
