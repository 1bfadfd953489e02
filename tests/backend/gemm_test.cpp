#include "fourway/backend/host/gemm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "fourway/backend/host/bias.hpp"
#include "fourway/backend/host/elementwise.hpp"
#include "fourway/backend/host/gemm_epilogue.hpp"
#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {

enum class Impl { dispatch, builtin, blas };

struct GemmCase {
  std::int64_t m, n, k;
  fw::Trans ta, tb;
  std::int64_t pad;  // extra leading-dimension elements beyond the minimum
  float alpha, beta;
};

/// C = alpha op(A) op(B) + beta C in double, from the stored (row-major) arrays.
std::vector<double> reference(const GemmCase& g, const std::vector<double>& a, std::int64_t lda,
                              const std::vector<double>& b, std::int64_t ldb,
                              const std::vector<double>& c, std::int64_t ldc) {
  std::vector<double> r = c;
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t j = 0; j < g.n; ++j) {
      double s = 0.0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        const double av = g.ta == fw::Trans::none ? a[i * lda + p] : a[p * lda + i];
        const double bv = g.tb == fw::Trans::none ? b[p * ldb + j] : b[j * ldb + p];
        s += av * bv;
      }
      r[i * ldc + j] = g.alpha * s + (g.beta == 0.0f ? 0.0 : g.beta * c[i * ldc + j]);
    }
  }
  return r;
}

/// A case's random operands A and B (stored as the transposes say) and its leading dimensions.
template <class T>
struct Operands {
  std::int64_t lda, ldb, ldc;
  std::vector<T> a, b;
  Operands(const GemmCase& g, std::uint32_t seed)
      : lda(fw::detail::stored_cols(g.ta, g.m, g.k) + g.pad),
        ldb(fw::detail::stored_cols(g.tb, g.k, g.n) + g.pad),
        ldc(g.n + g.pad),
        a(ft::random_typed<T>(
            static_cast<std::size_t>(fw::detail::stored_rows(g.ta, g.m, g.k) * lda), seed)),
        b(ft::random_typed<T>(
            static_cast<std::size_t>(fw::detail::stored_rows(g.tb, g.k, g.n) * ldb), seed + 1)) {}
};

template <class T, class TC>
void run_case(const GemmCase& g, Impl impl, std::uint32_t seed) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const Operands<T> ops(g, seed);
  const std::int64_t lda = ops.lda, ldb = ops.ldb, ldc = ops.ldc;
  const auto& a = ops.a;
  const auto& b = ops.b;
  auto c = ft::random_typed<TC>(static_cast<std::size_t>(g.m * ldc), seed + 2);
  const auto c0 = ft::to_double(c);
  auto ref = reference(g, ft::to_double(a), lda, ft::to_double(b), ldb, c0, ldc);
  if (g.beta == 0.0f) {  // beta == 0 must not read C: poison it
    for (auto& x : c) x = fw::convert<TC>(std::numeric_limits<float>::quiet_NaN());
  }
  switch (impl) {
    case Impl::dispatch:
      fw::host::gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta,
                     c.data(), ldc);
      break;
    case Impl::builtin:
      fw::host::detail::gemm_builtin(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(),
                                     ldb, g.beta, c.data(), ldc);
      break;
    case Impl::blas:
#if FOURWAY_HAS_CBLAS
      fw::host::detail::gemm_blas(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb,
                                  g.beta, c.data(), ldc);
#endif
      break;
  }
  // Inputs are exact in T (rounded before the reference sees them) and products accumulate in
  // fp32: error <= k * 2^-24 * sum|a||b| <= k * 2^-24 * k (|a|,|b| < 1), plus one rounding of
  // the output to TC. The padding columns of C must be untouched.
  const double acc_err =
      4.0 * static_cast<double>(g.k) * static_cast<double>(g.k + 1) * 0x1p-24 * std::abs(g.alpha);
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t j = g.n; j < ldc; ++j) ref[i * ldc + j] = c0[i * ldc + j];
  }
  ft::expect_close(
      ft::to_double(c), ref, acc_err + 1e-6, 2 * ft::unit_roundoff<TC>(),
      ::testing::PrintToString(std::make_tuple(g.m, g.n, g.k, static_cast<int>(g.ta),
                                               static_cast<int>(g.tb), g.pad, g.alpha, g.beta)) +
          " " + ft::type_name<T>() + "->" + ft::type_name<TC>());
}

