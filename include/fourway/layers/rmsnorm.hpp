//! `RMSNorm<T, B>` over the last dimension (Zhang & Sennrich 2019), Llama's norm: no centring,
//! no bias, `y = x · rstd · weight`.
//!
//! The stash keeps a view of x, owns y and the per-row fp32 1/rms. The gain (weight) is 1-D and
//! starts at 1, so weight decay does not apply to it.
#pragma once

#include <cstdint>
#include <string>

#include "fourway/layers/layer.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class RMSNorm {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    Tensor<T, B> x;         // view of the input (..., C)
    Tensor<T, B> y;         // (..., C)
    Tensor<float, B> rstd;  // (rows)
  };

  RMSNorm(const Context<B>& ctx, const std::string& name, std::int64_t C, float eps = 1e-5f)
      : C_(C), eps_(eps) {
    check<ConfigError>(C > 0, "fourway: RMSNorm ", name, " needs C > 0, got ", C);
    weight_ = Parameter<T, B>(ctx, name + ".weight", Shape{C});
    init_constant(ctx, weight_, 1.0f);
  }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    const std::int64_t rows = detail::rows_of(x.shape(), C_, "RMSNorm");
    s.x = x.view();
    s.y = detail::activation<T, B>(ctx, x.shape());
    s.rstd = detail::activation<float, B>(ctx, Shape{rows});
    Ops<B>::rmsnorm_forward(ctx, s.y.data(), s.rstd.data(), x.data(), weight_.bound_weight().data(),
                            rows, C_, eps_);
    return s.y.view();
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    const std::int64_t rows = detail::rows_of(dy.shape(), C_, "RMSNorm backward");
    check<ShapeError>(s.rstd.numel() == rows, "fourway: RMSNorm backward without a matching ",
                      "forward: dy ", dy.shape().str(), ", stashed x ", s.x.shape().str());
    Tensor<T, B> dx = detail::workspace<T, B>(ctx, dy.shape());
    Ops<B>::rmsnorm_backward(ctx, dx.data(), weight_.bound_grad().data(), dy.data(), s.x.data(),
                             weight_.bound_weight().data(), s.rstd.data(), rows, C_);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    f(weight_);
  }

  [[nodiscard]] std::int64_t features() const { return C_; }
  [[nodiscard]] float eps() const { return eps_; }
  Parameter<T, B>& weight() { return weight_; }

 private:
  std::int64_t C_;
  float eps_;
  Parameter<T, B> weight_;  // (C)
};

static_assert(layer<RMSNorm<float, Host>>);

}  // namespace fourway
