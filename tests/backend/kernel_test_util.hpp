//! Helpers for the kernel tests: random inputs, dtype round trips, double-precision comparisons
//! and central finite differences of a double-precision reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fourway/core/dtype.hpp"

namespace fourway_test {

namespace fw = fourway;

/// n uniform values in [lo, hi) from a fixed seed (never all zeros).
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class T>
std::vector<T> to_type(const std::vector<float>& v) {
  std::vector<T> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = fw::convert<T>(v[i]);
  return r;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<double>(fw::convert<float>(v[i]));
  return r;
}

/// Random values already rounded to T, as doubles (the exact inputs the kernel sees).
template <class T>
std::vector<T> random_typed(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  return to_type<T>(random_floats(n, seed, lo, hi));
}

/// Relative precision of one rounding to T (half an ulp at 1).
template <class T>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<T, float>) return 0x1p-24;
  if constexpr (std::is_same_v<T, fw::bf16>) return 0x1p-8;
  return 0x1p-11;
}

/// Spacing of T's smallest subnormals: the absolute error floor of one rounding to T.
template <class T>
constexpr double subnormal_step() {
  if constexpr (std::is_same_v<T, float>) return 0x1p-149;
  if constexpr (std::is_same_v<T, fw::bf16>) return 0x1p-133;
  return 0x1p-24;
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  if constexpr (std::is_same_v<T, fw::bf16>) return "bf16";
  return "fp16";
}

/// Expects |got - ref| <= atol + rtol * |ref| element by element; reports the worst element.
inline void expect_close(const std::vector<double>& got, const std::vector<double>& ref,
                         double atol, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  std::size_t worst = 0;
  double worst_excess = -1.0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double lim = atol + rtol * std::abs(ref[i]);
    const double err = std::abs(got[i] - ref[i]);
    if (!(err <= lim)) ++bad;
    if (!(err - lim <= worst_excess)) {
      worst_excess = err - lim;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; worst ["
                     << worst << "] got " << got[worst] << " want " << ref[worst] << " (atol "
                     << atol << ", rtol " << rtol << ")";
}

template <class T>
void expect_close_t(const std::vector<T>& got, const std::vector<double>& ref, double atol,
                    double rtol, const std::string& what) {
  expect_close(to_double(got), ref, atol, rtol, what);
}

/// Max |x| over v (for tolerances relative to a tensor's scale).
inline double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

/// Gradient of L(x) = sum_i w_i f(x)_i at x, by central differences in double with step h
/// (error O(h^2 f''') + O(eps_double / h): about 1e-10 relative for h = 1e-5 and smooth f).
/// Only the indices in `at` are differentiated (all when empty); the others are left at 0.
inline std::vector<double> finite_difference(
    const std::function<std::vector<double>(const std::vector<double>&)>& f, std::vector<double> x,
    const std::vector<double>& w, std::vector<std::size_t> at = {}, double h = 1e-5) {
  if (at.empty()) {
    at.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) at[i] = i;
  }
  std::vector<double> g(x.size(), 0.0);
  auto loss = [&](const std::vector<double>& xx) {
    const std::vector<double> y = f(xx);
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
    return s;
  };
  for (std::size_t i : at) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2.0 * h);
  }
  return g;
}

/// `count` distinct-ish sample indices in [0, n), always including 0 and n - 1.
inline std::vector<std::size_t> sample_indices(std::size_t n, std::size_t count,
                                               std::uint32_t seed) {
  if (n <= count) {
    std::vector<std::size_t> all(n);
    for (std::size_t i = 0; i < n; ++i) all[i] = i;
    return all;
  }
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::size_t> d(0, n - 1);
  std::vector<std::size_t> s{0, n - 1};
  while (s.size() < count) s.push_back(d(gen));
  return s;
}

/// Keeps only the sampled entries of `v` (for comparing sampled finite differences).
inline std::vector<double> pick(const std::vector<double>& v, const std::vector<std::size_t>& at) {
  std::vector<double> r;
  r.reserve(at.size());
  for (std::size_t i : at) r.push_back(v[i]);
  return r;
}

}  // namespace fourway_test
