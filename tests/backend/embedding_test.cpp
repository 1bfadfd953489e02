#include "fourway/backend/host/embedding.hpp"

#include <gtest/gtest.h>

#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

template <class T>
class HostEmbedding : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostEmbedding, Dtypes);

TYPED_TEST(HostEmbedding, ForwardAndFiniteDifferenceBackward) {
  using E = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  // (B, T, C, V, maxT); small V so tokens repeat many times
  const std::int64_t shapes[][5] = {
      {1, 1, 1, 1, 1}, {2, 7, 5, 11, 9}, {4, 33, 16, 7, 40}, {3, 127, 8, 50, 127}};
  std::uint32_t seed = 80;
  for (const auto& [B, T, C, V, maxT] : shapes) {
    const auto wte = ft::random_typed<E>(static_cast<std::size_t>(V * C), ++seed);
    const auto wpe = ft::random_typed<E>(static_cast<std::size_t>(maxT * C), ++seed);
    const auto tf = ft::random_floats(static_cast<std::size_t>(B * T), ++seed, 0.0f, 1.0f);
    std::vector<std::int32_t> tokens(tf.size());
    for (std::size_t i = 0; i < tf.size(); ++i) {
      tokens[i] = std::min<std::int32_t>(static_cast<std::int32_t>(tf[i] * static_cast<float>(V)),
                                         static_cast<std::int32_t>(V - 1));
    }
    const auto wted = ft::to_double(wte), wped = ft::to_double(wpe);
    auto forward_ref = [&](const std::vector<double>& te, const std::vector<double>& pe) {
      std::vector<double> y(static_cast<std::size_t>(B * T * C));
      for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t t = 0; t < T; ++t) {
          for (std::int64_t c = 0; c < C; ++c) {
            y[(b * T + t) * C + c] = te[tokens[b * T + t] * C + c] + pe[t * C + c];
          }
        }
      }
      return y;
    };
    std::vector<E> out(static_cast<std::size_t>(B * T * C));
    fw::host::embedding_forward(ctx, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    ft::expect_close_t(out, forward_ref(wted, wped), 0.0, ft::unit_roundoff<E>(),
                       "embedding_forward");

    const auto dout = ft::random_typed<E>(out.size(), ++seed);
    auto dwte = ft::random_typed<E>(wte.size(), ++seed);
    auto dwpe = ft::random_typed<E>(wpe.size(), ++seed);
    auto want_te =
        ft::finite_difference([&](const std::vector<double>& te) { return forward_ref(te, wped); },
                              wted, ft::to_double(dout));
    auto want_pe =
        ft::finite_difference([&](const std::vector<double>& pe) { return forward_ref(wted, pe); },
                              wped, ft::to_double(dout));
    const auto dwte0 = ft::to_double(dwte), dwpe0 = ft::to_double(dwpe);
    for (std::size_t i = 0; i < want_te.size(); ++i) want_te[i] += dwte0[i];  // accumulate
    for (std::size_t i = 0; i < want_pe.size(); ++i) want_pe[i] += dwpe0[i];
    fw::host::embedding_backward(ctx, dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T,
                                 C);
    // each row: an fp32 sum of <= B*T terms < 1 and one rounding to T (not one per term)
    const double atol = static_cast<double>(B * T) * 0x1p-24 * 4 + 1e-9;
    ft::expect_close_t(dwte, want_te, atol, ft::unit_roundoff<E>() * 1.01, "embedding dwte vs FD");
    ft::expect_close_t(dwpe, want_pe, atol, ft::unit_roundoff<E>() * 1.01, "embedding dwpe vs FD");
  }
}

TEST(HostEmbedding, NegativeTokenIsAShapeError) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> dwte(8), dwpe(8), dout(8, 1.0f);
  std::vector<std::int32_t> tokens{1, -3};
  EXPECT_THROW(fw::host::embedding_backward(ctx, dwte.data(), dwpe.data(), dout.data(),
                                            tokens.data(), 1, 2, 4),
               fw::ShapeError);
}

// The checked forward (TokenGuard, the device path's bounds check; host twin): ids outside
// [0, V) give zero rows and the smallest bad position is recorded, the good rows are unchanged.
TEST(HostEmbeddingGuard, RecordsTheFirstBadPositionAndZeroesItsRows) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t B = 2, T = 3, C = 2, V = 4;
  const std::vector<float> wte = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> wpe = {10, 20, 30, 40, 50, 60};
  const std::vector<std::int32_t> tokens = {0, 3, 9, 1, -1, 2};
  std::vector<float> out(static_cast<std::size_t>(B * T * C), -1.0f);
  std::int64_t first_bad = fw::TokenGuard::none;
  fw::host::embedding_forward(ctx, out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C,
                              fw::TokenGuard{V, &first_bad});
  EXPECT_EQ(first_bad, 2);
  const std::vector<float> expect = {11, 22, 37, 48, 0, 0, 13, 24, 0, 0, 55, 66};
  EXPECT_EQ(out, expect);
  std::int64_t clean = fw::TokenGuard::none;
  const std::vector<std::int32_t> good = {0, 1, 2, 3, 0, 1};
  fw::host::embedding_forward(ctx, out.data(), good.data(), wte.data(), wpe.data(), B, T, C,
                              fw::TokenGuard{V, &clean});
  EXPECT_EQ(clean, fw::TokenGuard::none);
}
