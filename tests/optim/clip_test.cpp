#include "fourway/optim/clip.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "toy_params.hpp"

namespace fw = fourway;

namespace {

TEST(Clip, CoefficientIsClipGradNormsFormula) {
  EXPECT_FLOAT_EQ(fw::clip_coefficient(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(fw::clip_coefficient(0.5, 1.0), 1.0f);  // capped at 1
  EXPECT_LT(fw::clip_coefficient(1.0, 1.0), 1.0f);  // the 1e-6 keeps it just below 1
  EXPECT_EQ(fw::clip_coefficient(3.0, 0.0), 1.0f);  // disabled
  EXPECT_TRUE(std::isnan(fw::clip_coefficient(std::numeric_limits<double>::infinity(), 1.0)));
  EXPECT_TRUE(std::isnan(fw::clip_coefficient(std::nan(""), 1.0)));
}

template <class T>
class ClipTyped : public ::testing::Test {};
using Types = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(ClipTyped, Types);

TYPED_TEST(ClipTyped, ClipGradNormMatchesReference) {
  using T = TypeParam;
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<T> ps(mem, {{9, 7}, {7}, {2, 3, 5}}, 5);
  double ss = 0.0;
  std::vector<double> g;
  for (auto& p : ps.params) {
    for (std::int64_t e = 0; e < p.grad.numel(); ++e) {
      g.push_back(fw::convert<float>(p.grad[e]));
      ss += g.back() * g.back();
    }
  }
  const double norm = std::sqrt(ss);
  const double max_norm = norm / 3.0;
  const double coef = max_norm / (norm + 1e-6);
  EXPECT_NEAR(fw::clip_grad_norm(ctx, ps, max_norm), norm, 1e-12 * norm);
  const double ulp = std::is_same_v<T, float>      ? 1e-6
                     : std::is_same_v<T, fw::bf16> ? 0x1p-8
                                                   : 0x1p-11;
  std::size_t k = 0;
  for (auto& p : ps.params) {
    for (std::int64_t e = 0; e < p.grad.numel(); ++e, ++k) {
      // One rounding to T of the scaled gradient (float's product may sit one float ulp off
      // the double one, which can move a 16-bit rounding by one ulp of T).
      const double want = g[k] * coef;
      ASSERT_NEAR(fw::convert<float>(p.grad[e]), want, ulp * std::abs(want) + 1e-30);
    }
  }
  // A second call sees the clipped norm (max_norm, to the rounding of T) and leaves it.
  const double after = fw::clip_grad_norm(ctx, ps, max_norm * 1.1);
  const double tol = std::is_same_v<T, float> ? 1e-6 * max_norm : 1e-2 * max_norm;
  EXPECT_NEAR(after, max_norm, tol);
}

TEST(Clip, BelowTheLimitNothingChanges) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  toy::Params<float> ps(mem, {{3, 3}}, 9);
  std::vector<float> before(ps.params[0].grad.data(), ps.params[0].grad.data() + 9);
  const double norm = fw::clip_grad_norm(ctx, ps, 1e6);
  EXPECT_GT(norm, 0.0);
  for (int e = 0; e < 9; ++e) EXPECT_EQ(ps.params[0].grad[e], before[e]);
}

}  // namespace
