//! `tp::Block<T, B, Comm>`: GPT-2's pre-LayerNorm block split over a tensor-parallel group of N
//! ranks, built from the unchanged local layers (LayerNorm, Linear, Gelu) and the attention
//! kernels, joined by the conjugate operators of layers/conjugate.hpp:
//! ```
//!   x ─ ln_1 ─ f ─ c_attn (C, 3C/N) ─ attention, NH/N heads ─ c_proj (C/N, C) ─ g ─ +bias ─ +x = r
//!   r ─ ln_2 ─ f ─ c_fc (C, 4C/N) ─ gelu ─ c_proj (4C/N, C) ─ g ─ +bias ─ +r = y
//! ```
//! c_attn and c_fc are column splits (q, k, v each split by heads), the c_proj are row splits
//! whose bias is replicated and added once after g. Without sequence parallelism x, r, y are
//! (B, T, C) on every rank; with it they are this rank's chunk (B·T/N, C) of the rows, f is an
//! all-gather and g a reduce-scatter, and the LayerNorm gains' and biases' gradients (partial
//! sums over the chunk) are all-reduced over the group in backward. Row-split biases take their
//! gradient from the full (gathered) output gradient, so it is the same on every rank.
//! The stash holds the local layers' stashes; under sequence parallelism also the gathered
//! inputs of the column splits, h1 and h2 (B, T, C).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "fourway/comm/communicator.hpp"
#include "fourway/layers/attention.hpp"
#include "fourway/layers/conjugate.hpp"
#include "fourway/layers/gelu.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/layernorm.hpp"
#include "fourway/layers/linear.hpp"
#include "fourway/layers/replicated_norm.hpp"

namespace fourway::tp {

/// Throws ConfigError unless `heads` (and so the width C = heads·head_size) split over n ranks.
inline void check_heads_split(std::int64_t C, std::int64_t heads, int n) {
  check<ConfigError>(
      n >= 1 && heads >= 1 && C % heads == 0 && heads % n == 0,
      "fourway: ", "tensor parallelism over tp=", n, " ranks needs heads=", heads, " divisible by ",
      n, " (each rank computes heads/tp whole heads of size C/heads=", heads > 0 ? C / heads : 0,
      "); pick a tp that divides ", heads);
}

/// LayerNorm backward where `dy` covers only this rank's rows (sequence parallelism): the gain
/// and bias gradients of the chunk go to a scratch, are summed over the group and added.
template <class T, class B, communicator Comm>
Tensor<T, B> layernorm_backward_rows(const Context<B>& ctx, Comm& comm, LayerNorm<T, B>& ln,
                                     const Tensor<T, B>& dy, typename LayerNorm<T, B>::Stash& s) {
  if (comm.size() == 1) return ln.backward(ctx, dy, s);
  return detail::norm_backward_over_rows(ctx, ln, dy, s, [&comm](T* p, std::int64_t n) {
    all_reduce_in_layer(comm, p, n, ReduceOp::sum);
  });
}

template <floating_dtype T, backend B, communicator Comm>
class Block {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    typename LayerNorm<T, B>::Stash ln_1;
    Tensor<T, B> h1;                         // sequence parallel: ln_1's output gathered (B, T, C)
    typename Linear<T, B>::Stash c_attn;     // y = this rank's q|k|v (B, T, 3C/N)
    Tensor<float, B> lse;                    // (B, NH/N, T) log-sum-exp of each row's scores
    Tensor<T, B> heads;                      // (B, T, C/N)
    typename Linear<T, B>::Stash attn_proj;  // y = partial sum (B, T, C); g reduces it in place
    Tensor<T, B> a;                          // sequence parallel: reduce-scattered (B·T/N, C)
    Tensor<T, B> r;                          // x + attention, the shape of x
    typename LayerNorm<T, B>::Stash ln_2;
    Tensor<T, B> h2;                        // sequence parallel: ln_2's output gathered (B, T, C)
    typename Linear<T, B>::Stash c_fc;      // y (B, T, 4C/N)
    typename Gelu<T, B>::Stash gelu;        // (B, T, 4C/N)
    typename Linear<T, B>::Stash mlp_proj;  // y = partial sum (B, T, C); g reduces it in place
    Tensor<T, B> m;                         // sequence parallel: reduce-scattered (B·T/N, C)
    Tensor<T, B> y;                         // r + MLP, the shape of x
  };

