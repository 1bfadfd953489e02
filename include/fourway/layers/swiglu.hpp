//! `SwiGLU<T, B>` (Shazeer 2020): the gated activation of Llama's feed-forward, element-wise on
//! an input whose last dimension 2F holds [gate | up]; the output (..., F) is silu(gate)·up. No
//! parameters (the two projections are the surrounding Linear layers, or one fused (C, 2F) one).
#pragma once

#include <cstdint>

#include "fourway/layers/layer.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class SwiGLU {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    Tensor<T, B> x;  // view of the input (..., 2F)
    Tensor<T, B> y;  // (..., F)
  };

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    const std::int64_t last = x.shape().rank() >= 1 ? x.shape()[x.shape().rank() - 1] : 0;
    check<ShapeError>(last > 0 && last % 2 == 0, "fourway: SwiGLU expects an input whose last ",
                      "dimension is even ([gate | up]), got ", x.shape().str());
    const std::int64_t F = last / 2;
    const std::int64_t rows = x.numel() / last;
    s.x = x.view();
    s.y = detail::activation<T, B>(ctx, detail::with_last(x.shape(), F));
    Ops<B>::swiglu_forward(ctx, s.y.data(), x.data(), rows, F);
    return s.y.view();
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) const {
    check<ShapeError>(s.x.numel() > 0 && dy.numel() * 2 == s.x.numel() && dy.shape() == s.y.shape(),
                      "fourway: SwiGLU backward without a matching forward: dy ", dy.shape().str(),
                      ", stashed x ", s.x.shape().str());
    const std::int64_t F = dy.shape()[dy.shape().rank() - 1];
    const std::int64_t rows = dy.numel() / F;
    Tensor<T, B> dx = detail::workspace<T, B>(ctx, s.x.shape());
    Ops<B>::swiglu_backward(ctx, dx.data(), dy.data(), s.x.data(), rows, F);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& /*f*/) {}
};

static_assert(layer<SwiGLU<float, Host>>);

}  // namespace fourway
