//! CUDA token + position embedding, twin of `host/embedding.hpp`. The checked forward
//! (`TokenGuard`) bounds-checks the ids on the device and records the first bad position in a
//! device flag, which `Embedding` reads once per backward.
//!
//! Backward is deterministic with no atomics: `dwpe[t]` sums its B rows in order; for `dwte`
//! the token ids are copied to the host and bucketed by token with the host's own
//! `detail::bucket_tokens` (llm.c's scheme), the buckets go back to the device in a workspace
//! tensor, and one thread per (bucket, channel) sums its positions in order and adds the sum
//! once — the same fp32 order as the host, so fp32 results match the host bitwise. The copy
//! synchronises the stream once per backward.
#pragma once

#include <cstdint>
#include <vector>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/host/embedding.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway::cuda {

/// out (B, T, C) = wte[tokens[b, t]] + wpe[t], with the ids checked on the device (TokenGuard,
/// host/embedding.hpp): a bad id reads nothing, its row is zero, and the smallest bad position is
/// recorded with atomicMin (when `guard.first_bad` is set).
template <floating_dtype E>
void embedding_forward(const Context<Cuda>& ctx, E* out, const std::int32_t* tokens, const E* wte,
                       const E* wpe, std::int64_t B, std::int64_t T, std::int64_t C,
                       TokenGuard guard) {
  const std::int64_t V = guard.vocab;
  auto* first_bad = reinterpret_cast<long long*>(guard.first_bad);
  detail::for_each(
      ctx, B * T * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t bt = i / C;
        const std::int64_t c = i % C;
        const std::int64_t t = bt % T;
        const std::int64_t id = tokens[bt];
        if (id < 0 || id >= V) {
          detail::store(out + i, 0.0f);
          if (c == 0 && first_bad != nullptr) atomicMin(first_bad, static_cast<long long>(bt));
          return;
        }
        detail::store(out + i, detail::load(wte + id * C + c) + detail::load(wpe + t * C + c));
      },
      "embedding_forward");
}

/// out (B, T, C) = wte[tokens[b, t]] + wpe[t]; an id outside [0, 2^63) (a negative one) reads
/// nothing and gives a zero row.
template <floating_dtype E>
void embedding_forward(const Context<Cuda>& ctx, E* out, const std::int32_t* tokens, const E* wte,
                       const E* wpe, std::int64_t B, std::int64_t T, std::int64_t C) {
  embedding_forward(ctx, out, tokens, wte, wpe, B, T, C, TokenGuard{TokenGuard::none, nullptr});
}

namespace detail {
/// dwte[token of bucket u] += the fp32 sum, in position order, of dout's rows in bucket u, once
/// per bucket and channel (llm.c's encoder backward): the buckets go to the device in one int64
/// workspace [order | starts | token of each bucket]. Synchronises (the workspace is freed).
template <floating_dtype E>
void add_token_buckets(const Context<Cuda>& ctx, E* dwte, const E* dout,
                       const host::detail::TokenBuckets& buckets, std::int64_t C,
                       const char* what) {
  const auto nb = static_cast<std::int64_t>(buckets.tokens_of.size());
  if (nb == 0 || C <= 0) return;
  const auto n = static_cast<std::int64_t>(buckets.order.size());
  std::vector<std::int64_t> packed;
  packed.reserve(static_cast<std::size_t>(n + 2 * nb + 1));
  packed.insert(packed.end(), buckets.order.begin(), buckets.order.end());
  packed.insert(packed.end(), buckets.starts.begin(), buckets.starts.end());
  packed.insert(packed.end(), buckets.tokens_of.begin(), buckets.tokens_of.end());
  Tensor<std::int64_t, Cuda> dev({static_cast<std::int64_t>(packed.size())}, MemTag::workspace,
                                 ctx.memory());
  from_host(ctx, dev.data(), packed.data(), static_cast<std::int64_t>(packed.size()));
  const std::int64_t* order = dev.data();
  const std::int64_t* starts = order + n;
  const std::int64_t* token_of = starts + nb + 1;
  for_each(
      ctx, nb * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t u = i / C;
        const std::int64_t c = i % C;
        float s = 0.0f;
        for (std::int64_t j = starts[u]; j < starts[u + 1]; ++j) s += load(dout + order[j] * C + c);
        E* w = dwte + token_of[u] * C + c;
        store(w, load(w) + s);
      },
      what);
  // `dev` is freed on return; the kernel must be done with it
  ctx.synchronize("the embedding backward's token buckets (their workspace freed)");
}
}  // namespace detail

/// dwte[tokens[b, t]] += dout[b, t]; dwpe[t] += sum_b dout[b, t].
template <floating_dtype E>
void embedding_backward(const Context<Cuda>& ctx, E* dwte, E* dwpe, const E* dout,
                        const std::int32_t* tokens, std::int64_t B, std::int64_t T,
                        std::int64_t C) {
  const std::int64_t n = B * T;
  if (n <= 0 || C <= 0) return;
  detail::for_each(
      ctx, T * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t t = i / C;
        const std::int64_t c = i % C;
        float s = 0.0f;
        for (std::int64_t b = 0; b < B; ++b) s += detail::load(dout + (b * T + t) * C + c);
        detail::store(dwpe + i, detail::load(dwpe + i) + s);
      },
      "embedding_backward (wpe)");

  std::vector<std::int32_t> host_tokens(static_cast<std::size_t>(n));
  to_host(ctx, host_tokens.data(), tokens, n);
  detail::add_token_buckets(ctx, dwte, dout, host::detail::bucket_tokens(host_tokens.data(), n), C,
                            "embedding_backward (wte)");
}

/// Vocabulary-parallel lookup, twin of `host::vocab_embed_forward`.
template <floating_dtype E>
void vocab_embed_forward(const Context<Cuda>& ctx, E* out, const std::int32_t* tokens,
                         const E* wte_shard, std::int64_t rows, std::int64_t C,
                         std::int64_t vocab_start, std::int64_t Vlocal) {
  detail::for_each(
      ctx, rows * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t t = tokens[i / C] - vocab_start;
        detail::store(out + i,
                      (t >= 0 && t < Vlocal) ? detail::load(wte_shard + t * C + i % C) : 0.0f);
      },
      "vocab_embed_forward");
}

/// Vocabulary-parallel scatter-add, twin of `host::vocab_embed_backward` (same buckets, same
/// fp32 order; the ids are bucketed on the host as in `embedding_backward`).
template <floating_dtype E>
void vocab_embed_backward(const Context<Cuda>& ctx, E* dwte_shard, const E* dout,
                          const std::int32_t* tokens, std::int64_t rows, std::int64_t C,
                          std::int64_t vocab_start, std::int64_t Vlocal) {
  if (rows <= 0 || C <= 0) return;
  std::vector<std::int32_t> host_tokens(static_cast<std::size_t>(rows));
  to_host(ctx, host_tokens.data(), tokens, rows);
  const host::detail::TokenBuckets buckets =
      host::detail::bucket_vocab_shard(host_tokens.data(), rows, vocab_start, Vlocal);
  detail::add_token_buckets(ctx, dwte_shard, dout, buckets, C, "vocab_embed_backward");
}

}  // namespace fourway::cuda
