//! `LayerNorm<T, B>` over the last dimension (Ba, Kiros & Hinton 2016), eps 1e-5 as GPT-2.
//!
//! The stash keeps a view of x, owns y and the per-row fp32 mean and 1/std. Gain (weight) and
//! bias are 1-D, so weight decay does not apply to them.
#pragma once

#include <cstdint>
#include <string>

#include "fourway/layers/layer.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class LayerNorm {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    Tensor<T, B> x;         // view of the input (..., C)
    Tensor<T, B> y;         // (..., C)
    Tensor<float, B> mean;  // (rows)
    Tensor<float, B> rstd;  // (rows)
  };

  LayerNorm(const Context<B>& ctx, const std::string& name, std::int64_t C, float eps = 1e-5f)
      : C_(C), eps_(eps) {
    check<ConfigError>(C > 0, "fourway: LayerNorm ", name, " needs C > 0, got ", C);
    weight_ = Parameter<T, B>(ctx, name + ".weight", Shape{C});
    bias_ = Parameter<T, B>(ctx, name + ".bias", Shape{C});
    init_constant(ctx, weight_, 1.0f);
    init_constant(ctx, bias_, 0.0f);
  }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    const std::int64_t rows = detail::rows_of(x.shape(), C_, "LayerNorm");
    s.x = x.view();
    s.y = detail::activation<T, B>(ctx, x.shape());
    s.mean = detail::activation<float, B>(ctx, Shape{rows});
    s.rstd = detail::activation<float, B>(ctx, Shape{rows});
    Ops<B>::layernorm_forward(ctx, s.y.data(), s.mean.data(), s.rstd.data(), x.data(),
                              weight_.bound_weight().data(), bias_.bound_weight().data(), rows, C_,
                              eps_);
    return s.y.view();
  }

  /// r = a + b (written into `r`, which the caller owns and keeps: it is this layer's input
  /// for the backward), then forward(r), in one pass (`residual_layernorm_forward`); the same
  /// values as residual_forward then forward.
  Tensor<T, B> forward_residual(const Context<B>& ctx, const Tensor<T, B>& a, const Tensor<T, B>& b,
                                const Tensor<T, B>& r, Stash& s) const {
    const std::int64_t rows = detail::rows_of(r.shape(), C_, "LayerNorm");
    check<ShapeError>(a.numel() == r.numel() && b.numel() == r.numel(),
                      "fourway: LayerNorm forward_residual of ", a.shape().str(), " + ",
                      b.shape().str(), " into ", r.shape().str());
    s.x = r.view();
    s.y = detail::activation<T, B>(ctx, r.shape());
    s.mean = detail::activation<float, B>(ctx, Shape{rows});
    s.rstd = detail::activation<float, B>(ctx, Shape{rows});
    Ops<B>::residual_layernorm_forward(ctx, r.data(), s.y.data(), s.mean.data(), s.rstd.data(),
                                       a.data(), b.data(), weight_.bound_weight().data(),
                                       bias_.bound_weight().data(), rows, C_, eps_);
    return s.y.view();
  }

  /// dx, and the gains' and biases' gradients (accumulated). With `residual_grad` (dy's shape)
  /// dx also gets it added, in the same pass on CUDA: a pre-LayerNorm block's input gradient is
  /// the norm's plus the residual path's.
  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s,
                        const Tensor<T, B>* residual_grad = nullptr) {
    const std::int64_t rows = detail::rows_of(dy.shape(), C_, "LayerNorm backward");
    check<ShapeError>(s.mean.numel() == rows, "fourway: LayerNorm backward without a matching ",
                      "forward: dy ", dy.shape().str(), ", stashed x ", s.x.shape().str());
    check<ShapeError>(residual_grad == nullptr || residual_grad->numel() == dy.numel(),
                      "fourway: LayerNorm backward: the residual gradient ",
                      residual_grad != nullptr ? residual_grad->shape().str() : std::string(),
                      " is not dy's ", dy.shape().str());
    Tensor<T, B> dx = detail::workspace<T, B>(ctx, dy.shape());
    Ops<B>::layernorm_backward(
        ctx, dx.data(), weight_.bound_grad().data(), bias_.bound_grad().data(), dy.data(),
        s.x.data(), weight_.bound_weight().data(), s.mean.data(), s.rstd.data(), rows, C_,
        residual_grad != nullptr ? residual_grad->data() : static_cast<const T*>(nullptr));
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    f(weight_);
    f(bias_);
  }

  [[nodiscard]] std::int64_t features() const { return C_; }
  [[nodiscard]] float eps() const { return eps_; }
  Parameter<T, B>& weight() { return weight_; }
  Parameter<T, B>& bias() { return bias_; }

 private:
  std::int64_t C_;
  float eps_;
  Parameter<T, B> weight_;  // (C)
  Parameter<T, B> bias_;    // (C)
};

static_assert(layer<LayerNorm<float, Host>>);

}  // namespace fourway
