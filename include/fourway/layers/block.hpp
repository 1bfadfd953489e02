//! `TransformerBlock<T, B, Comm>`: GPT-2's pre-LayerNorm block,
//!   r = x + attn(ln_1(x));   y = r + mlp(ln_2(r)),
//! built from tensor-parallel-ready layers, so one definition serves every mesh: in a group of
//! one rank (the default) the unsplit block; over a `TpGroup` of N ranks (Megatron-LM, Shoeybi et
//! al. 2019, §3) the attention is split by heads and the MLP by hidden units, each layer placing
//! its own conjugate operators:
//! ```
//!   x ─ ln_1 ─ f ─ c_attn (C, 3C/N) ─ attention, NH/N heads ─ c_proj (C/N, C) ─ g ─ +b ─ +x = r
//!   r ─ ln_2 ─ f ─ c_fc (C, 4C/N) ─ gelu ─ c_proj (4C/N, C) ─ g ─ +b ─ +r = y
//! ```
//! With sequence parallelism (Korthikanti et al. 2022) x, r and y are this rank's chunk (B·T/N,
//! C) of the rows, f is an all-gather, g a reduce-scatter, and the norms' gain and bias gradients
//! are summed over the group (`ReplicatedNorm`); the sequence length then comes from
//! `set_sequence_length`.
//!
//! Input and output (B, T, C). Forward writes r = x + a and ln_2(r) in one pass; backward adds
//! the residual branches' gradients inside each norm's backward:
//!   dr = dy + ln_2ᵀ(mlpᵀ(dy));   dx = dr + ln_1ᵀ(attnᵀ(dr)).
//! Stashed per micro-batch at N = 1 (elements of T): 18·B·T·C, plus 4·B·T floats (the two
//! LayerNorms' mean and 1/std) and B·NH·T floats (the attention's log-sum-exp) — docs/layers.md.
#pragma once

#include <cstdint>
#include <string>

#include "fourway/layers/attention.hpp"
#include "fourway/layers/layernorm.hpp"
#include "fourway/layers/mlp.hpp"
#include "fourway/layers/replicated_norm.hpp"

namespace fourway {

template <floating_dtype T, backend B, class Comm = Alone>
class TransformerBlock {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  using Norm = ReplicatedNorm<LayerNorm<T, B>, Comm>;
  using Attention = CausalSelfAttention<T, B, Comm>;
  struct Stash {
    typename Norm::Stash ln_1;
    typename Attention::Stash attn;
    Tensor<T, B> r;  // x + attn, the shape of x
    typename Norm::Stash ln_2;
    typename Mlp<T, B, Comm>::Stash mlp;
    Tensor<T, B> y;  // the shape of x
  };

  /// `name` is the block's prefix, "h.<i>" in the GPT; `group` the tensor-parallel group (one
  /// rank by default).
  TransformerBlock(const Context<B>& ctx, const std::string& name, std::int64_t C,
                   std::int64_t heads, const Init& init, TpGroup<Comm> group = {})
      : ln_1_(ctx, name + ".ln_1", C, 1e-5f, group),
        attn_(ctx, name + ".attn", C, heads, init, group),
        ln_2_(ctx, name + ".ln_2", C, 1e-5f, group),
        mlp_(ctx, name + ".mlp", C, init, group) {}

  /// The sequence length T of the next forward (needed under sequence parallelism only, where
  /// the input's B·T/N rows do not show it).
  void set_sequence_length(std::int64_t seq) { attn_.set_sequence_length(seq); }
  /// Context parallelism: the rows are the shard's part of each sequence and the attention its
  /// ring (null: whole sequences). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) { attn_.bind_sequence_shard(shard); }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    Tensor<T, B> a = attn_.forward(ctx, ln_1_.forward(ctx, x, s.ln_1), s.attn);
    s.r = detail::activation<T, B>(ctx, x.shape());
    // r = x + a and ln_2(r) in one pass
    Tensor<T, B> m = mlp_.forward(ctx, ln_2_.forward_residual(ctx, x, a, s.r, s.ln_2), s.mlp);
    s.y = detail::activation<T, B>(ctx, x.shape());
    Ops<B>::residual_forward(ctx, s.y.data(), s.r.data(), m.data(), x.numel());
    return s.y.view();
  }

  /// One new token of one sequence (layers/kv_cache.hpp): x (1, 1, C) at position `pos`, the
  /// same on every rank of the group, its attention over `cache` (this rank's heads), then the
  /// MLP, the residuals as in forward. Returns (1, 1, C); nothing is kept for a backward.
  Tensor<T, B> decode(const Context<B>& ctx, const Tensor<T, B>& x, KvCache<T, B>& cache,
                      std::int64_t pos) const {
    typename Norm::Stash l1, l2;
    const Tensor<T, B> a = attn_.decode(ctx, ln_1_.forward(ctx, x, l1), cache, pos);
    Tensor<T, B> r = detail::activation<T, B>(ctx, x.shape());
    const Tensor<T, B> m = mlp_.decode(ctx, ln_2_.forward_residual(ctx, x, a, r, l2));
    Tensor<T, B> y = detail::activation<T, B>(ctx, x.shape());
    Ops<B>::residual_forward(ctx, y.data(), r.data(), m.data(), x.numel());
    return y;
  }

  /// Selective recomputation (Korthikanti et al. 2022, Megatron-Core's core-attention recompute):
  /// after forward, frees what is cheap to recompute — the attention core's output and
  /// log-sum-exp, GELU's output — and keeps the linear layers' outputs; backward recomputes both
  /// first, so the rest of it runs on the whole stash, as without recomputation.
  void drop_recomputable(Stash& s) const {
    attn_.drop_recomputable(s.attn);
    mlp_.drop_recomputable(s.mlp);
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    check<ShapeError>(dy.numel() == s.y.numel() && !s.y.empty(), "fourway: TransformerBlock ",
                      "backward without a matching forward: dy ", dy.shape().str());
    attn_.recompute(ctx, s.attn);
    mlp_.recompute(ctx, s.mlp);
    // each norm's backward adds the residual path's gradient in its own pass
    Tensor<T, B> dr = ln_2_.backward(ctx, mlp_.backward(ctx, dy, s.mlp), s.ln_2, &dy);
    Tensor<T, B> dx = ln_1_.backward(ctx, attn_.backward(ctx, dr, s.attn), s.ln_1, &dr);
    s = Stash{};
    return dx;
  }

  /// Hugging Face order: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj.
  template <class F>
  void visit_parameters(F&& f) {
    ln_1_.visit_parameters(f);
    attn_.visit_parameters(f);
    ln_2_.visit_parameters(f);
    mlp_.visit_parameters(f);
  }

  LayerNorm<T, B>& ln_1() { return ln_1_.norm(); }
  Attention& attn() { return attn_; }
  LayerNorm<T, B>& ln_2() { return ln_2_.norm(); }
  Mlp<T, B, Comm>& mlp() { return mlp_; }

 private:
  Norm ln_1_;
  Attention attn_;
  Norm ln_2_;
  Mlp<T, B, Comm> mlp_;
};

static_assert(layer<TransformerBlock<float, Host>>);

}  // namespace fourway
