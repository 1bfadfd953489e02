#include "fourway/backend/matmul.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {

/// A stored row-major array with `pad` unused elements after each row.
struct Stored {
  std::int64_t rows, cols, ld;
  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(rows * ld); }
};

/// op(X)(i, j) of a stored array read as itself or as its transpose.
double at(const std::vector<double>& x, const Stored& s, bool transposed, std::int64_t i,
          std::int64_t j) {
  return transposed ? x[static_cast<std::size_t>(j * s.ld + i)]
                    : x[static_cast<std::size_t>(i * s.ld + j)];
}

struct Case {
  std::int64_t m, n, k;
  bool ta, tb;
  std::int64_t pad;
  float alpha;
  bool add;
};

/// Checks one product against double loops, and bitwise against the hand-spelled backend call.
template <class T, class TC>
void run_case(const Case& g, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << g.ta << " tb=" << g.tb
               << " pad=" << g.pad << " alpha=" << g.alpha << " add=" << g.add);
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const Stored sa{g.ta ? g.k : g.m, g.ta ? g.m : g.k, (g.ta ? g.m : g.k) + g.pad};
  const Stored sb{g.tb ? g.n : g.k, g.tb ? g.k : g.n, (g.tb ? g.k : g.n) + g.pad};
  const Stored sc{g.m, g.n, g.n + g.pad};
  const auto a = ft::random_typed<T>(sa.size(), seed);
  const auto b = ft::random_typed<T>(sb.size(), seed + 1);
  const auto c0 = ft::random_typed<TC>(sc.size(), seed + 2);
  const auto ad = ft::to_double(a);
  const auto bd = ft::to_double(b);
  const auto cd = ft::to_double(c0);

  auto a_view = fw::matrix(a.data(), sa.rows, sa.cols, sa.ld);
  auto b_view = fw::matrix(b.data(), sb.rows, sb.cols, sb.ld);
  if (g.ta) a_view = a_view.t();
  if (g.tb) b_view = b_view.t();
  ASSERT_EQ(a_view.rows, g.m);
  ASSERT_EQ(a_view.cols, g.k);
  ASSERT_EQ(b_view.rows, g.k);
  ASSERT_EQ(b_view.cols, g.n);

  std::vector<TC> c = c0;
  if (!g.add) {  // C = A·B must not read C: poison it
    for (auto& x : c) x = fw::convert<TC>(std::numeric_limits<float>::quiet_NaN());
  }
  // The padding columns must come back untouched, so they carry c0 in both buffers.
  for (std::int64_t i = 0; i < sc.rows; ++i) {
    for (std::int64_t j = g.n; j < sc.ld; ++j) {
      c[static_cast<std::size_t>(i * sc.ld + j)] = c0[static_cast<std::size_t>(i * sc.ld + j)];
    }
  }
  std::vector<TC> direct = c;
  const auto c_view = fw::matrix(c.data(), g.m, g.n, sc.ld);
  if (g.add) {
    fw::matmul_add(ctx, c_view, a_view, b_view, g.alpha);
  } else {
    fw::matmul(ctx, c_view, a_view, b_view, g.alpha);
  }
  fw::Ops<fw::Host>::gemm(ctx, g.ta ? fw::Trans::transpose : fw::Trans::none,
                          g.tb ? fw::Trans::transpose : fw::Trans::none, g.m, g.n, g.k, g.alpha,
                          a.data(), sa.ld, b.data(), sb.ld, g.add ? 1.0f : 0.0f, direct.data(),
                          sc.ld);
  ASSERT_EQ(std::memcmp(c.data(), direct.data(), c.size() * sizeof(TC)), 0)
      << "matmul is not bitwise the backend GEMM it names";

  // fp32 accumulation of products of inputs in (-1, 1): |error| <= k·(k+1)·2^-24·|alpha|, plus
  // one rounding of the result to TC.
  const double acc_err =
      4.0 * static_cast<double>(g.k) * static_cast<double>(g.k + 1) * 0x1p-24 * std::abs(g.alpha);
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t j = 0; j < sc.ld; ++j) {
      const auto idx = static_cast<std::size_t>(i * sc.ld + j);
      const double got = static_cast<double>(fw::convert<float>(c[idx]));
      if (j >= g.n) {
        EXPECT_EQ(got, cd[idx]) << "padding column " << j << " of row " << i << " changed";
        continue;
      }
      double s = 0.0;
      for (std::int64_t p = 0; p < g.k; ++p) s += at(ad, sa, g.ta, i, p) * at(bd, sb, g.tb, p, j);
      const double want = g.alpha * s + (g.add ? cd[idx] : 0.0);
      const double tol = acc_err + 2.0 * ft::unit_roundoff<TC>() * (std::abs(want) + 1.0);
      EXPECT_NEAR(got, want, tol) << "C(" << i << ", " << j << ")";
    }
  }
}