std::vector<GemmCase> cases() {
  std::vector<GemmCase> v;
  const std::int64_t shapes[][3] = {{1, 1, 1},   {1, 7, 3},      {7, 1, 5},      {7, 13, 5},
                                    {17, 33, 9}, {127, 45, 300}, {65, 129, 513}, {1023, 40, 24}};
  int i = 0;
  for (auto& s : shapes) {
    for (fw::Trans ta : {fw::Trans::none, fw::Trans::transpose}) {
      for (fw::Trans tb : {fw::Trans::none, fw::Trans::transpose}) {
        const float alpha = (i % 3 == 0) ? 1.0f : -0.75f;
        const float beta = (i % 4 == 0) ? 0.0f : (i % 4 == 1 ? 1.0f : 0.5f);
        v.push_back({s[0], s[1], s[2], ta, tb, (i % 2) * 3, alpha, beta});
        ++i;
      }
    }
  }
  return v;
}

}  // namespace

TEST(HostGemm, BuiltinMatchesDoubleReferenceFp32) {
  std::uint32_t seed = 1;
  for (const auto& g : cases()) run_case<float, float>(g, Impl::builtin, seed += 3);
}

TEST(HostGemm, BlasMatchesDoubleReferenceFp32) {
#if FOURWAY_HAS_CBLAS
  std::uint32_t seed = 100;
  for (const auto& g : cases()) run_case<float, float>(g, Impl::blas, seed += 3);
#else
  GTEST_SKIP() << "built without CBLAS (FOURWAY_HAS_CBLAS=0)";
#endif
}

TEST(HostGemm, DispatchMatchesDoubleReference) {
  std::uint32_t seed = 200;
  for (const auto& g : cases()) run_case<float, float>(g, Impl::dispatch, seed += 3);
}

TEST(HostGemm, SixteenBitInputsAccumulateInFp32) {
  std::uint32_t seed = 300;
  for (const auto& g : cases()) {
    for (Impl impl : {Impl::builtin, Impl::dispatch}) {
      run_case<fw::bf16, fw::bf16>(g, impl, seed += 3);
      run_case<fw::bf16, float>(g, impl, seed += 3);
      run_case<fw::fp16, fw::fp16>(g, impl, seed += 3);
      run_case<fw::fp16, float>(g, impl, seed += 3);
    }
  }
}

TEST(HostGemm, StridedBatchedIsIndependentGemms) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t m = 7, n = 5, k = 9, batch = 3;
  const std::int64_t sa = m * k + 2, sb = k * n + 1, sc = m * n + 4;
  const auto a = ft::random_typed<float>(static_cast<std::size_t>(sa * batch), 1);
  const auto b = ft::random_typed<float>(static_cast<std::size_t>(sb * batch), 2);
  auto c = ft::random_typed<float>(static_cast<std::size_t>(sc * batch), 3);
  std::vector<double> ref = ft::to_double(c);
  const auto ad = ft::to_double(a);
  const auto bd = ft::to_double(b);
  const GemmCase g{m, n, k, fw::Trans::transpose, fw::Trans::none, 0, 0.5f, 2.0f};
  for (std::int64_t i = 0; i < batch; ++i) {
    // op(A) transposed: A stored (k, m), lda = m
    std::vector<double> ai(ad.begin() + i * sa, ad.begin() + i * sa + k * m);
    std::vector<double> bi(bd.begin() + i * sb, bd.begin() + i * sb + k * n);
    std::vector<double> ci(ref.begin() + i * sc, ref.begin() + i * sc + m * n);
    const auto r = reference(g, ai, m, bi, n, ci, n);
    std::copy(r.begin(), r.end(), ref.begin() + i * sc);
  }
  fw::host::gemm_strided_batched(ctx, fw::Trans::transpose, fw::Trans::none, m, n, k, 0.5f,
                                 a.data(), m, sa, b.data(), n, sb, 2.0f, c.data(), n, sc, batch);
  // fp32 accumulation over k = 9 products of magnitude < 1: 1e-5 absolute is ample.
  ft::expect_close(ft::to_double(c), ref, 1e-5, 1e-6, "strided batched");
}

