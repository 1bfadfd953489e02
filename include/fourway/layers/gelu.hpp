//! `Gelu<T, B>`: GPT-2's tanh approximation of GELU, element-wise; no parameters.
#pragma once

#include "fourway/layers/layer.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class Gelu {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    Tensor<T, B> x;  // view of the input
    Tensor<T, B> y;  // same shape
  };

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    s.x = x.view();
    s.y = detail::activation<T, B>(ctx, x.shape());
    Ops<B>::gelu_forward(ctx, s.y.data(), x.data(), x.numel());
    return s.y.view();
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) const {
    check<ShapeError>(dy.numel() == s.x.numel(), "fourway: Gelu backward without a matching ",
                      "forward: dy ", dy.shape().str(), ", stashed x ", s.x.shape().str());
    Tensor<T, B> dx = detail::workspace<T, B>(ctx, dy.shape());
    Ops<B>::gelu_backward(ctx, dx.data(), s.x.data(), dy.data(), dy.numel());
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& /*f*/) {}
};

static_assert(layer<Gelu<float, Host>>);

/// Selective recomputation of a GELU whose output was freed after forward: `g.y` computed again
/// from the kept pre-activation `pre` (the same kernel on the same input), `g.x` and the next
/// layer's input view `next_input` pointed at them. Nothing when `g.y` is still held or there was
/// no forward (`pre` empty).
template <floating_dtype T, backend B>
void recompute_gelu(const Context<B>& ctx, const Tensor<T, B>& pre, typename Gelu<T, B>::Stash& g,
                    Tensor<T, B>& next_input) {
  if (!g.y.empty() || pre.empty()) return;
  g.y = detail::activation<T, B>(ctx, pre.shape());
  Ops<B>::gelu_forward(ctx, g.y.data(), pre.data(), pre.numel());
  g.x = pre.view();
  next_input = g.y.view();
}

}  // namespace fourway
