//! Incremental decoding's state: `KvCache<T, B>`, one attention layer's keys and values of the
//! tokens of one sequence decoded so far, and `decode_attention`, one new token's attention over
//! them. What `fw::generate` (layers/generate.hpp) runs a GPT with, one token per step, so that
//! no earlier token is run through the model again.
//!
//!   cache   k, v (heads, capacity, hs) each, backend memory tagged activations; row `pos` of
//!           every head holds the key / value of the token at position `pos`
//!   decode  q|k|v (1, 1, 3C) of the token at `pos` (GPT-2's c_attn layout: q, then k, then v,
//!           heads side by side in each): its k, v are copied to row `pos`, then per head
//!           s = q Kᵀ / √hs over rows [0, pos] (fp32), p = softmax(s), y = p V
//!
//! The causal mask is the cache itself: it holds no later token. Scores and their softmax are
//! fp32 whatever T is (p is cast to T for the product with V, as the blockwise attention does);
//! the GEMMs are the backend's strided-batched ones, one batch entry per head.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "fourway/backend/gemm_types.hpp"
#include "fourway/backend/ops.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

template <class T, class B>
struct KvCache {
  Tensor<T, B> k;  // (heads, capacity, hs)
  Tensor<T, B> v;
  std::int64_t capacity = 0;

  KvCache() = default;
  KvCache(const Context<B>& ctx, std::int64_t heads, std::int64_t capacity_, std::int64_t hs)
      : k(Shape{heads, capacity_, hs}, MemTag::activations, ctx.memory()),
        v(Shape{heads, capacity_, hs}, MemTag::activations, ctx.memory()),
        capacity(capacity_) {}
};

/// `blocks` caches of `heads` heads of size `hs` for one sequence of up to `capacity` tokens of a
/// model whose context is `context` (what a model's `kv_caches` returns).
template <class T, class B>
std::vector<KvCache<T, B>> make_kv_caches(const Context<B>& ctx, std::size_t blocks,
                                          std::int64_t heads, std::int64_t hs,
                                          std::int64_t capacity, std::int64_t context) {
  check<ConfigError>(capacity >= 1 && capacity <= context, "fourway: a KV cache of ", capacity,
                     " tokens; the model's context is ", context,
                     " (prompt and new tokens together must fit in it)");
  std::vector<KvCache<T, B>> caches;
  for (std::size_t i = 0; i < blocks; ++i) caches.emplace_back(ctx, heads, capacity, hs);
  return caches;
}

namespace detail {
/// Throws unless `token` is an id of the vocabulary and `pos` a position of the context.
inline void check_decode_position(std::int32_t token, std::int64_t pos, std::int64_t vocab,
                                  std::int64_t context) {
  check<ShapeError>(token >= 0 && token < vocab, "fourway: token id ", token,
                    " is outside the vocabulary [0, ", vocab, ")");
  check<ConfigError>(pos >= 0 && pos < context, "fourway: position ", pos,
                     " is past the model's context of ", context, " tokens");
}
/// The first `vocab` of one row of logits (1, Vp), as float on the host.
template <class T, class B>
std::vector<float> logits_to_host(const Context<B>& ctx, const Tensor<T, B>& logits,
                                  std::int64_t vocab) {
  std::vector<T> host(static_cast<std::size_t>(logits.numel()));
  Ops<B>::to_host(ctx, host.data(), logits.data(), logits.numel());
  std::vector<float> out(static_cast<std::size_t>(vocab));
  for (std::size_t v = 0; v < out.size(); ++v) out[v] = convert<float>(host[v]);
  return out;
}
}  // namespace detail

/// The attention of the token whose q|k|v (1, 1, 3C) is `qkv`, at position `pos`, over the
/// cache's rows [0, pos] after storing its own key and value in row `pos`; returns (1, 1, C),
/// the heads side by side.
template <class T, class B>
Tensor<T, B> decode_attention(const Context<B>& ctx, const Tensor<T, B>& qkv, KvCache<T, B>& c,
                              std::int64_t pos, std::int64_t C, std::int64_t heads) {
  check<ShapeError>(qkv.numel() == 3 * C && heads > 0 && C % heads == 0,
                    "fourway: decode_attention takes one token's q|k|v of 3·", C, " values, got ",
                    qkv.shape().str());
  check<ConfigError>(pos >= 0 && pos < c.capacity, "fourway: position ", pos,
                     " is outside the KV cache of ", c.capacity,
                     " tokens; make the caches for the prompt and every new token");
  const std::int64_t hs = C / heads;
  const std::int64_t t = pos + 1;
  const std::int64_t head = c.capacity * hs;  // one head's rows in the cache
  for (std::int64_t h = 0; h < heads; ++h) {
    Ops<B>::copy(ctx, c.k.data() + h * head + pos * hs, qkv.data() + C + h * hs, hs);
    Ops<B>::copy(ctx, c.v.data() + h * head + pos * hs, qkv.data() + 2 * C + h * hs, hs);
  }
  Tensor<float, B> s(Shape{heads, t}, MemTag::workspace, ctx.memory());
  Tensor<float, B> p(Shape{heads, t}, MemTag::workspace, ctx.memory());
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
  Ops<B>::gemm_strided_batched(ctx, Trans::none, Trans::transpose, 1, t, hs, scale, qkv.data(), hs,
                               hs, c.k.data(), hs, head, 0.0f, s.data(), t, t, heads);
  Ops<B>::softmax_forward(ctx, p.data(), s.data(), heads, t);
  Tensor<T, B> y(Shape{1, 1, C}, MemTag::activations, ctx.memory());
  if constexpr (std::is_same_v<T, float>) {
    Ops<B>::gemm_strided_batched(ctx, Trans::none, Trans::none, 1, hs, t, 1.0f, p.data(), t, t,
                                 c.v.data(), hs, head, 0.0f, y.data(), hs, hs, heads);
  } else {
    Tensor<T, B> pt(Shape{heads, t}, MemTag::workspace, ctx.memory());
    Ops<B>::cast(ctx, pt.data(), p.data(), heads * t);
    Ops<B>::gemm_strided_batched(ctx, Trans::none, Trans::none, 1, hs, t, 1.0f, pt.data(), t, t,
                                 c.v.data(), hs, head, 0.0f, y.data(), hs, hs, heads);
  }
  return y;
}

}  // namespace fourway
