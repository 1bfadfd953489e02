//! A gradient checker for hand-written backward passes: `check_gradients` compares what a layer's
//! (or a model's) `backward` computes with central finite differences of its own `forward`.
//!
//! fourway has no autograd, so every layer and model a user writes carries a backward by hand;
//! this is the first test such code needs. For an activation layer the checked function is
//! f(x, θ) = Σ r ⊙ forward(x) with a fixed pseudo-random probe r in [-1, 1] (so dL/dy = r);
//! for a model it is the loss `forward` returns. The analytic gradients are one `backward`
//! (parameter gradients zeroed first; the layer's input gradient for a layer). The numeric ones
//! are (f(w + h) − f(w − h)) / 2h per checked element, every sum taken in double: all elements of a
//! tensor of at most `samples` elements, else `samples` of them spread over the tensor. h is
//! `step` · max(1, |w|). The error of an element is |analytic − numeric| / max(|analytic|,
//! |numeric|, floor), the floor being `floor` times the tensor's largest analytic gradient, so an
//! element whose gradient is near zero is judged against its tensor's scale, not against its own
//! rounding. The report names every parameter (and "input") with its worst error, where it is and
//! both values; `worst()` is the largest. The layer runs in its own element type: check it built
//! with float (a 16-bit layer's rounding swamps any finite difference), where a correct backward
//! lands near 1e-3 with the default step and a wrong one far above (docs/layers.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/parameter.hpp"

namespace fourway {

/// How `check_gradients` probes.
struct GradientCheckOptions {
  double step = 1e-2;         // h = step · max(1, |w|)
  std::int64_t samples = 24;  // elements checked per tensor (all of a smaller one)
  double floor = 1e-2;        // of the tensor's largest |analytic gradient|, the error's floor
  std::uint64_t seed = 7;     // the probe r of a layer's output
};

/// The worst element of one checked tensor.
struct GradientError {
  std::string name;          // the parameter's name, or "input"
  double error = 0.0;        // relative, see the file comment
  std::int64_t element = 0;  // flattened index of the worst element
  double analytic = 0.0;     // backward's value there
  double numeric = 0.0;      // the finite difference there
  std::int64_t checked = 0;  // elements compared
};

/// Every checked tensor, in visit order (the input last).
struct GradientReport {
  std::vector<GradientError> tensors;

  /// The tensor with the largest error (an empty report: a default entry).
  [[nodiscard]] GradientError worst() const {
    GradientError w;
    for (const auto& t : tensors)
      if (t.error >= w.error) w = t;
    return w;
  }
  /// Whether every tensor's worst error is at most `tolerance`.
  [[nodiscard]] bool within(double tolerance) const { return worst().error <= tolerance; }
  /// The entry of `name`, or null.
  [[nodiscard]] const GradientError* find(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  /// One line per tensor: name, worst error, the element and both values.
  [[nodiscard]] std::string str() const {
    std::ostringstream out;
    out.precision(4);
    for (const auto& t : tensors) {
      out << t.name << ": worst relative error " << t.error << " at element " << t.element
          << " (backward " << t.analytic << ", finite difference " << t.numeric << "; " << t.checked
          << " checked)\n";
    }
    return out.str();
  }
};

namespace detail {

/// `v` as a T (through float for float).
template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return convert<T>(static_cast<float>(v));
  }
}

/// The elements of a tensor of `n` to check: all, or `samples` spread evenly with an offset.
inline std::vector<std::int64_t> checked_elements(std::int64_t n, std::int64_t samples) {
  std::vector<std::int64_t> out;
  if (n <= samples) {
    for (std::int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (std::int64_t k = 0; k < samples; ++k) out.push_back((k * n + n / (2 * samples)) / samples);
  return out;
}

/// Compares `analytic` (host, one value per element of `values`) with central differences of
/// `f` when element i of `values` moves by ±h; `values` is restored.
template <class T, class B>
GradientError compare_with_differences(const Context<B>& ctx, const std::string& name, T* values,
                                       std::int64_t n, const std::vector<double>& analytic,
                                       const std::function<double()>& f,
                                       const GradientCheckOptions& o) {
  GradientError e;
  e.name = name;
  double scale = 0.0;
  for (const double a : analytic) scale = std::max(scale, std::abs(a));
  const double floor = std::max(o.floor * scale, 1e-12);
  for (const std::int64_t i : checked_elements(n, o.samples)) {
    T w{};
    Ops<B>::to_host(ctx, &w, values + i, 1);
    const double w0 = convert<double>(w);
    const double h = o.step * std::max(1.0, std::abs(w0));
    const auto at = [&](double v) {
      const T t = from_double<T>(v);
      Ops<B>::from_host(ctx, values + i, &t, 1);
      return f();
    };
    const double up = at(w0 + h), down = at(w0 - h);
    Ops<B>::from_host(ctx, values + i, &w, 1);
    // the step actually taken, after rounding to T
    const double taken =
        convert<double>(from_double<T>(w0 + h)) - convert<double>(from_double<T>(w0 - h));
    const double numeric = (up - down) / taken;
    const double a = analytic[static_cast<std::size_t>(i)];
    const double err = std::abs(a - numeric) / std::max({std::abs(a), std::abs(numeric), floor});
    if (e.checked == 0 || err > e.error) {
      e.error = err;
      e.element = i;
      e.analytic = a;
      e.numeric = numeric;
    }
    ++e.checked;
  }
  return e;
}

template <class T, class B>
std::vector<double> host_values(const Context<B>& ctx, const Tensor<T, B>& t) {
  std::vector<T> v(static_cast<std::size_t>(t.numel()));
  if (!v.empty()) Ops<B>::to_host(ctx, v.data(), t.data(), t.numel());
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = convert<double>(v[i]);
  return out;
}

/// Every parameter of `m`: its backward gradient (from one `backward()` after zeroing) against
/// the differences of `f`, appended to `report`.
template <class T, class B, class M>
void check_parameters(const Context<B>& ctx, M& m, const std::function<double()>& f,
                      const GradientCheckOptions& o, GradientReport& report) {
  std::vector<Parameter<T, B>*> params;
  m.visit_parameters([&](Parameter<T, B>& p) { params.push_back(&p); });
  std::vector<std::vector<double>> grads;
  for (auto* p : params) {
    check<ConfigError>(p->weight.data() != nullptr && p->grad.data() != nullptr,
                       "fourway: check_gradients needs every parameter materialised; ", p->name,
                       " has no storage (a deferred model: materialize it first)");
    grads.push_back(host_values(ctx, p->grad));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    report.tensors.push_back(compare_with_differences(
        ctx, params[i]->name, params[i]->weight.data(), params[i]->numel(), grads[i], f, o));
  }
}

template <class T>
constexpr void require_checkable() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "fourway: check_gradients runs the layer in its own element type, and a bf16 or "
                "fp16 layer's rounding swamps any finite difference: build the layer with float "
                "for the check (docs/layers.md)");
}

}  // namespace detail