TEST(Matmul, EveryTransposeAssignAndAccumulateMatchDoubleLoops) {
  std::uint32_t seed = 11;
  for (const bool add : {false, true}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const std::int64_t pad : {0, 3}) {
          run_case<float, float>({3, 5, 7, ta, tb, pad, 1.0f, add}, seed++);
          run_case<float, float>({7, 1, 9, ta, tb, pad, -0.375f, add}, seed++);
        }
      }
    }
  }
}

TEST(Matmul, SixteenBitOperandsWithFloatAndSixteenBitOutputs) {
  run_case<fw::bf16, float>({5, 3, 11, true, false, 1, 1.0f, true}, 101);
  run_case<fw::bf16, fw::bf16>({5, 3, 11, false, true, 0, 1.0f, false}, 102);
  run_case<fw::fp16, fw::fp16>({9, 7, 3, true, true, 2, 0.5f, true}, 103);
}

TEST(Matmul, EmptyInnerDimensionZeroesOrKeepsTheOutput) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> a(3), b(5), c(15, 2.0f);  // A (3, 0), B (0, 5): no elements are read
  fw::matmul_add(ctx, fw::matrix(c.data(), 3, 5), fw::matrix(a.data(), 3, 0, 1),
                 fw::matrix(b.data(), 0, 5));
  for (float v : c) EXPECT_EQ(v, 2.0f);
  fw::matmul(ctx, fw::matrix(c.data(), 3, 5), fw::matrix(a.data(), 3, 0, 1),
             fw::matrix(b.data(), 0, 5));
  for (float v : c) EXPECT_EQ(v, 0.0f);
}

TEST(Matmul, TensorViewFlattensTheLeadingExtents) {
  fw::MemoryAccountant acct;
  const fw::Tensor<float, fw::Host> t(fw::Shape{2, 3, 5}, fw::MemTag::workspace, acct);
  const fw::Matrix<float> m = fw::matrix(t);
  EXPECT_EQ(m.data, t.data());
  EXPECT_EQ(m.rows, 6);
  EXPECT_EQ(m.cols, 5);
  EXPECT_EQ(m.ld, 5);
  EXPECT_EQ(m.trans, fw::Trans::none);
  const fw::Matrix<float> mt = m.t();
  EXPECT_EQ(mt.rows, 5);
  EXPECT_EQ(mt.cols, 6);
  EXPECT_EQ(mt.ld, 5);
  EXPECT_EQ(mt.trans, fw::Trans::transpose);
  EXPECT_EQ(mt.t().trans, fw::Trans::none);
  const fw::Tensor<float, fw::Host> scalar(fw::Shape{}, fw::MemTag::workspace, acct);
  EXPECT_THROW((void)fw::matrix(scalar), fw::ShapeError);
}

/// The message of the ShapeError `f` throws (fails the test when it throws none).
template <class F>
std::string shape_error(F&& f) {
  try {
    f();
  } catch (const fw::ShapeError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ShapeError";
  return {};
}

TEST(Matmul, MismatchedShapesAreShapeErrorsNamingThem) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> a(4 * 6), b(7 * 5), c(4 * 5);
  const auto A = fw::matrix(a.data(), 4, 6);
  const auto C = fw::matrix(c.data(), 4, 5);
  EXPECT_NE(shape_error([&] {
              fw::matmul(ctx, C, A, fw::matrix(b.data(), 7, 5));
            }).find("the inner sizes 6 and 7 differ"),
            std::string::npos);
  EXPECT_NE(shape_error([&] {
              fw::matmul(ctx, fw::matrix(c.data(), 5, 4), A, fw::matrix(b.data(), 6, 5));
            }).find("is (4, 5), the output is (5, 4)"),
            std::string::npos);
  EXPECT_NE(shape_error([&] {
              fw::matmul_add(ctx, fw::matrix(c.data(), 5, 4).t(), A, fw::matrix(b.data(), 6, 5));
            }).find("untransposed"),
            std::string::npos);
}

}  // namespace
