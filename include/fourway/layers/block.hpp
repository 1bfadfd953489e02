//! `TransformerBlock<T, B>`: GPT-2's pre-LayerNorm block,
//!   r = x + attn(ln_1(x));   y = r + mlp(ln_2(r)).
//!
//! Input and output (B, T, C). Backward adds the residual branches' gradients element-wise:
//!   dr = dy + ln_2ᵀ(mlpᵀ(dy));   dx = dr + ln_1ᵀ(attnᵀ(dr)).
//! Stashed per micro-batch (elements of T): 18·B·T·C, plus 4·B·T floats (the two LayerNorms'
//! mean and 1/std) and B·NH·T floats (the attention's log-sum-exp) — see docs/layers.md.
#pragma once

#include <cstdint>
#include <string>

#include "fourway/layers/attention.hpp"
#include "fourway/layers/layernorm.hpp"
#include "fourway/layers/mlp.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class TransformerBlock {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    typename LayerNorm<T, B>::Stash ln_1;
    typename CausalSelfAttention<T, B>::Stash attn;
    Tensor<T, B> r;  // (B, T, C) x + attn
    typename LayerNorm<T, B>::Stash ln_2;
    typename Mlp<T, B>::Stash mlp;
    Tensor<T, B> y;  // (B, T, C)
  };

  /// `name` is the block's prefix, "h.<i>" in the GPT.
  TransformerBlock(const Context<B>& ctx, const std::string& name, std::int64_t C,
                   std::int64_t heads, const Init& init)
      : ln_1_(ctx, name + ".ln_1", C),
        attn_(ctx, name + ".attn", C, heads, init),
        ln_2_(ctx, name + ".ln_2", C),
        mlp_(ctx, name + ".mlp", C, init) {}

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    Tensor<T, B> a = attn_.forward(ctx, ln_1_.forward(ctx, x, s.ln_1), s.attn);
    s.r = detail::activation<T, B>(ctx, x.shape());
    // r = x + a and ln_2(r) in one pass
    Tensor<T, B> m = mlp_.forward(ctx, ln_2_.forward_residual(ctx, x, a, s.r, s.ln_2), s.mlp);
    s.y = detail::activation<T, B>(ctx, x.shape());
    Ops<B>::residual_forward(ctx, s.y.data(), s.r.data(), m.data(), x.numel());
    return s.y.view();
  }

  /// One new token of one sequence (layers/kv_cache.hpp): x (1, 1, C) at position `pos`, its
  /// attention over `cache`, then the MLP, the residuals as in forward. Returns (1, 1, C).
  Tensor<T, B> decode(const Context<B>& ctx, const Tensor<T, B>& x, KvCache<T, B>& cache,
                      std::int64_t pos) const {
    typename LayerNorm<T, B>::Stash l1, l2;
    typename Mlp<T, B>::Stash ms;
    const Tensor<T, B> a = attn_.decode(ctx, ln_1_.forward(ctx, x, l1), cache, pos);
    Tensor<T, B> r = detail::activation<T, B>(ctx, x.shape());
    const Tensor<T, B> m = mlp_.forward(ctx, ln_2_.forward_residual(ctx, x, a, r, l2), ms);
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

  template <class F>
  void visit_parameters(F&& f) {
    ln_1_.visit_parameters(f);
    attn_.visit_parameters(f);
    ln_2_.visit_parameters(f);
    mlp_.visit_parameters(f);
  }

  LayerNorm<T, B>& ln_1() { return ln_1_; }
  CausalSelfAttention<T, B>& attn() { return attn_; }
  LayerNorm<T, B>& ln_2() { return ln_2_; }
  Mlp<T, B>& mlp() { return mlp_; }

 private:
  LayerNorm<T, B> ln_1_;
  CausalSelfAttention<T, B> attn_;
  LayerNorm<T, B> ln_2_;
  Mlp<T, B> mlp_;
};

static_assert(layer<TransformerBlock<float, Host>>);

}  // namespace fourway
