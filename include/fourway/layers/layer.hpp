//! The `layer` concept: local (single-device) forward and backward over a per-micro-batch stash
//! kept outside the layer, and a visitor over named parameters.
//!
//! ```
//!   using S = L::Stash;                                     // one per micro-batch in flight
//!   Tensor<T,B> y  = l.forward(ctx, x, s);                  // a view of memory s owns
//!   Tensor<T,B> dx = l.backward(ctx, dy, s);                // owning; s is empty afterwards
//!   l.visit_parameters([](Parameter<T,B>& p) { ... });      // fixed order
//! ```
//! Invariants: `forward` writes its saved tensors and output into the stash (MemTag::activations)
//! and may keep a view of `x`, so the caller keeps `x` alive until `backward`; `backward` adds
//! parameter gradients (`+=`, so micro-batches sum), returns the input gradient (an owning
//! tensor, MemTag::workspace; empty when the input has no gradient, as token ids) and frees the
//! stash. A layer never caches `weight.data()` or `grad.data()` (see parameter.hpp).
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/shape.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/parameter.hpp"

namespace fourway {

namespace detail {
/// A visitor that accepts exactly the layer's parameter type, for the concept check.
template <class T, class B>
struct ParameterVisitorArchetype {
  void operator()(Parameter<T, B>&) const {}
};

template <class L>
concept layer_types = requires {
  typename L::value_type;
  typename L::backend_type;
  typename L::Stash;
  typename L::Input;
};

template <class L, class T, class B>
concept layer_operations = floating_dtype<T> && backend<B> &&
    std::default_initializable<typename L::Stash> && std::movable<typename L::Stash> &&
    std::movable<L> &&
    requires(L& l, const Context<B>& ctx, const typename L::Input& x, const Tensor<T, B>& dy,
             typename L::Stash& s, ParameterVisitorArchetype<T, B> f) {
  { l.forward(ctx, x, s) } -> std::same_as<Tensor<T, B>>;
  { l.backward(ctx, dy, s) } -> std::same_as<Tensor<T, B>>;
  l.visit_parameters(f);
};
}  // namespace detail

/// A model of the layer concept (see the file comment).
template <class L>
concept layer = detail::layer_types<L> &&
    detail::layer_operations<L, typename L::value_type, typename L::backend_type>;

/// A layer whose input is an activation of its own element type (so layers chain).
template <class L>
concept activation_layer = layer<L> &&
    std::same_as<typename L::Input, Tensor<typename L::value_type, typename L::backend_type>>;

namespace detail {
/// `shape` with its last extent replaced by `last`.
inline Shape with_last(const Shape& s, std::int64_t last) {
  switch (s.rank()) {
    case 1: return Shape{last};
    case 2: return Shape{s[0], last};
    case 3: return Shape{s[0], s[1], last};
    case 4: return Shape{s[0], s[1], s[2], last};
    case 5: return Shape{s[0], s[1], s[2], s[3], last};
    case 6: return Shape{s[0], s[1], s[2], s[3], s[4], last};
    default: throw ShapeError("fourway: a layer input needs at least one dimension");
  }
}

/// Rows of `x` seen as (rows, features); throws when the last extent is not `features`.
inline std::int64_t rows_of(const Shape& x, std::int64_t features, const char* who) {
  check<ShapeError>(x.rank() >= 1 && x[x.rank() - 1] == features, "fourway: ", who,
                    " expects an input whose last dimension is ", features, ", got ", x.str());
  return x.numel() / features;
}

template <class T, class B>
Tensor<T, B> activation(const Context<B>& ctx, Shape shape) {
  return Tensor<T, B>(shape, MemTag::activations, ctx.memory());
}
template <class T, class B>
Tensor<T, B> workspace(const Context<B>& ctx, Shape shape) {
  return Tensor<T, B>(shape, MemTag::workspace, ctx.memory());
}
}  // namespace detail

/// Hooks around the units of a model (docs/contracts.md, FSDP units): a parallel strategy gathers
/// and releases parameters in them. These do nothing: one rank, or plain data parallelism.
struct NoHooks {
  void pre_forward(int /*unit*/) {}
  void post_forward(int /*unit*/) {}
  void pre_backward(int /*unit*/) {}
  void post_backward(int /*unit*/) {}
};

/// Where a model's forward leaves its loss when the caller keeps it on the device (the Trainer
/// does): `*sum += weight · Σ per-token losses`, a double in backend memory, and nothing is read
/// back, so the forward makes no synchronising call. `tokens_checked`: the caller has checked
/// every token id against the vocabulary on the host, so a device embedding need not read its
/// bounds flag back either.
struct LossSink {
  double* sum = nullptr;
  double weight = 1.0;
  bool tokens_checked = false;
};

}  // namespace fourway
