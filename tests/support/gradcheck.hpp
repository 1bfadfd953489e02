//! Test-only gradient check of an activation layer against a double-precision reference:
//! forward vs the reference, backward (input and parameter gradients) vs central finite
//! differences of the reference, and `+=` accumulation (a second backward doubles every
//! parameter gradient bit for bit).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/layers/layer.hpp"
#include "support/reference.hpp"
#include "support/util.hpp"

namespace fourway::test {

using RefForward = std::function<ref::Vec(const ref::Params&, const ref::Vec&)>;

/// Fills every parameter of `layer` with random values (gains near 1, the rest normal with
/// `std`) and returns them, rounded to T, by name.
template <class L>
ref::Params randomize_parameters(const Context<typename L::backend_type>& ctx, L& layer,
                                 std::uint64_t seed, double std = 0.3) {
  using T = typename L::value_type;
  ref::Params params;
  layer.visit_parameters([&](Parameter<T, typename L::backend_type>& p) {
    const bool gain = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
    auto v = rounded<T>(gain ? randn(static_cast<std::size_t>(p.numel()), seed++, 0.2, 1.0)
                             : randn(static_cast<std::size_t>(p.numel()), seed++, std));
    upload(ctx, p.weight, v);
    params[p.name] = v;
  });
  return params;
}

/// Tolerances: `fwd_rel` for the output, `grad_rel` for gradients (see docs/layers.md).
template <class L>
void check_layer_gradients(L& layer, Shape x_shape, const RefForward& reference,
                           double fwd_rel = 2e-5, double grad_rel = 1e-4, std::uint64_t seed = 7) {
  using T = typename L::value_type;
  using B = typename L::backend_type;
  MemoryAccountant mem;
  Context<B> ctx(mem);
  ref::Params params = randomize_parameters(ctx, layer, seed);
  zero_grad(ctx, layer);
  Tensor<T, B> x(x_shape, MemTag::activations, mem);
  ref::Vec xv = rounded<T>(randn(static_cast<std::size_t>(x.numel()), seed + 100));
  upload(ctx, x, xv);

  typename L::Stash s;
  Tensor<T, B> y = layer.forward(ctx, x, s);
  const ref::Vec want_y = reference(params, xv);
  ASSERT_TRUE(close(download(ctx, y), want_y, fwd_rel, "forward"));

  const ref::Vec r = rounded<T>(randn(want_y.size(), seed + 200));
  Tensor<T, B> dy(y.shape(), MemTag::workspace, mem);
  upload(ctx, dy, r);
  Tensor<T, B> dx = layer.backward(ctx, dy, s);
  EXPECT_EQ(mem.current(MemTag::activations), static_cast<std::size_t>(x.bytes()))
      << "backward must free the stash";

  ref::Vec xfd = xv;
  const ref::Vec want_dx =
      ref::finite_difference(xfd, [&] { return ref::dot(reference(params, xfd), r); });
  EXPECT_TRUE(close(download(ctx, dx), want_dx, grad_rel, "d input"));

  std::vector<std::vector<T>> first;
  layer.visit_parameters([&](Parameter<T, B>& p) {
    ref::Vec& pv = params[p.name];
    const ref::Vec want =
        ref::finite_difference(pv, [&] { return ref::dot(reference(params, xv), r); });
    EXPECT_TRUE(close(download(ctx, p.grad), want, grad_rel, "d " + p.name));
    first.push_back(download_raw(ctx, p.grad));
  });

  // A second micro-batch with the same data: gradients accumulate, exactly doubling.
  (void)layer.forward(ctx, x, s);
  (void)layer.backward(ctx, dy, s);
  std::size_t i = 0;
  layer.visit_parameters([&](Parameter<T, B>& p) {
    const auto again = download_raw(ctx, p.grad);
    for (std::size_t k = 0; k < again.size(); ++k) {
      const float twice = 2.0f * convert<float>(first[i][k]);
      ASSERT_EQ(convert<float>(again[k]), twice) << p.name << "[" << k << "] did not accumulate";
    }
    ++i;
  });
}

}  // namespace fourway::test