TEST(HostGemm, BadLeadingDimensionIsAShapeError) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> a(64), b(64), c(64);
  EXPECT_THROW(fw::host::gemm(ctx, fw::Trans::none, fw::Trans::none, 4, 4, 4, 1.0f, a.data(), 3,
                              b.data(), 4, 0.0f, c.data(), 4),
               fw::ShapeError);
  EXPECT_THROW(fw::host::gemm(ctx, fw::Trans::none, fw::Trans::transpose, 4, 5, 3, 1.0f, a.data(),
                              3, b.data(), 2, 0.0f, c.data(), 5),
               fw::ShapeError);
  EXPECT_THROW(fw::host::gemm(ctx, fw::Trans::none, fw::Trans::none, 2, 4, 2, 1.0f, a.data(), 2,
                              b.data(), 4, 0.0f, c.data(), 3),
               fw::ShapeError);
  EXPECT_THROW(fw::host::gemm(ctx, fw::Trans::none, fw::Trans::none, -1, 4, 2, 1.0f, a.data(), 2,
                              b.data(), 4, 0.0f, c.data(), 4),
               fw::ShapeError);
}

TEST(HostGemm, ZeroKScalesC) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> c{1.0f, -2.0f, 3.0f, 4.0f};
  fw::host::gemm(ctx, fw::Trans::none, fw::Trans::none, 2, 2, 0, 1.0f,
                 static_cast<const float*>(nullptr), 1, static_cast<const float*>(nullptr), 2, 0.5f,
                 c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, -1.0f, 1.5f, 2.0f}));
}

// The bias (and GELU) epilogue: against a double reference (op(A)·op(B) + bias, then GELU's tanh
// form), and bit for bit the unfused sequence the layers ran before (gemm, bias_add,
// gelu_forward), which keeps every host result and golden test unchanged; the padding columns of
// C and of the GELU input stay untouched.
template <class T>
void check_gemm_bias(const GemmCase& g, bool gelu, std::uint32_t seed) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const Operands<T> ops(g, seed);
  const std::int64_t lda = ops.lda, ldb = ops.ldb, ldc = ops.ldc;
  const auto& a = ops.a;
  const auto& b = ops.b;
  const auto bias = ft::random_typed<T>(static_cast<std::size_t>(g.n), seed + 2);
  const auto c0 = ft::random_typed<T>(static_cast<std::size_t>(g.m * ldc), seed + 3);
  auto c = c0, pre = c0;
  fw::host::gemm_bias(ctx, g.ta, g.tb, g.m, g.n, g.k, a.data(), lda, b.data(), ldb, bias.data(),
                      c.data(), ldc, gelu ? pre.data() : nullptr);
  // the unfused sequence, row by row where C is padded
  auto u = c0, upre = c0;
  T* y = gelu ? upre.data() : u.data();
  fw::host::gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, y, ldc);
  for (std::int64_t r = 0; r < g.m; ++r) {
    fw::host::bias_add(ctx, y + r * ldc, bias.data(), 1, g.n);
    if (gelu) fw::host::gelu_forward(ctx, u.data() + r * ldc, y + r * ldc, g.n);
  }
  const std::string what =
      ::testing::PrintToString(std::make_tuple(g.m, g.n, g.k, static_cast<int>(g.ta),
                                               static_cast<int>(g.tb), g.pad, gelu)) +
      " " + ft::type_name<T>();
  for (std::size_t i = 0; i < c.size(); ++i) {
    ASSERT_EQ(fw::convert<float>(c[i]), fw::convert<float>(u[i])) << what << " at " << i;
    if (gelu) {
      ASSERT_EQ(fw::convert<float>(pre[i]), fw::convert<float>(upre[i])) << what;
    }
  }
  // the double reference
  GemmCase one = g;
  one.alpha = 1.0f;
  one.beta = 0.0f;
  const std::vector<double> c0d = ft::to_double(c0);
  auto ref = reference(one, ft::to_double(a), lda, ft::to_double(b), ldb, c0d, ldc);
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      double& v = ref[static_cast<std::size_t>(i * ldc + j)];
      if (j >= g.n) {
        v = c0d[static_cast<std::size_t>(i * ldc + j)];
        continue;
      }
      v += fw::convert<double>(bias[static_cast<std::size_t>(j)]);
      if (gelu) {
        const double x = v;
        v = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
      }
    }
  }
  // fp32 accumulation (k products < 1), then the GEMM's output (|.| <= k) rounded to T before the
  // bias is added: an absolute error of a few units of T at that magnitude
  const double acc_err = 4.0 * static_cast<double>(g.k) * static_cast<double>(g.k + 1) * 0x1p-24;
  const double rounding = 4.0 * ft::unit_roundoff<T>() * static_cast<double>(g.k + 1);
  ft::expect_close(ft::to_double(c), ref, acc_err + rounding + 1e-5, 4 * ft::unit_roundoff<T>(),
                   what);
}