/// Checks `layer`'s backward at input `x` (its input gradient too, when it returns one) against
/// central finite differences of its forward; see the file comment. Parameter gradients are
/// left as one backward set them.
template <activation_layer L>
GradientReport check_gradients(const Context<typename L::backend_type>& ctx, L& layer,
                               const Tensor<typename L::value_type, typename L::backend_type>& x,
                               const GradientCheckOptions& o = {}) {
  using T = typename L::value_type;
  using B = typename L::backend_type;
  detail::require_checkable<T>();
  std::vector<double> r;
  const auto objective = [&]() {
    typename L::Stash s;
    const Tensor<T, B> y = layer.forward(ctx, x, s);
    const std::vector<double> yv = detail::host_values(ctx, y);
    if (r.empty()) {  // the probe: the init's counter-based stream of the seed, in (-1, 1)
      r.resize(yv.size());
      for (std::size_t i = 0; i < r.size(); ++i) r[i] = 2.0 * detail::init_uniform(o.seed, i) - 1.0;
    }
    double f = 0.0;
    for (std::size_t i = 0; i < yv.size(); ++i) f += r[i] * yv[i];
    return f;
  };
  (void)objective();  // fixes r
  zero_grad(ctx, layer);
  typename L::Stash s;
  const Tensor<T, B> y = layer.forward(ctx, x, s);
  Tensor<T, B> dy(y.shape(), MemTag::workspace, ctx.memory());
  std::vector<T> rt(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) rt[i] = detail::from_double<T>(r[i]);
  if (!rt.empty()) Ops<B>::from_host(ctx, dy.data(), rt.data(), dy.numel());
  const Tensor<T, B> dx = layer.backward(ctx, dy, s);
  GradientReport report;
  detail::check_parameters<T, B>(ctx, layer, objective, o, report);
  if (!dx.empty()) {
    report.tensors.push_back(detail::compare_with_differences(
        ctx, "input", x.data(), x.numel(), detail::host_values(ctx, dx), objective, o));
  }
  return report;
}

/// Checks a model's backward against central finite differences of the loss its `forward`
/// returns for `tokens` and `targets` (no input gradient: token ids have none). `hooks` are
/// passed to every forward and backward (fw::NoHooks for a model on one rank).
template <class M, class Hooks>
GradientReport check_gradients(const Context<typename M::backend_type>& ctx, M& model,
                               const Tensor<std::int32_t, typename M::backend_type>& tokens,
                               const Tensor<std::int32_t, typename M::backend_type>& targets,
                               Hooks& hooks, const GradientCheckOptions& o = {}) {
  using T = typename M::value_type;
  using B = typename M::backend_type;
  detail::require_checkable<T>();
  const auto objective = [&]() {
    typename M::Stash s;
    const double loss = model.forward(ctx, tokens, targets, s, hooks);
    // a strategy's hooks expect each forward's backward (ZeRO-3 keeps the last unit gathered for
    // it): one at scale 0 closes the pair and adds zero gradients. Without hooks the stash is
    // just dropped, a third of the cost of each evaluation.
    if constexpr (!std::is_same_v<std::remove_cvref_t<Hooks>, NoHooks>) {
      model.backward(ctx, s, 0.0f, hooks);
    }
    return loss;
  };
  zero_grad(ctx, model);
  {
    typename M::Stash s;
    (void)model.forward(ctx, tokens, targets, s, hooks);
    model.backward(ctx, s, 1.0f, hooks);
  }
  GradientReport report;
  detail::check_parameters<T, B>(ctx, model, objective, o, report);
  return report;
}

}  // namespace fourway
