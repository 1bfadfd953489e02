//! Test-only helpers: random host data, copies between host vectors and tensors of any element
//! type and backend, and tolerance checks that report the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway::test {

/// Normal(0, std) values from a fixed seed.
inline std::vector<double> randn(std::size_t n, std::uint64_t seed, double std = 1.0,
                                 double mean = 0.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> d(mean, std);
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

/// Rounds every value to what an element of type T can hold (so the reference sees the same
/// inputs as the layer).
template <class T>
std::vector<double> rounded(std::vector<double> v) {
  for (auto& x : v) x = static_cast<double>(convert<float>(convert<T>(static_cast<float>(x))));
  return v;
}

template <class T, class B>
void upload(const Context<B>& ctx, const Tensor<T, B>& t, const std::vector<double>& v) {
  EXPECT_EQ(static_cast<std::int64_t>(v.size()), t.numel());
  std::vector<T> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) h[i] = convert<T>(static_cast<float>(v[i]));
  Ops<B>::from_host(ctx, t.data(), h.data(), t.numel());
}

template <class T, class B>
std::vector<double> download(const Context<B>& ctx, const Tensor<T, B>& t) {
  std::vector<T> h(static_cast<std::size_t>(t.numel()));
  Ops<B>::to_host(ctx, h.data(), t.data(), t.numel());
  std::vector<double> v(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) v[i] = static_cast<double>(convert<float>(h[i]));
  return v;
}

template <class T, class B>
std::vector<T> download_raw(const Context<B>& ctx, const Tensor<T, B>& t) {
  std::vector<T> h(static_cast<std::size_t>(t.numel()));
  Ops<B>::to_host(ctx, h.data(), t.data(), t.numel());
  return h;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

/// Every |got - want| <= rel * (max|want| + |want|) — relative to the tensor's scale, so tiny
/// elements are not held to an impossible relative bound. Reports the worst element.
inline ::testing::AssertionResult close(const std::vector<double>& got,
                                        const std::vector<double>& want, double rel,
                                        const std::string& what) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs " << want.size();
  }
  const double scale = max_abs(want);
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]) / (scale + std::abs(want[i]) + 1e-30);
    if (!(err <= worst)) {
      worst = err;
      at = i;
    }
  }
  if (worst <= rel) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": element " << at << " is " << got[at] << ", want " << want[at] << " (error "
         << worst << " of scale " << scale << ", allowed " << rel << ")";
}

/// ||got - want||_2 / ||want||_2 <= rel.
inline ::testing::AssertionResult close_l2(const std::vector<double>& got,
                                           const std::vector<double>& want, double rel,
                                           const std::string& what) {
  double num = 0.0;
  double den = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  const double err = std::sqrt(num) / (std::sqrt(den) + 1e-30);
  if (err <= rel && got.size() == want.size()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": relative L2 error " << err << ", allowed " << rel;
}

}  // namespace fourway::test