TEST(HostGemm, BiasAndGeluEpilogueIsTheUnfusedSequence) {
  std::uint32_t seed = 500;
  for (const GemmCase& g : cases()) {
    for (bool gelu : {false, true}) {
      check_gemm_bias<float>(g, gelu, seed += 4);
      check_gemm_bias<fw::bf16>(g, gelu, seed += 4);
      check_gemm_bias<fw::fp16>(g, gelu, seed += 4);
    }
  }
}

// The backward epilogues (host/gemm_epilogue.hpp): bitwise the unfused sequence a layer called
// before them, and against a double reference. B is the dense (k, n) output gradient (ldb = n);
// C keeps the case's padding where no bias gradient reduces it.
template <class T>
void check_backward_epilogues(const GemmCase& g, std::uint32_t seed) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t lda = fw::detail::stored_cols(g.ta, g.m, g.k) + g.pad;
  const auto a = ft::random_typed<T>(
      static_cast<std::size_t>(fw::detail::stored_rows(g.ta, g.m, g.k) * lda), seed);
  const auto b = ft::random_typed<T>(static_cast<std::size_t>(g.k * g.n), seed + 1);
  const auto c0 = ft::random_typed<T>(static_cast<std::size_t>(g.m * g.n), seed + 2);
  const auto db0 = ft::random_typed<T>(static_cast<std::size_t>(g.n), seed + 3);
  const std::string what =
      ::testing::PrintToString(std::make_tuple(g.m, g.n, g.k, static_cast<int>(g.ta), g.pad)) +
      " " + ft::type_name<T>();
  const auto colsum = [&](const std::vector<double>& v, std::int64_t rows, std::int64_t ld) {
    std::vector<double> r(static_cast<std::size_t>(g.n), 0.0);
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < g.n; ++j) r[j] += v[i * ld + j];
    }
    return r;
  };
  GemmCase plain = g;
  plain.tb = fw::Trans::none;
  plain.alpha = 1.0f;
  {  // gemm_bgrad: c += op(A)·B, dbias += Σ_rows B
    auto c = c0, db = db0, u = c0, udb = db0;
    fw::host::gemm_bgrad(ctx, g.ta, fw::Trans::none, g.m, g.n, g.k, a.data(), lda, b.data(), g.n,
                         c.data(), g.n, db.data());
    fw::host::gemm(ctx, g.ta, fw::Trans::none, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), g.n,
                   1.0f, u.data(), g.n);
    fw::host::bias_backward(ctx, udb.data(), b.data(), g.k, g.n);
    for (std::size_t i = 0; i < c.size(); ++i) {
      ASSERT_EQ(fw::convert<float>(c[i]), fw::convert<float>(u[i])) << what << " at " << i;
    }
    for (std::size_t i = 0; i < db.size(); ++i) {
      ASSERT_EQ(fw::convert<float>(db[i]), fw::convert<float>(udb[i])) << what << " dbias " << i;
    }
    plain.beta = 1.0f;
    const auto ref =
        reference(plain, ft::to_double(a), lda, ft::to_double(b), g.n, ft::to_double(c0), g.n);
    const double acc = 4.0 * static_cast<double>(g.k) * static_cast<double>(g.k + 1) * 0x1p-24;
    ft::expect_close(ft::to_double(c), ref, acc + 4.0 * ft::unit_roundoff<T>() * (g.k + 2) + 1e-6,
                     4 * ft::unit_roundoff<T>(), "gemm_bgrad " + what);
    auto dref = colsum(ft::to_double(b), g.k, g.n);
    for (std::int64_t j = 0; j < g.n; ++j) dref[j] += fw::convert<double>(db0[j]);
    ft::expect_close(ft::to_double(db), dref, acc + 4.0 * ft::unit_roundoff<T>() * (g.k + 2),
                     4 * ft::unit_roundoff<T>(), "gemm_bgrad dbias " + what);
  }
  for (bool grad : {false, true}) {  // gemm_dgelu: c = gelu'(pre) ⊙ (op(A)·B), dbias += Σ c
    const std::int64_t ldc = grad ? g.n : g.n + g.pad;
    const auto pre =
        ft::random_typed<T>(static_cast<std::size_t>(g.m * ldc), seed + 4, -3.0f, 3.0f);
    const auto cs = ft::random_typed<T>(static_cast<std::size_t>(g.m * ldc), seed + 5);
    auto c = cs, db = db0, u = cs, udb = db0, prod = cs;
    fw::host::gemm_dgelu(ctx, g.ta, fw::Trans::none, g.m, g.n, g.k, a.data(), lda, b.data(), g.n,
                         pre.data(), c.data(), ldc, grad ? db.data() : nullptr);
    fw::host::gemm(ctx, g.ta, fw::Trans::none, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), g.n,
                   0.0f, prod.data(), ldc);
    for (std::int64_t r = 0; r < g.m; ++r) {
      fw::host::gelu_backward(ctx, u.data() + r * ldc, pre.data() + r * ldc, prod.data() + r * ldc,
                              g.n);
    }
    if (grad) fw::host::bias_backward(ctx, udb.data(), u.data(), g.m, g.n);
    const std::string w = "gemm_dgelu " + what + (grad ? " +bgrad" : "");
    for (std::size_t i = 0; i < c.size(); ++i) {
      ASSERT_EQ(fw::convert<float>(c[i]), fw::convert<float>(u[i])) << w << " at " << i;
    }
    for (std::size_t i = 0; i < db.size(); ++i) {
      ASSERT_EQ(fw::convert<float>(db[i]), fw::convert<float>(udb[i])) << w << " dbias " << i;
    }
    plain.beta = 0.0f;
    auto ref =
        reference(plain, ft::to_double(a), lda, ft::to_double(b), g.n, ft::to_double(cs), ldc);
    for (std::int64_t i = 0; i < g.m; ++i) {
      for (std::int64_t j = 0; j < g.n; ++j) {
        const double x = fw::convert<double>(pre[i * ldc + j]);
        const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
        const double d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 *
                                               (1.0 + 3 * 0.044715 * x * x);
        ref[i * ldc + j] *= d;
      }
    }
    // the product rounded to T before GELU's derivative (|gelu'| < 1.13) scales it
    const double acc = 4.0 * static_cast<double>(g.k) * static_cast<double>(g.k + 1) * 0x1p-24;
    const double err = 1.13 * (acc + 4.0 * ft::unit_roundoff<T>() * (g.k + 1)) + 1e-5;
    ft::expect_close(ft::to_double(c), ref, err, 4 * ft::unit_roundoff<T>(), w);
    if (grad) {
      auto dref = colsum(ref, g.m, ldc);
      for (std::int64_t j = 0; j < g.n; ++j) dref[j] += fw::convert<double>(db0[j]);
      ft::expect_close(ft::to_double(db), dref, g.m * err + 4.0 * ft::unit_roundoff<T>() * g.m,
                       4 * ft::unit_roundoff<T>(), w + " dbias");
    }
  }
}

