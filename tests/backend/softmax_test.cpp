#include "fourway/backend/host/softmax.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {
std::vector<double> softmax_ref(const std::vector<double>& x, std::int64_t rows,
                                std::int64_t cols) {
  std::vector<double> y(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double mx = -1e300, s = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) mx = std::max(mx, x[r * cols + c]);
    for (std::int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - mx);
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] = std::exp(x[r * cols + c] - mx) / s;
  }
  return y;
}
}  // namespace

template <class T>
class HostSoftmax : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostSoftmax, Dtypes);

TYPED_TEST(HostSoftmax, ForwardAndFiniteDifferenceBackward) {
  using T = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  const std::int64_t shapes[][2] = {{1, 1}, {1, 9}, {7, 13}, {127, 50}, {1023, 17}};
  std::uint32_t seed = 20;
  for (const auto& [rows, cols] : shapes) {
    const auto n = static_cast<std::size_t>(rows * cols);
    const auto in = ft::random_typed<T>(n, ++seed, -5.0f, 5.0f);
    const auto x = ft::to_double(in);
    std::vector<T> out(n);
    fw::host::softmax_forward(ctx, out.data(), in.data(), rows, cols);
    const auto ref = softmax_ref(x, rows, cols);
    // exp_poly (4 ulp) and an fp32 sum of `cols` terms, then one rounding to T
    ft::expect_close_t(out, ref, 1e-7, ft::unit_roundoff<T>() + 1e-6, "softmax_forward");

    const auto dout = ft::random_typed<T>(n, ++seed);
    std::vector<T> din(n);
    fw::host::softmax_backward(ctx, din.data(), out.data(), dout.data(), rows, cols);
    const auto at = ft::sample_indices(n, 96, seed);
    const auto fd = ft::finite_difference(
        [&](const std::vector<double>& xx) { return softmax_ref(xx, rows, cols); }, x,
        ft::to_double(dout), at);
    // backward reads `out` (rounded to T: relative u) times (dout - dot) with |dout| < 1
    const double atol = 4 * ft::unit_roundoff<T>() + 1e-6;
    ft::expect_close(ft::pick(ft::to_double(din), at), ft::pick(fd, at), atol,
                     4 * ft::unit_roundoff<T>(), "softmax_backward vs FD");
  }
}
