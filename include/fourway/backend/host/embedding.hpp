//! Host token + position embedding (GPT-2's wte and wpe), forward and scatter-add backward.
//!
//! Backward accumulates (`+=`) into `dwte` and `dwpe`. It is deterministic and rounds once per
//! parameter row: positions are bucketed by token (a counting sort, llm.c's scheme for its
//! CUDA encoder backward), each bucket is summed in fp32 in position order, and the sum is added
//! to the token's row once — so bf16 gradients do not lose the small contributions of a
//! frequent token, and the CUDA twin can follow the same order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway::host {

namespace detail {
/// Positions [0, n) grouped by token: `order` lists positions bucket after bucket (ascending
/// position inside a bucket), `starts[u]..starts[u+1]` is the bucket of `tokens_of[u]`.
struct TokenBuckets {
  std::vector<std::int32_t> tokens_of;
  std::vector<std::int64_t> starts;
  std::vector<std::int64_t> order;
};
inline TokenBuckets bucket_tokens(const std::int32_t* tokens, std::int64_t n) {
  std::int32_t max_token = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    check<ShapeError>(tokens[i] >= 0, "fourway: token ", tokens[i], " at position ", i,
                      " is negative");
    max_token = tokens[i] > max_token ? tokens[i] : max_token;
  }
  std::vector<std::int64_t> count(static_cast<std::size_t>(max_token) + 2, 0);
  for (std::int64_t i = 0; i < n; ++i) ++count[static_cast<std::size_t>(tokens[i]) + 1];
  for (std::size_t v = 1; v < count.size(); ++v) count[v] += count[v - 1];
  TokenBuckets b;
  b.order.resize(static_cast<std::size_t>(n));
  std::vector<std::int64_t> next(count.begin(), count.end() - 1);
  for (std::int64_t i = 0; i < n; ++i) b.order[next[tokens[i]]++] = i;
  for (std::size_t v = 0; v + 1 < count.size(); ++v) {
    if (count[v + 1] > count[v]) {
      b.tokens_of.push_back(static_cast<std::int32_t>(v));
      b.starts.push_back(count[v]);
    }
  }
  b.starts.push_back(n);
  return b;
}

/// Positions [0, n) whose token lies in the shard [vocab_start, vocab_start + Vlocal), grouped by
/// local token id (token - vocab_start); `order` holds the positions in [0, n).
inline TokenBuckets bucket_vocab_shard(const std::int32_t* tokens, std::int64_t n,
                                       std::int64_t vocab_start, std::int64_t Vlocal) {
  std::vector<std::int32_t> local;
  std::vector<std::int64_t> pos;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t t = tokens[i] - vocab_start;
    if (t >= 0 && t < Vlocal) {
      local.push_back(static_cast<std::int32_t>(t));
      pos.push_back(i);
    }
  }
  TokenBuckets b = bucket_tokens(local.data(), static_cast<std::int64_t>(local.size()));
  for (auto& o : b.order) o = pos[static_cast<std::size_t>(o)];
  return b;
}
}  // namespace detail

/// out (B, T, C) = wte[tokens[b, t]] + wpe[t]; tokens (B, T), wte (V, C), wpe (maxT >= T, C).
template <floating_dtype E>
void embedding_forward(const Context<Host>& /*ctx*/, E* out, const std::int32_t* tokens,
                       const E* wte, const E* wpe, std::int64_t B, std::int64_t T, std::int64_t C) {
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t) {
      E* o = out + (b * T + t) * C;
      const E* w = wte + static_cast<std::int64_t>(tokens[b * T + t]) * C;
      const E* p = wpe + t * C;
      for (std::int64_t c = 0; c < C; ++c) {
        o[c] = convert<E>(convert<float>(w[c]) + convert<float>(p[c]));
      }
    }
  }
}

}  // namespace fourway::host

namespace fourway {
/// Bounds check of token ids done by the embedding kernel itself (the device path of
/// `Embedding`, which cannot look at the ids on the host): ids outside [0, vocab) read nothing,
/// give a zero row, and `*first_bad` (backend memory, initialised to `none`) is lowered to the
/// smallest position holding one. The caller reads the flag once and names that id.
struct TokenGuard {
  static constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  std::int64_t vocab = 0;
  std::int64_t* first_bad = nullptr;
};
}  // namespace fourway