TEST(HostGemm, BackwardEpiloguesAreTheUnfusedSequence) {
  std::uint32_t seed = 800;
  for (const GemmCase& g : cases()) {
    if (g.tb != fw::Trans::none) continue;  // B is the output gradient, stored as it is
    check_backward_epilogues<float>(g, seed += 6);
    check_backward_epilogues<fw::bf16>(g, seed += 6);
    check_backward_epilogues<fw::fp16>(g, seed += 6);
  }
}

TEST(HostGemm, BiasGradientEpilogueRefusesATransposedOrPaddedGradient) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> a(12, 1.0f), b(12, 1.0f), c(9, 0.0f), db(3, 0.0f);
  const auto refused = [&](fw::Trans tb, std::int64_t ldb) {
    try {
      fw::host::gemm_bgrad(ctx, fw::Trans::none, tb, 3, 3, 3, a.data(), 3, b.data(), ldb, c.data(),
                           3, db.data());
    } catch (const fw::ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("B must be the dense (k, n) = (3, 3) output gradient"),
                std::string::npos)
          << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused(fw::Trans::transpose, 3));
  EXPECT_TRUE(refused(fw::Trans::none, 4));
  EXPECT_FALSE(refused(fw::Trans::none, 3));
  EXPECT_EQ(db[0], 3.0f);  // the accepted call reduced B's three rows of ones
}
