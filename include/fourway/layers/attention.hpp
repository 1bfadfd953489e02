//! `CausalSelfAttention<T, B>`: GPT-2's attention — c_attn (C -> 3C, q|k|v side by side), causal
//! softmax(q·kᵀ/sqrt(C/NH))·v per head, c_proj (C -> C).
//!
//! Input and output (B, T, C). The attention itself is the flash-style kernel
//! (`flash_attention_forward`, backend/host/flash_attention.hpp): the stash holds the two Linear
//! stashes, the head outputs (B, T, C) and each query row's fp32 log-sum-exp (B, NH, T) — O(T) per
//! head, not the (B, NH, T, T) probabilities; backward recomputes the probabilities tile by tile
//! and needs one fp32 value per row of scratch (MemTag::workspace).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "fourway/layers/kv_cache.hpp"
#include "fourway/layers/linear.hpp"
#include "fourway/layers/sequence_shard.hpp"

namespace fourway {

/// The causal attention core of q|k|v (Bn, Tn, 3·width) over `heads` heads: its output `y`
/// (Bn, Tn, width) and each query row's fp32 log-sum-exp `lse` (Bn, heads, Tn), allocated as
/// activations — in forward, and again in backward under selective recomputation. With a
/// `shard` (context parallelism) the rows are this rank's part of each sequence and the shard's
/// attention (a ring over its ranks) replaces the local kernel.
template <floating_dtype T, backend B>
void attention_core(const Context<B>& ctx, const Tensor<T, B>& qkv, std::int64_t Bn,
                    std::int64_t Tn, std::int64_t width, std::int64_t heads, Tensor<float, B>& lse,
                    Tensor<T, B>& y, SequenceShard<T, B>* shard = nullptr) {
  lse = detail::activation<float, B>(ctx, Shape{Bn, heads, Tn});
  y = detail::activation<T, B>(ctx, Shape{Bn, Tn, width});
  if (splits_sequences(shard)) {
    shard->attention_forward(ctx, y.data(), lse.data(), qkv.data(), Bn, Tn, width, heads);
  } else {
    Ops<B>::flash_attention_forward(ctx, y.data(), lse.data(), qkv.data(), Bn, Tn, width, heads);
  }
}

/// The backward of `attention_core`: dqkv (Bn, Tn, 3·width), a workspace, from the heads'
/// gradient `dy` and the forward's qkv, y and lse (the shard's ring when it has one).
template <floating_dtype T, backend B>
Tensor<T, B> attention_core_backward(const Context<B>& ctx, const Tensor<T, B>& dy,
                                     const Tensor<T, B>& qkv, const Tensor<T, B>& y,
                                     const Tensor<float, B>& lse, std::int64_t width,
                                     std::int64_t heads, SequenceShard<T, B>* shard = nullptr) {
  const std::int64_t Bn = lse.shape()[0];
  const std::int64_t Tn = lse.shape()[2];
  Tensor<T, B> dqkv = detail::workspace<T, B>(ctx, Shape{Bn, Tn, 3 * width});
  if (splits_sequences(shard)) {
    shard->attention_backward(ctx, dqkv.data(), dy.data(), qkv.data(), y.data(), lse.data(), Bn, Tn,
                              width, heads);
  } else {
    Tensor<float, B> delta = detail::workspace<float, B>(ctx, lse.shape());
    Ops<B>::flash_attention_backward(ctx, dqkv.data(), delta.data(), dy.data(), qkv.data(),
                                     y.data(), lse.data(), Bn, Tn, width, heads);
  }
  return dqkv;
}

template <floating_dtype T, backend B>
class CausalSelfAttention {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    typename Linear<T, B>::Stash c_attn;  // y = qkv (B, T, 3C)
    Tensor<float, B> lse;                 // (B, NH, T) log-sum-exp of each row's scores
    Tensor<T, B> y;                       // (B, T, C) heads side by side
    typename Linear<T, B>::Stash c_proj;  // y = output (B, T, C)
  };