namespace fourway::host {

/// embedding_forward with the ids checked as the CUDA kernel does (see TokenGuard).
template <floating_dtype E>
void embedding_forward(const Context<Host>& ctx, E* out, const std::int32_t* tokens, const E* wte,
                       const E* wpe, std::int64_t B, std::int64_t T, std::int64_t C,
                       TokenGuard guard) {
  for (std::int64_t i = 0; i < B * T; ++i) {
    const std::int32_t id = tokens[i];
    if (id >= 0 && id < guard.vocab) {
      embedding_forward(ctx, out + i * C, tokens + i, wte, wpe + (i % T) * C, 1, 1, C);
    } else {
      for (std::int64_t c = 0; c < C; ++c) out[i * C + c] = convert<E>(0.0f);
      *guard.first_bad = std::min(*guard.first_bad, i);
    }
  }
}

/// dwte[tokens[b, t]] += dout[b, t]; dwpe[t] += sum_b dout[b, t].
template <floating_dtype E>
void embedding_backward(const Context<Host>& /*ctx*/, E* dwte, E* dwpe, const E* dout,
                        const std::int32_t* tokens, std::int64_t B, std::int64_t T,
                        std::int64_t C) {
  std::vector<float> acc(static_cast<std::size_t>(C));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < C; ++c) acc[c] = 0.0f;
    for (std::int64_t b = 0; b < B; ++b) {
      const E* d = dout + (b * T + t) * C;
      for (std::int64_t c = 0; c < C; ++c) acc[c] += convert<float>(d[c]);
    }
    E* w = dwpe + t * C;
    for (std::int64_t c = 0; c < C; ++c) w[c] = convert<E>(convert<float>(w[c]) + acc[c]);
  }
  const detail::TokenBuckets buckets = detail::bucket_tokens(tokens, B * T);
  for (std::size_t u = 0; u < buckets.tokens_of.size(); ++u) {
    for (std::int64_t c = 0; c < C; ++c) acc[c] = 0.0f;
    for (std::int64_t i = buckets.starts[u]; i < buckets.starts[u + 1]; ++i) {
      const E* d = dout + buckets.order[i] * C;
      for (std::int64_t c = 0; c < C; ++c) acc[c] += convert<float>(d[c]);
    }
    E* w = dwte + static_cast<std::int64_t>(buckets.tokens_of[u]) * C;
    for (std::int64_t c = 0; c < C; ++c) w[c] = convert<E>(convert<float>(w[c]) + acc[c]);
  }
}

/// Vocabulary-parallel lookup (TP): out (rows, C) = wte_shard[tokens[r] - vocab_start] when the
/// token lies in this rank's shard [vocab_start, vocab_start + Vlocal), else 0; a SUM all-reduce
/// over the shards gives the full lookup.
template <floating_dtype E>
void vocab_embed_forward(const Context<Host>& /*ctx*/, E* out, const std::int32_t* tokens,
                         const E* wte_shard, std::int64_t rows, std::int64_t C,
                         std::int64_t vocab_start, std::int64_t Vlocal) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t t = tokens[r] - vocab_start;
    E* o = out + r * C;
    if (t >= 0 && t < Vlocal) {
      for (std::int64_t c = 0; c < C; ++c) o[c] = wte_shard[t * C + c];
    } else {
      for (std::int64_t c = 0; c < C; ++c) o[c] = convert<E>(0.0f);
    }
  }
}

/// dwte_shard[tokens[r] - vocab_start] += dout[r] for the tokens of this shard (the others are
/// skipped), in the order of `embedding_backward`: per token, fp32 sum in position order, added
/// once.
template <floating_dtype E>
void vocab_embed_backward(const Context<Host>& /*ctx*/, E* dwte_shard, const E* dout,
                          const std::int32_t* tokens, std::int64_t rows, std::int64_t C,
                          std::int64_t vocab_start, std::int64_t Vlocal) {
  const detail::TokenBuckets buckets =
      detail::bucket_vocab_shard(tokens, rows, vocab_start, Vlocal);
  std::vector<float> acc(static_cast<std::size_t>(C));
  for (std::size_t u = 0; u < buckets.tokens_of.size(); ++u) {
    for (std::int64_t c = 0; c < C; ++c) acc[c] = 0.0f;
    for (std::int64_t i = buckets.starts[u]; i < buckets.starts[u + 1]; ++i) {
      const E* d = dout + buckets.order[i] * C;
      for (std::int64_t c = 0; c < C; ++c) acc[c] += convert<float>(d[c]);
    }
    E* w = dwte_shard + static_cast<std::int64_t>(buckets.tokens_of[u]) * C;
    for (std::int64_t c = 0; c < C; ++c) w[c] = convert<E>(convert<float>(w[c]) + acc[c]);
  }
}

}  // namespace fourway::host
