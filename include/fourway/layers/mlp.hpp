//! `Mlp<T, B>`: GPT-2's feed-forward — c_fc (C -> 4C), tanh GELU, c_proj (4C -> C). Forward
//! is two GEMM calls (c_fc's with the bias and GELU in its epilogue), backward three: c_proj's
//! input gradient through GELU's derivative with c_fc's bias gradient (`Linear::backward_gelu`),
//! then each weight gradient with its bias's (docs/kernels.md, "GEMM epilogues").
#pragma once

#include <cstdint>
#include <string>

#include "fourway/layers/gelu.hpp"
#include "fourway/layers/linear.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class Mlp {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    typename Linear<T, B>::Stash c_fc;    // y (..., 4C)
    typename Gelu<T, B>::Stash gelu;      // y (..., 4C)
    typename Linear<T, B>::Stash c_proj;  // y (..., C)
  };

  /// Parameters "<name>.c_fc.{weight,bias}" (C, 4C) and "<name>.c_proj.{weight,bias}" (4C, C);
  /// c_proj's weight is initialised with `init.residual_std`.
  Mlp(const Context<B>& ctx, const std::string& name, std::int64_t C, const Init& init)
      : c_fc_(ctx, name + ".c_fc", C, 4 * C, init.seed, init.std),
        c_proj_(ctx, name + ".c_proj", 4 * C, C, init.seed, init.residual_std) {}

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    // gelu(x·W + b) in one call (c_fc's stash keeps its input, gelu's its output)
    Tensor<T, B> g = c_fc_.forward_gelu(ctx, x, s.c_fc, s.gelu);
    return c_proj_.forward(ctx, g, s.c_proj);
  }

  /// Selective recomputation: frees GELU's output after forward; `recompute` (or backward, when
  /// it finds it missing) computes it again from c_fc's kept pre-activation.
  void drop_recomputable(Stash& s) const {
    s.gelu.y.reset();
    s.c_proj.x.reset();
  }
  void recompute(const Context<B>& ctx, Stash& s) const {
    recompute_gelu(ctx, s.c_fc.y, s.gelu, s.c_proj.x);
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    recompute(ctx, s);
    // GELU's input gradient straight from c_proj's product, with c_fc's bias gradient, in one
    // GEMM call (cuBLASLt's DGELU_BGRAD epilogue on CUDA)
    T* fc_bias_grad = c_fc_.has_bias() ? c_fc_.bias().bound_grad().data() : nullptr;
    Tensor<T, B> dh = c_proj_.backward_gelu(ctx, dy, s.c_proj, s.c_fc.y, fc_bias_grad);
    s.gelu = typename Gelu<T, B>::Stash{};  // GELU's output was c_proj's input: done with
    Tensor<T, B> dx = c_fc_.backward(ctx, dh, s.c_fc, fc_bias_grad != nullptr);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    c_fc_.visit_parameters(f);
    c_proj_.visit_parameters(f);
  }

  Linear<T, B>& c_fc() { return c_fc_; }
  Linear<T, B>& c_proj() { return c_proj_; }

 private:
  Linear<T, B> c_fc_;
  Linear<T, B> c_proj_;
};

static_assert(layer<Mlp<float, Host>>);

}  // namespace fourway
