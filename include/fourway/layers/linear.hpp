//! `Linear<T, B>`: y = x·W + b with W stored (in, out) — the Hugging Face Conv1D layout of GPT-2.
//!
//! Backward: dx = dy·Wᵀ (written), dW += xᵀ·dy, db += Σ_rows dy (accumulated). The stash keeps
//! a view of x (the caller keeps x alive) and owns y. Under a `DeferWeightGrads` scope the dW
//! GEMM is pushed to the scope's queue with copies of x and dy (layers/weight_grad_queue.hpp).
//! The bias is the GEMM's epilogue (`matmul_bias`: one cuBLASLt call on CUDA), and
//! `forward_gelu` adds GELU to it for the MLP's first matrix, filling the `Gelu` stash too.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "fourway/backend/matmul.hpp"
#include "fourway/layers/gelu.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/weight_grad_queue.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class Linear {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    Tensor<T, B> x;  // view of the input (..., in)
    Tensor<T, B> y;  // (..., out)
  };

  /// `name` is the prefix of the parameter names: "<name>.weight", "<name>.bias".
  /// Weight normal(0, init_std) from `seed`; bias zero.
  Linear(const Context<B>& ctx, const std::string& name, std::int64_t in, std::int64_t out,
         std::uint64_t seed, float init_std = 0.02f, bool bias = true)
      : in_(in), out_(out), has_bias_(bias) {
    check<ConfigError>(in > 0 && out > 0, "fourway: Linear ", name,
                       " needs in > 0 and out > 0, got ", in, " x ", out);
    weight_ = Parameter<T, B>(ctx, name + ".weight", Shape{in, out});
    init_normal(ctx, weight_, seed, init_std);
    if (has_bias_) {
      bias_ = Parameter<T, B>(ctx, name + ".bias", Shape{out});
      init_constant(ctx, bias_, 0.0f);
    }
  }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    return run_forward(ctx, x, s, has_bias_);
  }

  /// x·W alone: the partial product of a row split, whose bias is added once the group's sum is
  /// taken (layers/parallel_linear.hpp). The stash is forward's and `backward` is unchanged (the
  /// bias gradient comes from the full output gradient).
  Tensor<T, B> forward_without_bias(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    return run_forward(ctx, x, s, false);
  }

 private:
  Tensor<T, B> run_forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s,
                           bool with_bias) const {
    (void)detail::rows_of(x.shape(), in_, "Linear");
    s.x = x.view();
    s.y = detail::activation<T, B>(ctx, detail::with_last(x.shape(), out_));
    // Y (rows, out) = X (rows, in) · W (in, out) (+ b)
    if (with_bias) {
      matmul_bias(ctx, matrix(s.y), matrix(x), matrix(weight_.bound_weight()),
                  bias_.bound_weight().data());
    } else {
      matmul(ctx, matrix(s.y), matrix(x), matrix(weight_.bound_weight()));
    }
    return s.y.view();
  }

 public:
  /// gelu(x·W + b) in one call: this layer's stash keeps x·W + b (GELU's input), `g` the output,
  /// exactly as `forward` then `Gelu::forward` would leave them (the same tensors, allocated in
  /// the same order); backward is theirs, unchanged.
  Tensor<T, B> forward_gelu(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s,
                            typename Gelu<T, B>::Stash& g) const {
    (void)detail::rows_of(x.shape(), in_, "Linear");
    s.x = x.view();
    s.y = detail::activation<T, B>(ctx, detail::with_last(x.shape(), out_));
    g.y = detail::activation<T, B>(ctx, s.y.shape());
    g.x = s.y.view();
    if (has_bias_) {
      matmul_bias(ctx, matrix(g.y), matrix(x), matrix(weight_.bound_weight()),
                  bias_.bound_weight().data(), s.y.data());
    } else {
      matmul(ctx, matrix(s.y), matrix(x), matrix(weight_.bound_weight()));
      Ops<B>::gelu_forward(ctx, g.y.data(), s.y.data(), s.y.numel());
    }
    return g.y.view();
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    const std::int64_t rows = detail::rows_of(dy.shape(), out_, "Linear backward");
    check<ShapeError>(s.x.numel() == rows * in_, "fourway: Linear backward without a matching ",
                      "forward: dy ", dy.shape().str(), ", stashed x ", s.x.shape().str());
    Tensor<T, B> dx = detail::workspace<T, B>(ctx, s.x.shape());
    const Matrix<T> dY = matrix(dy);
    // dX (rows, in) = dY (rows, out) · Wᵀ (out, in)
    matmul(ctx, matrix(dx), dY, matrix(weight_.bound_weight()).t());
    if (auto* q = DeferWeightGrads<T, B>::active()) {
      q->push(ctx, weight_, s.x.view(), dy.view(), rows);
    } else {
      // dW (in, out) += Xᵀ (in, rows) · dY (rows, out)
      matmul_add(ctx, matrix(weight_.bound_grad()), matrix(s.x).t(), dY);
    }
    if (has_bias_) Ops<B>::bias_backward(ctx, bias_.bound_grad().data(), dy.data(), rows, out_);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    f(weight_);
    if (has_bias_) f(bias_);
  }

  [[nodiscard]] std::int64_t in_features() const { return in_; }
  [[nodiscard]] std::int64_t out_features() const { return out_; }
  [[nodiscard]] bool has_bias() const { return has_bias_; }
  Parameter<T, B>& weight() { return weight_; }
  Parameter<T, B>& bias() { return bias_; }
  [[nodiscard]] const Parameter<T, B>& weight() const { return weight_; }
  [[nodiscard]] const Parameter<T, B>& bias() const { return bias_; }

 private:
  std::int64_t in_;
  std::int64_t out_;
  bool has_bias_;
  Parameter<T, B> weight_;  // (in, out)
  Parameter<T, B> bias_;    // (out)
};

static_assert(layer<Linear<float, Host>>);
static_assert(layer<Linear<bf16, Host>>);

}  // namespace fourway
