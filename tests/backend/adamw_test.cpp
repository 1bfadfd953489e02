#include "fourway/backend/host/adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {
/// torch.optim.AdamW (foreach=False, amsgrad=False, maximize=False) written out in double.
void adamw_ref(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
               const std::vector<double>& grad, const fw::AdamWStep& s) {
  const double lr = s.lr, b1 = s.beta1, b2 = s.beta2, eps = s.eps, wd = s.weight_decay;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double g = grad[i] * static_cast<double>(s.grad_scale);
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * g;
    v[i] = b2 * v[i] + (1.0 - b2) * g * g;
    const double bc1 = 1.0 - std::pow(b1, s.step);
    const double bc2 = 1.0 - std::pow(b2, s.step);
    const double denom = std::sqrt(v[i]) / std::sqrt(bc2) + eps;
    p[i] -= (lr / bc1) * m[i] / denom;
  }
}
}  // namespace

template <class T>
class HostAdamW : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostAdamW, Dtypes);

TYPED_TEST(HostAdamW, MatchesPyTorchAlgorithmOverSteps) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  for (float wd : {0.0f, 0.1f}) {
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1023}}) {
      auto master = ft::random_floats(static_cast<std::size_t>(n), 90);
      std::vector<float> m(master.size(), 0.0f), v(master.size(), 0.0f);
      std::vector<T> working(master.size());
      auto pd = ft::to_double(master);
      std::vector<double> md(pd.size(), 0.0), vd(pd.size(), 0.0);
      for (int step = 1; step <= 6; ++step) {
        const auto grad =
            ft::random_typed<T>(master.size(), 100 + static_cast<std::uint32_t>(step), -2.0f, 2.0f);
        const fw::AdamWStep s{3e-3f, 0.9f, 0.95f, 1e-8f, wd, step == 3 ? 0.5f : 1.0f, step};
        fw::host::adamw_update(ctx, master.data(), m.data(), v.data(), working.data(), grad.data(),
                               n, s);
        adamw_ref(pd, md, vd, ft::to_double(grad), s);
      }
      // fp32 per-element arithmetic over 6 steps: a few ulps of p (|p| < 1) and of the moments
      ft::expect_close(ft::to_double(master), pd, 1e-6, 1e-6, "master");
      ft::expect_close(ft::to_double(m), md, 1e-6, 1e-5, "m");
      ft::expect_close(ft::to_double(v), vd, 1e-6, 1e-5, "v");
      // the working copy is the master rounded once to T
      ft::expect_close_t(working, pd, 1e-6, ft::unit_roundoff<T>(), "working copy");
    }
  }
}

TEST(HostAdamW, EpsIsOutsideTheSquareRoot) {
  // With gradients ~1e-3 (sqrt(v_hat) ~ 1e-3) and eps = 1e-3, eps outside the root
  // (PyTorch) and inside it differ by ~30% in the step; the reference is PyTorch's form.
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  auto master = ft::random_floats(64, 3);
  const auto grad = ft::random_floats(64, 4, -2e-3f, 2e-3f);
  std::vector<float> m(64, 0.0f), v(64, 0.0f);
  auto pd = ft::to_double(master);
  std::vector<double> md(64, 0.0), vd(64, 0.0);
  const fw::AdamWStep s{1e-2f, 0.9f, 0.999f, 1e-3f, 0.0f, 1.0f, 1};
  fw::host::adamw_update(ctx, master.data(), m.data(), v.data(), static_cast<float*>(nullptr),
                         grad.data(), 64, s);
  adamw_ref(pd, md, vd, ft::to_double(grad), s);
  // fp32 arithmetic on |p| < 1: 1e-6 absolute, while the eps placement would move p by ~1e-3
  ft::expect_close(ft::to_double(master), pd, 1e-6, 1e-6, "master with a large eps");
}

TEST(HostAdamW, NullWorkingCopyAndFp32Grad) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  auto master = ft::random_floats(127, 1);
  const auto grad = ft::random_floats(127, 2);
  std::vector<float> m(127, 0.0f), v(127, 0.0f);
  auto pd = ft::to_double(master);
  std::vector<double> md(127, 0.0), vd(127, 0.0);
  const fw::AdamWStep s{1e-2f, 0.8f, 0.99f, 1e-6f, 0.01f, 2.0f, 4};  // step 4 without history
  fw::host::adamw_update(ctx, master.data(), m.data(), v.data(), static_cast<fw::bf16*>(nullptr),
                         grad.data(), 127, s);
  adamw_ref(pd, md, vd, ft::to_double(grad), s);
  ft::expect_close(ft::to_double(master), pd, 1e-6, 1e-6, "master");
}

TEST(HostAdamW, StepMustStartAtOne) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> p(4, 1.0f), m(4), v(4), g(4, 1.0f);
  fw::AdamWStep s;
  s.step = 0;
  EXPECT_THROW(fw::host::adamw_update(ctx, p.data(), m.data(), v.data(),
                                      static_cast<float*>(nullptr), g.data(), 4, s),
               fw::ConfigError);
}

// The multi-tensor form: 30 tensors of mixed sizes (an empty one among them), every other one
// without weight decay, 4 steps with a grad scale, against the double reference of each tensor
// with its own decay; the working copies are the masters rounded once.
TYPED_TEST(HostAdamW, ListAppliesDecayPerTensorAndMatchesTheReference) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  constexpr int count = 30;
  std::vector<std::vector<float>> master(count), m(count), v(count);
  std::vector<std::vector<T>> working(count);
  std::vector<std::vector<double>> pd(count), md(count), vd(count);
  for (int t = 0; t < count; ++t) {
    const auto n = static_cast<std::size_t>(t == 4 ? 0 : (t * 37) % 300 + 1);
    master[t] = ft::random_floats(n, 500 + static_cast<std::uint32_t>(t));
    m[t].assign(n, 0.0f);
    v[t].assign(n, 0.0f);
    working[t].resize(n);
    pd[t] = ft::to_double(master[t]);
    md[t].assign(n, 0.0);
    vd[t].assign(n, 0.0);
  }
  for (int step = 1; step <= 4; ++step) {
    const fw::AdamWStep s{2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step == 2 ? 0.25f : 1.0f, step};
    std::vector<std::vector<T>> grads(count);
    std::vector<fw::AdamWTensor<T, T>> list;
    for (int t = 0; t < count; ++t) {
      grads[t] = ft::random_typed<T>(master[t].size(),
                                     900 + static_cast<std::uint32_t>(step * 40 + t), -2.0f, 2.0f);
      list.push_back({master[t].data(), m[t].data(), v[t].data(), working[t].data(),
                      grads[t].data(), static_cast<std::int64_t>(master[t].size()), t % 2 == 0});
      fw::AdamWStep own = s;
      own.weight_decay = t % 2 == 0 ? s.weight_decay : 0.0f;
      adamw_ref(pd[t], md[t], vd[t], ft::to_double(grads[t]), own);
    }
    fw::host::adamw_update_list(ctx, list, s);
  }
  for (int t = 0; t < count; ++t) {
    const std::string what = "tensor " + std::to_string(t);
    ft::expect_close(ft::to_double(master[t]), pd[t], 1e-6, 1e-6, what + " master");
    ft::expect_close(ft::to_double(m[t]), md[t], 1e-6, 1e-5, what + " m");
    ft::expect_close(ft::to_double(v[t]), vd[t], 1e-6, 1e-5, what + " v");
    ft::expect_close_t(working[t], pd[t], 1e-6, ft::unit_roundoff<T>(), what + " working");
  }
}