  /// `name` is the block's prefix ("h.<i>"); parameters keep their Hugging Face names and hold
  /// this rank's slice (values are loaded by the model from its placement table).
  Block(const Context<B>& ctx, const std::string& name, std::int64_t C, std::int64_t heads,
        const Init& init, Comm& tp, bool sequence_parallel)
      : C_((check_heads_split(C, heads, tp.size()), C)),
        n_(tp.size()),
        NH_(heads / n_),
        tp_(&tp),
        sp_(sequence_parallel),
        ln_1_(ctx, name + ".ln_1", C),
        c_attn_(ctx, name + ".attn.c_attn", C, 3 * C / n_, init.seed, init.std),
        attn_proj_(ctx, name + ".attn.c_proj", C / n_, C, init.seed, init.residual_std, false),
        attn_bias_(ctx, name + ".attn.c_proj.bias", Shape{C}),
        ln_2_(ctx, name + ".ln_2", C),
        c_fc_(ctx, name + ".mlp.c_fc", C, 4 * C / n_, init.seed, init.std),
        mlp_proj_(ctx, name + ".mlp.c_proj", 4 * C / n_, C, init.seed, init.residual_std, false),
        mlp_bias_(ctx, name + ".mlp.c_proj.bias", Shape{C}) {
    init_constant(ctx, attn_bias_, 0.0f);
    init_constant(ctx, mlp_bias_, 0.0f);
  }

  /// The sequence length T of the next forward (rows are B·T; under sequence parallelism the
  /// input holds B·T/N of them, so T cannot be read off it).
  void set_sequence_length(std::int64_t seq) { T_ = seq; }
  /// Context parallelism: the rows are the shard's part of each sequence, attention its ring
  /// (null: whole sequences). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) { shard_ = shard; }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) {
    const std::int64_t rows_here = detail::rows_of(x.shape(), C_, "tp::Block");
    const std::int64_t rows = sp_ ? rows_here * n_ : rows_here;
    check<ShapeError>(T_ >= 1 && rows % T_ == 0, "fourway: tp::Block input ", x.shape().str(),
                      " is not B x T=", T_, " rows", sp_ ? " split over the group" : "");
    const Shape full{rows / T_, T_, C_};

    Tensor<T, B> h1 = column_input(ctx, ln_1_.forward(ctx, x, s.ln_1), s.h1, full);  // (B, T, C)
    Tensor<T, B> qkv = c_attn_.forward(ctx, h1, s.c_attn);  // (B, T, 3C/N) = (B, T, C)·(C, 3C/N)
    attention_core(ctx, qkv, full[0], T_, C_ / n_, NH_, s.lse, s.heads, shard_);
    // (B, T, C) = Σ over the group of (B, T, C/N)·(C/N, C); sequence parallel: (B·T/N, C)
    Tensor<T, B> a =
        row_output(ctx, attn_proj_.forward(ctx, s.heads, s.attn_proj), s.attn_proj.y, s.a);
    Ops<B>::bias_add(ctx, a.data(), attn_bias_.bound_weight().data(), rows_here, C_);
    s.r = detail::activation<T, B>(ctx, x.shape());
    Ops<B>::residual_forward(ctx, s.r.data(), x.data(), a.data(), x.numel());