  /// Parameters "<name>.c_attn.{weight,bias}" (C, 3C) and "<name>.c_proj.{weight,bias}" (C, C);
  /// c_proj's weight is initialised with `init.residual_std`.
  CausalSelfAttention(const Context<B>& ctx, const std::string& name, std::int64_t C,
                      std::int64_t heads, const Init& init)
      : C_(C),
        NH_(heads),
        c_attn_(ctx, name + ".c_attn", C, 3 * C, init.seed, init.std),
        c_proj_(ctx, name + ".c_proj", C, C, init.seed, init.residual_std) {
    check<ConfigError>(heads > 0 && C % heads == 0, "fourway: attention ", name, " needs dim C=", C,
                       " divisible by heads=", heads, "; pick heads dividing C");
  }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    check<ShapeError>(x.shape().rank() == 3 && x.shape()[2] == C_, "fourway: attention expects ",
                      "(B, T, ", C_, "), got ", x.shape().str());
    const std::int64_t Bn = x.shape()[0];
    const std::int64_t Tn = x.shape()[1];
    Tensor<T, B> qkv = c_attn_.forward(ctx, x, s.c_attn);
    attention_core(ctx, qkv, Bn, Tn, C_, NH_, s.lse, s.y, shard_);
    return c_proj_.forward(ctx, s.y, s.c_proj);
  }

  /// One new token of one sequence, x (1, 1, C) at position `pos`: its key and value go to row
  /// `pos` of `cache` and it attends over rows [0, pos] (layers/kv_cache.hpp). Returns the
  /// layer's output (1, 1, C); nothing is kept for a backward.
  Tensor<T, B> decode(const Context<B>& ctx, const Tensor<T, B>& x, KvCache<T, B>& cache,
                      std::int64_t pos) const {
    typename Linear<T, B>::Stash in, out;
    const Tensor<T, B> qkv = c_attn_.forward(ctx, x, in);
    const Tensor<T, B> y = decode_attention(ctx, qkv, cache, pos, C_, NH_);
    (void)c_proj_.forward(ctx, y, out);
    return std::move(out.y);
  }

  /// Selective recomputation: frees the attention core's output and log-sum-exp after forward;
  /// `recompute` (or backward, when it finds them missing) computes them again from the kept
  /// q|k|v with the same kernel.
  void drop_recomputable(Stash& s) const {
    s.y.reset();
    s.lse.reset();
    s.c_proj.x.reset();
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    recompute(ctx, s);
    check<ShapeError>(s.lse.shape().rank() == 3 && dy.numel() == s.y.numel(),
                      "fourway: ", "attention backward without a matching forward: dy ",
                      dy.shape().str());
    Tensor<T, B> dheads = c_proj_.backward(ctx, dy, s.c_proj);
    Tensor<T, B> dqkv =
        attention_core_backward(ctx, dheads, s.c_attn.y, s.y, s.lse, C_, NH_, shard_);
    dheads.reset();
    Tensor<T, B> dx = c_attn_.backward(ctx, dqkv, s.c_attn);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    c_attn_.visit_parameters(f);
    c_proj_.visit_parameters(f);
  }

  [[nodiscard]] std::int64_t features() const { return C_; }
  [[nodiscard]] std::int64_t heads() const { return NH_; }
  /// Context parallelism: this layer's rows are the shard's part of each sequence and its
  /// attention is the shard's (null: whole sequences, the local kernel). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) { shard_ = shard; }
  Linear<T, B>& c_attn() { return c_attn_; }
  Linear<T, B>& c_proj() { return c_proj_; }

  void recompute(const Context<B>& ctx, Stash& s) const {
    if (!s.y.empty() || s.c_attn.y.shape().rank() != 3) return;
    attention_core(ctx, s.c_attn.y, s.c_attn.y.shape()[0], s.c_attn.y.shape()[1], C_, NH_, s.lse,
                   s.y, shard_);
    s.c_proj.x = s.y.view();
  }

 private:
  std::int64_t C_;
  std::int64_t NH_;
  Linear<T, B> c_attn_;
  Linear<T, B> c_proj_;
  SequenceShard<T, B>* shard_ = nullptr;
};

static_assert(layer<CausalSelfAttention<float, Host>>);

}  // namespace fourway
