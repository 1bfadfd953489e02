//! `Sequential<L0, L1, ...>`: layers composed at compile time; `Repeat<L>`: N identical layers
//! (e.g. the GPT's blocks) chosen at run time.
//!
//! Forward runs L0, L1, ... feeding each output to the next; backward runs them in reverse and
//! frees each stash as it goes. Every layer after the first must take an activation of the
//! same element type and backend (`activation_layer`); the first may take token ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/layers/layer.hpp"

namespace fourway {

namespace detail {
template <class... Ls>
struct first_layer {
  using type = void;
};
template <class L0, class... Ls>
struct first_layer<L0, Ls...> {
  using type = L0;
};
template <class L>
struct layer_types_or_void {
  using value_type = void;
  using backend_type = void;
  using Input = void;
};
template <layer L>
struct layer_types_or_void<L> {
  using value_type = typename L::value_type;
  using backend_type = typename L::backend_type;
  using Input = typename L::Input;
};
template <class L>
struct stash_or_void {
  struct type {};
};
template <layer L>
struct stash_or_void<L> {
  using type = typename L::Stash;
};

template <class L0, class... Ls>
inline constexpr bool chains =
    (... &&
     (activation_layer<Ls> && std::is_same_v<typename Ls::value_type, typename L0::value_type> &&
      std::is_same_v<typename Ls::backend_type, typename L0::backend_type>));
}  // namespace detail

template <class... Ls>
class Sequential {
  static_assert(sizeof...(Ls) > 0, "fourway: Sequential<> needs at least one layer");
  static_assert((layer<Ls> && ...),
                "fourway: every type in Sequential<...> must model fw::layer: value_type, "
                "backend_type, Stash, Input, forward(ctx, x, stash), backward(ctx, dy, stash) "
                "and visit_parameters(f); wrap the type or fix its signatures");
  using First = typename detail::first_layer<Ls...>::type;
  using FirstTypes = detail::layer_types_or_void<First>;

 public:
  using value_type = typename FirstTypes::value_type;
  using backend_type = typename FirstTypes::backend_type;
  using Input = typename FirstTypes::Input;
  using Stash = std::tuple<typename detail::stash_or_void<Ls>::type...>;
  static constexpr std::size_t size = sizeof...(Ls);

  explicit Sequential(Ls... layers) : layers_(std::move(layers)...) {
    static_assert(detail::chains<Ls...>,
                  "fourway: in Sequential<L0, L1, ...> every layer after the first must take "
                  "Tensor<value_type, backend_type> of L0's element type and backend");
  }

  Tensor<value_type, backend_type> forward(const Context<backend_type>& ctx, const Input& x,
                                           Stash& s) {
    return forward_from<0>(ctx, x, s);
  }
  Tensor<value_type, backend_type> backward(const Context<backend_type>& ctx,
                                            const Tensor<value_type, backend_type>& dy, Stash& s) {
    return backward_from<size - 1>(ctx, dy, s);
  }

  template <class F>
  void visit_parameters(F&& f) {
    std::apply([&](auto&... l) { (l.visit_parameters(f), ...); }, layers_);
  }

  template <std::size_t I>
  auto& get() {
    return std::get<I>(layers_);
  }

 private:
  template <std::size_t I, class X>
  Tensor<value_type, backend_type> forward_from(const Context<backend_type>& ctx, const X& x,
                                                Stash& s) {
    Tensor<value_type, backend_type> y = std::get<I>(layers_).forward(ctx, x, std::get<I>(s));
    if constexpr (I + 1 < size) {
      return forward_from<I + 1>(ctx, y, s);
    } else {
      return y;
    }
  }
  template <std::size_t I>
  Tensor<value_type, backend_type> backward_from(const Context<backend_type>& ctx,
                                                 const Tensor<value_type, backend_type>& dy,
                                                 Stash& s) {
    Tensor<value_type, backend_type> dx = std::get<I>(layers_).backward(ctx, dy, std::get<I>(s));
    if constexpr (I == 0) {
      return dx;
    } else {
      return backward_from<I - 1>(ctx, dx, s);
    }
  }

  std::tuple<Ls...> layers_;
};

/// N layers of one type, N known at run time; the stash is one sub-stash per layer.
template <class L>
class Repeat {
  static_assert(activation_layer<L>,
                "fourway: Repeat<L> needs L to model fw::layer with Input = Tensor<value_type, "
                "backend_type> (its output feeds its next copy)");

 public:
  using value_type = typename L::value_type;
  using backend_type = typename L::backend_type;
  using Input = Tensor<value_type, backend_type>;
  using Stash = std::vector<typename L::Stash>;

  /// Builds `n` layers with `make(i)`, i = 0 .. n-1.
  template <class Make>
  Repeat(std::int64_t n, Make&& make) {
    check<ConfigError>(n >= 0, "fourway: Repeat needs n >= 0 layers, got ", n);
    layers_.reserve(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) layers_.push_back(std::invoke(make, i));
  }

  Tensor<value_type, backend_type> forward(const Context<backend_type>& ctx, const Input& x,
                                           Stash& s) {
    s.clear();
    s.resize(layers_.size());
    Tensor<value_type, backend_type> y = x.view();
    for (std::size_t i = 0; i < layers_.size(); ++i) y = layers_[i].forward(ctx, y, s[i]);
    return y;
  }
  Tensor<value_type, backend_type> backward(const Context<backend_type>& ctx,
                                            const Tensor<value_type, backend_type>& dy, Stash& s) {
    check<ShapeError>(s.size() == layers_.size(), "fourway: Repeat backward with ", s.size(),
                      " stashes for ", layers_.size(), " layers (no matching forward)");
    Tensor<value_type, backend_type> d = dy.view();
    for (std::size_t i = layers_.size(); i-- > 0;) d = layers_[i].backward(ctx, d, s[i]);
    s.clear();
    return d;
  }

  template <class F>
  void visit_parameters(F&& f) {
    for (auto& l : layers_) l.visit_parameters(f);
  }

  [[nodiscard]] std::size_t size() const { return layers_.size(); }
  L& operator[](std::size_t i) { return layers_[i]; }

 private:
  std::vector<L> layers_;
};

}  // namespace fourway