    Tensor<T, B> h2 = column_input(ctx, ln_2_.forward(ctx, s.r, s.ln_2), s.h2, full);  // (B, T, C)
    // (B, T, 4C/N) = gelu((B, T, C)·(C, 4C/N))
    Tensor<T, B> g = c_fc_.forward_gelu(ctx, h2, s.c_fc, s.gelu);
    // (B, T, C) = Σ over the group of (B, T, 4C/N)·(4C/N, C); sequence parallel: (B·T/N, C)
    Tensor<T, B> m = row_output(ctx, mlp_proj_.forward(ctx, g, s.mlp_proj), s.mlp_proj.y, s.m);
    Ops<B>::bias_add(ctx, m.data(), mlp_bias_.bound_weight().data(), rows_here, C_);
    s.y = detail::activation<T, B>(ctx, x.shape());
    Ops<B>::residual_forward(ctx, s.y.data(), s.r.data(), m.data(), x.numel());
    return s.y.view();
  }

  /// One new token of one sequence (layers/kv_cache.hpp): x (1, 1, C) on every rank (one row is
  /// not split, sequence parallel or not), this rank's NH/N heads attending over `cache` (their
  /// keys and values), the row splits' partial sums all-reduced over the group. Returns
  /// (1, 1, C); nothing is kept for a backward.
  Tensor<T, B> decode(const Context<B>& ctx, const Tensor<T, B>& x, KvCache<T, B>& cache,
                      std::int64_t pos) {
    typename LayerNorm<T, B>::Stash l1, l2;
    typename Linear<T, B>::Stash qkv_s, attn_s, fc_s, mlp_s;
    typename Gelu<T, B>::Stash gelu_s;
    const Tensor<T, B> qkv = c_attn_.forward(ctx, ln_1_.forward(ctx, x, l1), qkv_s);
    const Tensor<T, B> heads = decode_attention(ctx, qkv, cache, pos, C_ / n_, NH_);
    (void)attn_proj_.forward(ctx, heads, attn_s);
    const Tensor<T, B> a = row_sum(ctx, attn_s, attn_bias_);
    Tensor<T, B> r = detail::activation<T, B>(ctx, x.shape());
    Ops<B>::residual_forward(ctx, r.data(), x.data(), a.data(), x.numel());
    const Tensor<T, B> g = c_fc_.forward_gelu(ctx, ln_2_.forward(ctx, r, l2), fc_s, gelu_s);
    (void)mlp_proj_.forward(ctx, g, mlp_s);
    const Tensor<T, B> m = row_sum(ctx, mlp_s, mlp_bias_);
    Tensor<T, B> y = detail::activation<T, B>(ctx, x.shape());
    Ops<B>::residual_forward(ctx, y.data(), r.data(), m.data(), x.numel());
    return y;
  }

  /// Selective recomputation: frees the attention core's output and log-sum-exp and GELU's
  /// output after forward (the rank's C/N and 4C/N columns); backward recomputes them from the
  /// kept q|k|v and c_fc pre-activation, first, so the rest of it runs on the whole stash.
  void drop_recomputable(Stash& s) const {
    s.heads.reset();
    s.lse.reset();
    s.attn_proj.x.reset();
    s.gelu.y.reset();
    s.mlp_proj.x.reset();
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    if (s.heads.empty() && s.c_attn.y.shape().rank() == 3) {  // selective: recompute first
      attention_core(ctx, s.c_attn.y, s.c_attn.y.shape()[0], T_, C_ / n_, NH_, s.lse, s.heads,
                     shard_);
      s.attn_proj.x = s.heads.view();
    }
    recompute_gelu(ctx, s.c_fc.y, s.gelu, s.mlp_proj.x);
    check<ShapeError>(!s.y.empty() && dy.numel() == s.y.numel() && s.lse.shape().rank() == 3,
                      "fourway: tp::Block backward without a matching forward: dy ",
                      dy.shape().str());
    const std::int64_t n = dy.numel();
    const std::int64_t Bn = s.lse.shape()[0];
    const Shape full{Bn, T_, C_};
    const std::int64_t rows = Bn * T_;

    Tensor<T, B> dyf = row_output_grad(ctx, dy, full);  // (B, T, C)
    Ops<B>::bias_backward(ctx, mlp_bias_.bound_grad().data(), dyf.data(), rows, C_);
    Tensor<T, B> dg = mlp_proj_.backward(ctx, dyf, s.mlp_proj);  // (B, T, 4C/N)
    dyf.reset();
    Tensor<T, B> dh = gelu_.backward(ctx, dg, s.gelu);  // (B, T, 4C/N)
    dg.reset();
    Tensor<T, B> dr = layernorm_backward(
        ctx, ln_2_, column_input_grad(ctx, c_fc_.backward(ctx, dh, s.c_fc)), s.ln_2);
    dh.reset();
    Ops<B>::residual_forward(ctx, dr.data(), dr.data(), dy.data(), n);

    Tensor<T, B> drf = row_output_grad(ctx, dr, full);  // (B, T, C)
    Ops<B>::bias_backward(ctx, attn_bias_.bound_grad().data(), drf.data(), rows, C_);
    Tensor<T, B> dheads = attn_proj_.backward(ctx, drf, s.attn_proj);  // (B, T, C/N)
    drf.reset();
    Tensor<T, B> dqkv =
        attention_core_backward(ctx, dheads, s.c_attn.y, s.heads, s.lse, C_ / n_, NH_, shard_);
    dheads.reset();
    Tensor<T, B> dx = layernorm_backward(
        ctx, ln_1_, column_input_grad(ctx, c_attn_.backward(ctx, dqkv, s.c_attn)), s.ln_1);
    Ops<B>::residual_forward(ctx, dx.data(), dx.data(), dr.data(), n);
    s = Stash{};
    return dx;
  }

  /// Hugging Face order: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj.
  template <class F>
  void visit_parameters(F&& f) {
    ln_1_.visit_parameters(f);
    c_attn_.visit_parameters(f);
    f(attn_proj_.weight());
    f(attn_bias_);
    ln_2_.visit_parameters(f);
    c_fc_.visit_parameters(f);
    f(mlp_proj_.weight());
    f(mlp_bias_);
  }

  [[nodiscard]] bool sequence_parallel() const { return sp_; }

 private:
  /// A row split's partial sum of one token (the y of its stash `s`) summed over the group in
  /// place, plus the replicated bias: the decode's g.
  Tensor<T, B> row_sum(const Context<B>& ctx, typename Linear<T, B>::Stash& s,
                       const Parameter<T, B>& bias) {
    all_reduce_sum(*tp_, s.y);
    Ops<B>::bias_add(ctx, s.y.data(), bias.bound_weight().data(), 1, C_);
    return s.y.view();
  }

  /// f (or ḡ under sequence parallelism) forward: the column split's input, (B, T, C).
  Tensor<T, B> column_input(const Context<B>& ctx, const Tensor<T, B>& l, Tensor<T, B>& kept,
                            const Shape& full) {
    if (!sp_ || n_ == 1) return l.view(full);
    kept = gather_rows(ctx, *tp_, l, full, MemTag::activations);
    return kept.view();
  }
  /// f backward (all-reduce) or ḡ backward (reduce-scatter): the gradient of the LayerNorm output.
  Tensor<T, B> column_input_grad(const Context<B>& ctx, Tensor<T, B> d) {
    if (!sp_) {
      all_reduce_sum(*tp_, d);
      return d;
    }
    return reduce_scatter_rows(ctx, *tp_, d, MemTag::workspace);
  }
  /// g forward (all-reduce in place) or ḡ' forward (reduce-scatter, the partial sum is freed).
  Tensor<T, B> row_output(const Context<B>& ctx, Tensor<T, B> partial, Tensor<T, B>& owner,
                          Tensor<T, B>& kept) {
    if (!sp_) {
      all_reduce_sum(*tp_, partial);
      return partial;
    }
    kept = reduce_scatter_rows(ctx, *tp_, partial, MemTag::activations);
    owner.reset();
    return kept.view();
  }
  /// g backward (identity) or ḡ' backward (all-gather): the row split's output gradient.
  Tensor<T, B> row_output_grad(const Context<B>& ctx, const Tensor<T, B>& d, const Shape& full) {
    if (!sp_) return d.view(full);
    return gather_rows(ctx, *tp_, d, full, MemTag::workspace);
  }
  Tensor<T, B> layernorm_backward(const Context<B>& ctx, LayerNorm<T, B>& ln, const Tensor<T, B>& d,
                                  typename LayerNorm<T, B>::Stash& s) {
    return sp_ ? layernorm_backward_rows(ctx, *tp_, ln, d, s) : ln.backward(ctx, d, s);
  }

  std::int64_t C_;
  int n_;
  std::int64_t NH_;  // heads on this rank
  Comm* tp_;
  bool sp_;
  std::int64_t T_ = 0;
  SequenceShard<T, B>* shard_ = nullptr;
  LayerNorm<T, B> ln_1_;
  Linear<T, B> c_attn_;        // (C, 3C/N)   column
  Linear<T, B> attn_proj_;     // (C/N, C)    row, no bias
  Parameter<T, B> attn_bias_;  // (C)      replicated, added after g
  LayerNorm<T, B> ln_2_;
  Linear<T, B> c_fc_;  // (C, 4C/N)        column
  Gelu<T, B> gelu_;
  Linear<T, B> mlp_proj_;     // (4C/N, C) row, no bias
  Parameter<T, B> mlp_bias_;  // (C)       replicated, added after g
};

}  // namespace fourway::tp
