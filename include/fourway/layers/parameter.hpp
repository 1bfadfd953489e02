//! `Parameter<T, B>`: one named trainable tensor of a layer — weight, gradient, and whether
//! weight decay applies — plus the deterministic initialisation the layers use.
//!
//! Invariant: layers read `weight.data()` and `grad.data()` at every call and never keep the
//! pointers, so a parallel wrapper may rebind either to a view into a flat, sharded or gathered
//! buffer (ZeRO-3 frees the layer's own storage this way). Gradients accumulate (`+=`).
//! Initial values are a pure function of (seed, parameter name, element index) — a counter-based
//! generator, no stream state — so any slice of any parameter can be computed on its own: a rank
//! that owns elements [a, b) of a parameter computes exactly those, and every mesh starts from
//! bitwise the same weights as one rank.
//!
//! Deferred construction: while a `DeferredInit` is alive on a thread, parameters built on that
//! thread get a shape, a name, a decay flag and an init rule but no storage (weight and grad are
//! views of nothing). A strategy then materialises only what its rank owns
//! (`write_initial_values`); `materialize` gives one parameter its own storage (the one-rank case).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/placement.hpp"

namespace fourway {

/// How a parameter's initial values are made (recorded by `init_normal` / `init_constant`).
struct InitRule {
  enum class Kind : std::uint8_t { none, normal, constant };
  Kind kind = Kind::none;  // none: the values are whatever was written (e.g. loaded)
  std::uint64_t seed = 0;
  float std = 0.0f;    // normal(0, std)
  float value = 0.0f;  // constant
};

namespace detail {
inline int& deferred_depth() {
  thread_local int depth = 0;
  return depth;
}
}  // namespace detail

/// While alive, parameters constructed on this thread allocate nothing (see the file comment).
class DeferredInit {
 public:
  DeferredInit() { ++detail::deferred_depth(); }
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;
  ~DeferredInit() { --detail::deferred_depth(); }
  [[nodiscard]] static bool active() { return detail::deferred_depth() > 0; }
};

template <class T, backend B>
struct Parameter {
  std::string name;  // Hugging Face GPT-2 names in the GPT: "h.0.attn.c_attn.weight"
  Tensor<T, B> weight;
  Tensor<T, B> grad;   // same shape as weight
  bool decay = false;  // weight decay applies (2-D tensors: matrices and embeddings)
  InitRule init;
  /// Trailing rows of the weight that are padding (a vocabulary padded for aligned GEMMs): zero,
  /// with a zero gradient, and absent from checkpoint files, which hold `logical_shape()`.
  std::int64_t padding_rows = 0;
  /// How the unsplit tensor is split over a tensor-parallel group (layers/placement.hpp; its
  /// name is the parameter's): written by the tensor-parallel-ready layers (layers/
  /// parallel_linear.hpp, layers/vocab_parallel.hpp) together with which of `slice_count` slices
  /// this one is. An empty `placement.name`: not described (a plain layer's parameter, whole).
  /// Init rules draw a slice's values from the unsplit tensor's stream (`sliced()`).
  tp::Placement placement{};
  int slice_count = 1;  // N, the group's size
  int slice_index = 0;  // r, this rank's place in it

  Parameter() = default;
  /// Allocates weight (MemTag::weights) and a zeroed gradient (MemTag::grads) of `shape`, or,
  /// under a `DeferredInit`, nothing: weight and grad are views of `shape` at no memory.
  Parameter(const Context<B>& ctx, std::string param_name, Shape shape)
      : name(std::move(param_name)), decay(shape.rank() == 2) {
    if (DeferredInit::active()) {
      weight = Tensor<T, B>::view_of(nullptr, shape);
      grad = Tensor<T, B>::view_of(nullptr, shape);
      return;
    }
    weight = Tensor<T, B>(shape, MemTag::weights, ctx.memory());
    grad = Tensor<T, B>(shape, MemTag::grads, ctx.memory());
    Ops<B>::fill(ctx, grad.data(), grad.numel(), convert<T>(0.0f));
  }

  [[nodiscard]] std::int64_t numel() const { return weight.numel(); }
  /// The shape without the padding rows: what files and cross-mesh checkpoints hold.
  [[nodiscard]] Shape logical_shape() const {
    if (padding_rows == 0) return weight.shape();
    check<ShapeError>(weight.shape().rank() == 2, "fourway: parameter ", name,
                      " has padding rows but is not a matrix: ", weight.shape().str());
    return Shape{weight.shape()[0] - padding_rows, weight.shape()[1]};
  }
  /// Elements of `logical_shape()`: the first ones of the weight (padding rows come last).
  [[nodiscard]] std::int64_t logical_numel() const {
    return padding_rows == 0 ? numel()
                             : numel() / weight.shape()[0] * (weight.shape()[0] - padding_rows);
  }
  /// A part of a larger tensor (a tensor-parallel slice, or a vocabulary padded past its rows):
  /// local element i is not element i of the unsplit tensor.
  [[nodiscard]] bool sliced() const {
    return !placement.name.empty() && placement.local_numel(slice_count) != placement.full_numel();
  }
  /// Described but holding no values (deferred construction, or rebound to nothing).
  [[nodiscard]] bool deferred() const { return weight.data() == nullptr && numel() > 0; }

