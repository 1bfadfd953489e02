//! `Linear<T, B>`: y = x·W + b with W stored (in, out) — the Hugging Face Conv1D layout of GPT-2.
//!
//! Backward: dx = dy·Wᵀ (written), dW += xᵀ·dy, db += Σ_rows dy (accumulated; dW and db in one
//! GEMM call, `matmul_add_bias_grad`); `backward_gelu` returns GELU's input gradient instead of dx
//! for the MLP's second matrix and reduces the first one's bias gradient in the same call. The
//! stash keeps a view of x (the caller keeps x alive) and owns y. Under a `DeferWeightGrads` scope
//! the dW GEMM is pushed to the scope's queue with copies of x and dy
//! (layers/weight_grad_queue.hpp) and db is reduced alone.
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

  /// dx = dy·Wᵀ (written), dW += xᵀ·dy and db += Σ_rows dy, the last two in one GEMM call (its
  /// BGRAD epilogue on CUDA). `bias_grad_added`: the caller has already added this layer's bias
  /// gradient (the previous GEMM's epilogue reduced it: `backward_gelu`), so only dW remains.
  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s,
                        bool bias_grad_added = false) {
    const std::int64_t rows = check_backward(dy, s);
    Tensor<T, B> dx = detail::workspace<T, B>(ctx, s.x.shape());
    // dX (rows, in) = dY (rows, out) · Wᵀ (out, in)
    matmul(ctx, matrix(dx), matrix(dy), matrix(weight_.bound_weight()).t());
    weight_backward(ctx, dy, s, rows, bias_grad_added);
    return dx;
  }

  /// The backward of this layer when its input is GELU's output (an MLP's second matrix): returns
  /// GELU's input gradient gelu'(pre_gelu) ⊙ (dy·Wᵀ) instead of dx, and adds Σ_rows of it to
  /// `pre_bias_grad` when given — the previous layer's bias gradient — all in one GEMM call
  /// (cuBLASLt's DGELU_BGRAD epilogue on CUDA; on the host exactly `backward`, `gelu_backward`
  /// and `bias_backward` in turn). dW and db as `backward`. `pre_gelu` has the input's shape.
  Tensor<T, B> backward_gelu(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s,
                             const Tensor<T, B>& pre_gelu, T* pre_bias_grad) {
    const std::int64_t rows = check_backward(dy, s);
    check<ShapeError>(pre_gelu.shape() == s.x.shape(), "fourway: Linear backward_gelu: GELU's ",
                      "input ", pre_gelu.shape().str(), " is not the layer's input ",
                      s.x.shape().str());
    Tensor<T, B> dh = detail::workspace<T, B>(ctx, s.x.shape());
    matmul_dgelu(ctx, matrix(dh), matrix(dy), matrix(weight_.bound_weight()).t(), pre_gelu.data(),
                 pre_bias_grad);
    weight_backward(ctx, dy, s, rows, false);
    return dh;
  }

 private:
  std::int64_t check_backward(const Tensor<T, B>& dy, const Stash& s) const {
    const std::int64_t rows = detail::rows_of(dy.shape(), out_, "Linear backward");
    check<ShapeError>(s.x.numel() == rows * in_, "fourway: Linear backward without a matching ",
                      "forward: dy ", dy.shape().str(), ", stashed x ", s.x.shape().str());
    return rows;
  }

  // dW (in, out) += Xᵀ (in, rows) · dY (rows, out), db += Σ_rows dY (unless `bias_done`); clears
  // the stash.
  void weight_backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s, std::int64_t rows,
                       bool bias_done) {
    const bool bias = has_bias_ && !bias_done;
    if (auto* q = DeferWeightGrads<T, B>::active()) {
      q->push(ctx, weight_, s.x.view(), dy.view(), rows);
      if (bias) Ops<B>::bias_backward(ctx, bias_.bound_grad().data(), dy.data(), rows, out_);
    } else if (bias) {
      matmul_add_bias_grad(ctx, matrix(weight_.bound_grad()), matrix(s.x).t(), matrix(dy),
                           bias_.bound_grad().data());
    } else {
      matmul_add(ctx, matrix(weight_.bound_grad()), matrix(s.x).t(), matrix(dy));
    }
    s = Stash{};
  }

 public:
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
