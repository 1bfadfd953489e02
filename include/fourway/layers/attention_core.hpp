//! The causal attention core that every attention layer runs on its q|k|v (the heads it
//! holds): `attention_core` and its backward, the flash-style kernel
//! (`flash_attention_forward`, backend/host/flash_attention.hpp) or, under context parallelism,
//! the sequence shard's ring. The forward keeps the heads' output and each query row's fp32
//! log-sum-exp — O(T) per head, not the (B, NH, T, T) probabilities; the backward recomputes the
//! probabilities tile by tile with one fp32 value per row of scratch (MemTag::workspace).
#pragma once

#include <cstdint>

#include "fourway/layers/layer.hpp"
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

}  // namespace fourway
