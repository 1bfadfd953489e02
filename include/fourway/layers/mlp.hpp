//! `Mlp<T, B, Comm>`: GPT-2's feed-forward — c_fc (C -> 4C), tanh GELU, c_proj (4C -> C) — on the
//! tensor-parallel-ready linear layers (layers/parallel_linear.hpp): in a group of one rank (the
//! default) two `Linear`s exactly; over a `TpGroup` of N ranks c_fc is a column split (4C/N hidden
//! units per rank, GELU on them) and c_proj a row split, one all-reduce forward and one backward
//! (Megatron-LM's MLP).
//! Forward is two GEMM calls (c_fc's with the bias and GELU in its epilogue), backward three:
//! c_proj's input gradient through GELU's derivative with c_fc's bias gradient
//! (`backward_gelu`), then each weight gradient with its bias's (docs/kernels.md, "GEMM
//! epilogues").
#pragma once

#include <cstdint>
#include <string>

#include "fourway/layers/gelu.hpp"
#include "fourway/layers/parallel_linear.hpp"

namespace fourway {

template <floating_dtype T, backend B, class Comm = Alone>
class Mlp {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    typename ColumnLinear<T, B, Comm>::Stash c_fc;  // linear.y (..., 4C/N)
    typename Gelu<T, B>::Stash gelu;                // y (..., 4C/N)
    typename RowLinear<T, B, Comm>::Stash c_proj;   // the output (..., C)
  };

  /// Parameters "<name>.c_fc.{weight,bias}" (C, 4C/N) and "<name>.c_proj.{weight,bias}"
  /// (4C/N, C); c_proj's weight is initialised with `init.residual_std`.
  Mlp(const Context<B>& ctx, const std::string& name, std::int64_t C, const Init& init,
      TpGroup<Comm> group = {})
      : c_fc_(ctx, name + ".c_fc", C, 4 * C, init.seed, init.std, true, group),
        c_proj_(ctx, name + ".c_proj", 4 * C, C, init.seed, init.residual_std, true, group) {}

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    // gelu(x·W + b) in one call (c_fc's stash keeps its input, gelu's its output)
    Tensor<T, B> g = c_fc_.forward_gelu(ctx, x, s.c_fc, s.gelu);
    return c_proj_.forward(ctx, g, s.c_proj);
  }

  /// One decoded token's row x (1, 1, C), the same on every rank of the group (never split):
  /// the output (1, 1, C) summed over the group. Nothing is kept for a backward.
  Tensor<T, B> decode(const Context<B>& ctx, const Tensor<T, B>& x) const {
    typename Linear<T, B>::Stash fc;
    typename Gelu<T, B>::Stash gelu;
    typename RowLinear<T, B, Comm>::Stash proj;
    const Tensor<T, B> g = c_fc_.local().forward_gelu(ctx, x, fc, gelu);
    (void)c_proj_.forward_replicated(ctx, g, proj);
    return std::move(proj.linear.y);
  }

  /// Selective recomputation: frees GELU's output after forward; `recompute` (or backward, when
  /// it finds it missing) computes it again from c_fc's kept pre-activation.
  void drop_recomputable(Stash& s) const {
    s.gelu.y.reset();
    s.c_proj.linear.x.reset();
  }
  void recompute(const Context<B>& ctx, Stash& s) const {
    recompute_gelu(ctx, s.c_fc.linear.y, s.gelu, s.c_proj.linear.x);
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    recompute(ctx, s);
    // GELU's input gradient straight from c_proj's product, with c_fc's bias gradient, in one
    // GEMM call (cuBLASLt's DGELU_BGRAD epilogue on CUDA)
    T* fc_bias_grad = c_fc_.local().has_bias() ? c_fc_.bias().bound_grad().data() : nullptr;
    Tensor<T, B> dh = c_proj_.backward_gelu(ctx, dy, s.c_proj, s.c_fc.linear.y, fc_bias_grad);
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

  ColumnLinear<T, B, Comm>& c_fc() { return c_fc_; }
  RowLinear<T, B, Comm>& c_proj() { return c_proj_; }

 private:
  ColumnLinear<T, B, Comm> c_fc_;
  RowLinear<T, B, Comm> c_proj_;
};

static_assert(layer<Mlp<float, Host>>);

}  // namespace fourway