  /// The weights a layer computes with, checked to be there: a typed error naming the parameter,
  /// before any kernel touches memory, when a strategy holds them released (ZeRO-3 between its
  /// hooks) or nothing ever placed them (a deferred model without a strategy).
  [[nodiscard]] const Tensor<T, B>& bound_weight() const {
    require_bound(weight, "weights");
    return weight;
  }
  /// The gradient a layer's backward adds to, checked the same way (ZeRO-2/3 bind it per unit).
  [[nodiscard]] const Tensor<T, B>& bound_grad() const {
    require_bound(grad, "gradient");
    return grad;
  }

 private:
  void require_bound(const Tensor<T, B>& t, const char* what) const {
    check<ConfigError>(
        t.data() != nullptr || t.numel() == 0, "fourway: parameter ", name, " has no ", what,
        " bound where a layer uses it: a ZeRO-3 strategy (Sharded<3>) holds a unit's weights only "
        "between hooks.pre_forward(u) and post_forward(u) and between pre_backward(u) and "
        "post_backward(u) (ZeRO-2/3 bind its gradients there too), so the model must call the "
        "hooks its forward and backward are given around each unit u that holds ",
        name, " (docs/contracts.md); a deferred model needs a strategy to place its weights");
  }
};

/// Sets every gradient of `model` (anything with `visit_parameters`) to zero.
template <class Model, class B>
void zero_grad(const Context<B>& ctx, Model& model) {
  model.visit_parameters([&](auto& p) {
    using T = typename std::remove_cvref_t<decltype(p.grad)>::value_type;
    Ops<B>::fill(ctx, p.grad.data(), p.grad.numel(), convert<T>(0.0f));
  });
}

/// `p`'s working weights copied to the host as float (a device sync on device backends).
template <class T, class B>
std::vector<float> parameter_values(const Context<B>& ctx, const Parameter<T, B>& p) {
  std::vector<T> host(static_cast<std::size_t>(p.numel()));
  Ops<B>::to_host(ctx, host.data(), p.weight.data(), p.numel());
  std::vector<float> out(host.size());
  for (std::size_t k = 0; k < host.size(); ++k) out[k] = convert<float>(host[k]);
  return out;
}

/// How a layer initialises its parameters: GPT-2 / nanoGPT (Radford et al. 2019; normal with
/// std 0.02, residual output projections 0.02/sqrt(2 * layers), biases 0, LayerNorm gain 1).
struct Init {
  std::uint64_t seed = 0;
  float std = 0.02f;
  float residual_std = 0.02f;  // c_proj weights of attention and MLP
  /// GPT-2's init for a model of `layers` blocks.
  static Init gpt2(std::uint64_t seed, int layers) {
    return Init{seed, 0.02f, 0.02f / std::sqrt(2.0f * static_cast<float>(layers))};
  }
};

namespace detail {
/// The SplitMix64 finaliser (Steele, Lea & Flood 2014) as a counter-based generator: the k-th
/// number of the stream `key` is mix(key + (k+1)·golden), computed without the k-1 before it.
constexpr std::uint64_t splitmix(std::uint64_t key, std::uint64_t k) {
  std::uint64_t z = key + (k + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/// The stream of one parameter: the seed mixed with the name (FNV-1a style).
constexpr std::uint64_t init_key(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = seed ^ 0x9e3779b97f4a7c15ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}
/// Uniform in (0, 1), 53 bits.
constexpr double init_uniform(std::uint64_t key, std::uint64_t k) {
  return (static_cast<double>(splitmix(key, k) >> 11) + 0.5) * 0x1.0p-53;
}
/// Element i of normal(0, 1): Box-Muller on numbers 2i and 2i+1 of the stream, in double so the
/// result is the same on every platform.
inline double init_normal_at(std::uint64_t key, std::int64_t i) {
  const auto k = static_cast<std::uint64_t>(i) * 2;
  return std::sqrt(-2.0 * std::log(init_uniform(key, k))) *
         std::cos(6.283185307179586 * init_uniform(key, k + 1));
}
}  // namespace detail

namespace detail {
/// dst[0, count) = elements [from, from + count) of the unsplit tensor `p`'s init rule draws,
/// through a bounded host buffer.
template <class T, class B>
void write_rule_run(const Context<B>& ctx, const Parameter<T, B>& p, T* dst, std::int64_t from,
                    std::int64_t count) {
  if (p.init.kind == InitRule::Kind::constant) {
    Ops<B>::fill(ctx, dst, count, convert<T>(p.init.value));
    return;
  }
  check<ConfigError>(p.init.kind == InitRule::Kind::normal, "fourway: parameter ", p.name,
                     " holds no values and has no init rule; initialise it (init_normal, "
                     "init_constant) or load it before a strategy places it");
  const std::uint64_t key = init_key(p.init.seed, p.name);
  constexpr std::int64_t chunk = 1 << 14;
  std::vector<T> host(static_cast<std::size_t>(std::min(count, chunk)));
  for (std::int64_t at = 0; at < count; at += chunk) {
    const std::int64_t n = std::min(chunk, count - at);
    for (std::int64_t i = 0; i < n; ++i) {
      host[static_cast<std::size_t>(i)] =
          convert<T>(static_cast<float>(p.init.std * init_normal_at(key, from + at + i)));
    }
    Ops<B>::from_host(ctx, dst + at, host.data(), n);
  }
}
}  // namespace detail

/// Elements [first, first + count) of `p`'s initial values, written to `dst` (device memory of
/// B). The values depend only on (rule, name, element index of the unsplit tensor): a slice
/// (`Parameter::sliced`) draws its elements where its placement puts them in the unsplit
/// tensor, so every split starts from the one-rank model's values. Padding rows are zero.
template <class T, class B>
void write_init_rule(const Context<B>& ctx, const Parameter<T, B>& p, T* dst, std::int64_t first,
                     std::int64_t count) {
  check<ShapeError>(first >= 0 && count >= 0 && first + count <= p.numel(), "fourway: elements [",
                    first, ", ", first + count, ") of parameter ", p.name, " of ", p.numel());
  if (!p.sliced()) {
    const std::int64_t real = std::clamp<std::int64_t>(p.logical_numel() - first, 0, count);
    if (real < count) Ops<B>::fill(ctx, dst + real, count - real, convert<T>(0.0f));
    detail::write_rule_run(ctx, p, dst, first, real);
    return;
  }
  const tp::Placement& pl = p.placement;
  check<ShapeError>(p.numel() == pl.local_numel(p.slice_count), "fourway: parameter ", p.name,
                    " holds ", p.numel(), " elements, its placement (", tp::split_name(pl.split),
                    " of ", pl.rows, " x ", pl.cols, " over ", p.slice_count, ") says ",
                    pl.local_numel(p.slice_count));
  if (count > 0) Ops<B>::fill(ctx, dst, count, convert<T>(0.0f));  // padding stays zero
  pl.for_each_run(
      p.slice_count, p.slice_index, [&](std::int64_t full, std::int64_t local, std::int64_t n) {
        const std::int64_t lo = std::max(local, first);
        const std::int64_t hi = std::min(local + n, first + count);
        if (lo < hi) {
          detail::write_rule_run(ctx, p, dst + (lo - first), full + (lo - local), hi - lo);
        }
      });
}

/// Elements [first, first + count) of `p` as a strategy places them: copied from its storage
/// when it has values, else computed from its init rule (deferred construction).
template <class T, class B>
void write_initial_values(const Context<B>& ctx, const Parameter<T, B>& p, T* dst,
                          std::int64_t first, std::int64_t count) {
  if (p.deferred()) {
    write_init_rule(ctx, p, dst, first, count);
  } else if (count > 0) {
    Ops<B>::copy(ctx, dst, p.weight.data() + first, count);
  }
}

/// Gives a deferred parameter its own weight (from its init rule) and a zeroed gradient.
template <class T, class B>
void materialize(const Context<B>& ctx, Parameter<T, B>& p) {
  if (!p.deferred()) return;
  Tensor<T, B> w(p.weight.shape(), MemTag::weights, ctx.memory());
  write_init_rule(ctx, p, w.data(), 0, p.numel());
  Tensor<T, B> g(p.weight.shape(), MemTag::grads, ctx.memory());
  Ops<B>::fill(ctx, g.data(), g.numel(), convert<T>(0.0f));
  p.weight = std::move(w);
  p.grad = std::move(g);
}

/// weight = normal(0, std), element i from (seed, p.name, i); recorded as p's init rule (and
/// only recorded for a deferred parameter).
template <class T, class B>
void init_normal(const Context<B>& ctx, Parameter<T, B>& p, std::uint64_t seed, float std) {
  p.init = InitRule{InitRule::Kind::normal, seed, std, 0.0f};
  if (!p.deferred()) write_init_rule(ctx, p, p.weight.data(), 0, p.numel());
}

/// weight = value everywhere (recorded as p's init rule).
template <class T, class B>
void init_constant(const Context<B>& ctx, Parameter<T, B>& p, float value) {
  p.init = InitRule{InitRule::Kind::constant, 0, 0.0f, value};
  if (!p.deferred()) write_init_rule(ctx, p, p.weight.data(), 0, p.numel());
}

}  // namespace fourway
