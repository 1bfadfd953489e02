#include "fourway/backend/host/cross_entropy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {
std::vector<double> ce_ref(const std::vector<double>& x, const std::vector<std::int32_t>& tgt,
                           std::int64_t rows, std::int64_t V) {
  std::vector<double> loss(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    double mx = -1e300, s = 0.0;
    for (std::int64_t c = 0; c < V; ++c) mx = std::max(mx, x[r * V + c]);
    for (std::int64_t c = 0; c < V; ++c) s += std::exp(x[r * V + c] - mx);
    loss[r] = std::log(s) + mx - x[r * V + tgt[r]];
  }
  return loss;
}
std::vector<std::int32_t> random_targets(std::int64_t rows, std::int64_t V, std::uint32_t seed) {
  const auto f = ft::random_floats(static_cast<std::size_t>(rows), seed, 0.0f, 1.0f);
  std::vector<std::int32_t> t(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    t[i] = std::min<std::int32_t>(static_cast<std::int32_t>(f[i] * static_cast<float>(V)),
                                  static_cast<std::int32_t>(V - 1));
  }
  return t;
}
const std::int64_t shapes[][2] = {{1, 2}, {7, 13}, {127, 101}, {1023, 37}};
}  // namespace

template <class T>
class HostCrossEntropy : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostCrossEntropy, Dtypes);

TYPED_TEST(HostCrossEntropy, ForwardAndFiniteDifferenceBackward) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::uint32_t seed = 50;
  for (const auto& [rows, V] : shapes) {
    const auto n = static_cast<std::size_t>(rows * V);
    const auto logits = ft::random_typed<T>(n, ++seed, -6.0f, 6.0f);
    const auto x = ft::to_double(logits);
    const auto tgt = random_targets(rows, V, ++seed);
    std::vector<float> losses(static_cast<std::size_t>(rows));
    fw::host::cross_entropy_forward(ctx, losses.data(), logits.data(), tgt.data(), rows, V);
    // logsumexp in fp32 over V terms: relative ~V ulps of the sum, losses are O(10)
    ft::expect_close(ft::to_double(losses), ce_ref(x, tgt, rows, V),
                     static_cast<double>(V) * 0x1p-24 * 16, 1e-6, "cross_entropy_forward");

    const float dloss = 1.0f / static_cast<float>(rows);
    std::vector<T> dlogits(n);
    fw::host::cross_entropy_backward(ctx, dlogits.data(), logits.data(), tgt.data(), rows, V,
                                     dloss);
    const auto at = ft::sample_indices(n, 96, seed);
    const std::vector<double> w(static_cast<std::size_t>(rows), static_cast<double>(dloss));
    const auto fd = ft::finite_difference(
        [&](const std::vector<double>& xx) { return ce_ref(xx, tgt, rows, V); }, x, w, at);
    // dloss * (p - onehot): p from exp_poly with fp32 sums, one rounding to T (for fp16 the tiny
    // probabilities are subnormal: absolute error up to half a subnormal step)
    ft::expect_close(ft::pick(ft::to_double(dlogits), at), ft::pick(fd, at),
                     1e-7 * dloss + ft::subnormal_step<T>(), 2 * ft::unit_roundoff<T>() + 1e-5,
                     "cross_entropy_backward vs FD");

    auto inplace = logits;  // backward may overwrite the logits
    fw::host::cross_entropy_backward(ctx, inplace.data(), inplace.data(), tgt.data(), rows, V,
                                     dloss);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(inplace[i], dlogits[i]) << "in place differs at " << i;
  }
}

TYPED_TEST(HostCrossEntropy, VocabShardedPiecesMatchUnsharded) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::uint32_t seed = 70;
  for (const auto& [rows, V] : shapes) {
    if (V < 3) continue;
    const auto n = static_cast<std::size_t>(rows * V);
    const auto logits = ft::random_typed<T>(n, ++seed, -6.0f, 6.0f);
    const auto tgt = random_targets(rows, V, ++seed);
    const float dloss = 0.25f;
    // three uneven shards (as when V is not divisible by TP): [0, s1), [s1, s2), [s2, V)
    const std::int64_t bounds[] = {0, V / 3, V / 3 + (V - V / 3) / 2 + 1, V};
    const auto R = static_cast<std::size_t>(rows);
    std::vector<std::vector<T>> shard(3);
    std::vector<float> maxes(R, -3.4e38f), sumexp(R, 0.0f), tlogit(R, 0.0f);
    for (int s = 0; s < 3; ++s) {
      const std::int64_t vl = bounds[s + 1] - bounds[s];
      shard[s].resize(static_cast<std::size_t>(rows * vl));
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < vl; ++c) shard[s][r * vl + c] = logits[r * V + bounds[s] + c];
      }
      std::vector<float> m(R);
      fw::host::vocab_local_max(ctx, m.data(), shard[s].data(), rows, vl);
      for (std::size_t r = 0; r < R; ++r) maxes[r] = std::max(maxes[r], m[r]);  // all-reduce MAX
    }
    for (int s = 0; s < 3; ++s) {
      const std::int64_t vl = bounds[s + 1] - bounds[s];
      std::vector<float> se(R), tl(R);
      fw::host::vocab_local_sumexp(ctx, se.data(), shard[s].data(), maxes.data(), rows, vl);
      fw::host::vocab_target_logit(ctx, tl.data(), shard[s].data(), tgt.data(), rows, vl,
                                   bounds[s]);
      for (std::size_t r = 0; r < R; ++r) {  // all-reduce SUM
        sumexp[r] += se[r];
        tlogit[r] += tl[r];
      }
    }
    std::vector<float> losses(R), want(R);
    fw::host::vocab_loss(ctx, losses.data(), maxes.data(), sumexp.data(), tlogit.data(), rows);
    ft::expect_close(ft::to_double(losses), ce_ref(ft::to_double(logits), tgt, rows, V),
                     static_cast<double>(V) * 0x1p-24 * 16, 1e-6, "vocab-sharded loss");

    std::vector<T> full(n);
    fw::host::cross_entropy_backward(ctx, full.data(), logits.data(), tgt.data(), rows, V, dloss);
    for (int s = 0; s < 3; ++s) {
      const std::int64_t vl = bounds[s + 1] - bounds[s];
      std::vector<T> g(shard[s].size());
      fw::host::vocab_local_grad(ctx, g.data(), shard[s].data(), tgt.data(), maxes.data(),
                                 sumexp.data(), rows, vl, bounds[s], dloss);
      std::vector<double> want_g(g.size());
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < vl; ++c) {
          want_g[r * vl + c] = fw::convert<float>(full[r * V + bounds[s] + c]);
        }
      }
      // same formula, sums in another order: a few fp32 ulps, then one rounding to T
      ft::expect_close_t(g, want_g, 1e-7, 2 * ft::unit_roundoff<T>() + 1e-5, "vocab_local_grad");
    }
  }
}

TEST(HostCrossEntropy, TargetOutsideVocabularyIsAShapeError) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> logits(10, 0.5f), losses(2);
  std::vector<std::int32_t> tgt{1, 5};
  EXPECT_THROW(fw::host::cross_entropy_forward(ctx, losses.data(), logits.data(), tgt.data(), 2, 5),
               fw::ShapeError);
  tgt = {-1, 0};
  EXPECT_THROW(
      fw::host::cross_entropy_backward(ctx, logits.data(), logits.data(), tgt.data(), 2, 5, 1.0f),
      fw::ShapeError);
}
