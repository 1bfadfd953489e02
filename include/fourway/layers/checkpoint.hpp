//! `Checkpointed<L>`: activation checkpointing (Chen et al. 2016, "Training deep nets with
//! sublinear memory cost") — keep only L's output after forward, recompute L's stash in backward.
//!
//! ```
//!   forward:  inner stash <- L.forward(x); out <- copy of L's output; inner stash freed
//!   backward: inner stash <- L.forward(x) again; dx <- L.backward(dy); everything freed
//! ```
//! Invariants: the recomputation runs the same kernels on the same inputs, so gradients are
//! bitwise equal to the run without checkpointing; the stash keeps one output tensor (plus a view
//! of x, which the caller keeps alive anyway), so the activation bytes kept per micro-batch drop
//! from L's whole stash to L's output. The peak during backward is one L's stash on top of that.
#pragma once

#include <utility>

#include "fourway/layers/gelu.hpp"
#include "fourway/layers/layer.hpp"

namespace fourway {

template <class L>
class Checkpointed {
  static_assert(layer<L>,
                "fourway: Checkpointed<L> needs L to model fw::layer: value_type, backend_type, "
                "Stash, Input, forward(ctx, x, stash), backward(ctx, dy, stash) and "
                "visit_parameters(f)");

 public:
  using value_type = typename L::value_type;
  using backend_type = typename L::backend_type;
  using Input = typename L::Input;
  struct Stash {
    Input x;                             // view of the input
    Tensor<value_type, backend_type> y;  // owned copy of L's output
    typename L::Stash inner;             // empty between forward and backward
  };

  explicit Checkpointed(L layer) : layer_(std::move(layer)) {}

  Tensor<value_type, backend_type> forward(const Context<backend_type>& ctx, const Input& x,
                                           Stash& s) {
    {
      typename L::Stash inner;
      Tensor<value_type, backend_type> out = layer_.forward(ctx, x, inner);
      s.y = detail::activation<value_type, backend_type>(ctx, out.shape());
      Ops<backend_type>::copy(ctx, s.y.data(), out.data(), out.numel());
    }
    s.x = x.view();
    return s.y.view();
  }

  /// Recomputes L's forward, then runs L's backward. Under FSDP this happens between
  /// `pre_backward(u)` and `post_backward(u)`, so the gathered parameters serve both.
  Tensor<value_type, backend_type> backward(const Context<backend_type>& ctx,
                                            const Tensor<value_type, backend_type>& dy, Stash& s) {
    check<ShapeError>(!s.y.empty() && dy.numel() == s.y.numel(), "fourway: Checkpointed ",
                      "backward without a matching forward: dy ", dy.shape().str());
    s.y.reset();  // the next layer's backward is done with it; free before recomputing
    (void)layer_.forward(ctx, s.x, s.inner);
    Tensor<value_type, backend_type> dx = layer_.backward(ctx, dy, s.inner);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    layer_.visit_parameters(f);
  }

  L& inner() { return layer_; }

 private:
  L layer_;
};

static_assert(layer<Checkpointed<Gelu<float, Host>>>);

}  // namespace fourway
