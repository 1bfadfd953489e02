#include "fourway/backend/host/bias.hpp"

#include <gtest/gtest.h>

#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

template <class T>
class HostBias : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostBias, Dtypes);

TYPED_TEST(HostBias, AddAndBackwardMatchReference) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t shapes[][2] = {{1, 1}, {7, 5}, {127, 33}, {1023, 64}};
  std::uint32_t seed = 10;
  for (const auto& [rows, cols] : shapes) {
    const auto n = static_cast<std::size_t>(rows * cols);
    auto out = ft::random_typed<T>(n, ++seed);
    const auto bias = ft::random_typed<T>(static_cast<std::size_t>(cols), ++seed);
    const auto out0 = ft::to_double(out);
    const auto b0 = ft::to_double(bias);
    std::vector<double> ref(n);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) ref[r * cols + c] = out0[r * cols + c] + b0[c];
    }
    fw::host::bias_add(ctx, out.data(), bias.data(), rows, cols);
    // one fp32 add, one rounding to T
    ft::expect_close_t(out, ref, 1e-7, ft::unit_roundoff<T>(), "bias_add");

    // backward: dbias += column sums of dout, checked against finite differences of
    // L(bias) = sum w * (out0 + bias) in double (exact for this linear map up to 1e-10).
    const auto dout = ft::random_typed<T>(n, ++seed);
    auto dbias = ft::random_typed<T>(static_cast<std::size_t>(cols), ++seed);
    const auto dbias0 = ft::to_double(dbias);
    const auto fd = ft::finite_difference(
        [&](const std::vector<double>& b) {
          std::vector<double> y(n);
          for (std::int64_t r = 0; r < rows; ++r) {
            for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] = out0[r * cols + c] + b[c];
          }
          return y;
        },
        b0, ft::to_double(dout));
    std::vector<double> want(static_cast<std::size_t>(cols));
    for (std::int64_t c = 0; c < cols; ++c) want[c] = dbias0[c] + fd[c];
    fw::host::bias_backward(ctx, dbias.data(), dout.data(), rows, cols);
    // fp32 sum of `rows` terms of size < 1 (error <= rows * 2^-24 * rows) + one rounding to T
    const double atol = static_cast<double>(rows * rows) * 0x1p-24 + 1e-8;
    ft::expect_close_t(dbias, want, atol, 2 * ft::unit_roundoff<T>(), "bias_backward");
  }
}
