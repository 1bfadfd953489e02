//! `fw::generate`: new tokens from a GPT's current weights, one token per step over its KV caches
//! (layers/kv_cache.hpp), so each token of the prompt and of the output runs through the model
//! once; `pick_token`: the next token from one step's logits.
//!
//! A model for `generate` (`generative_model`) has `kv_caches(ctx, capacity)` and the decode of
//! one token unit by unit — `decode_embedding(ctx, token, pos)`, `decode_block(ctx, i, x, cache,
//! pos)`, `decode_head(ctx, x) -> std::vector<float>` (the next token's logits) — as
//! `fw::models::Gpt` does, whole or split over a tensor-parallel group; `decode_token` runs them in
//! order. The hooks are a strategy's (`ShardedStrategy::hooks()`): ZeRO-3 then gathers one unit at
//! a time for each token, as in a forward, and every rank of the group must generate together (the
//! same calls; the same seed gives the same tokens on every rank).
//!
//! Sampling (`SampleOptions`), as Hugging Face's `generate` and nanoGPT's sample.py define it:
//! temperature 0 is greedy (the first largest logit); otherwise the logits are divided by the
//! temperature, all but the `top_k` largest dropped (0: none dropped; a tie at the k-th value
//! keeps every tied logit), and a token drawn from their softmax with the run's own generator
//! (std::mt19937_64 seeded with `seed`, a uniform from its top 53 bits), so a seed gives the
//! same tokens on every platform.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/kv_cache.hpp"
#include "fourway/layers/layer.hpp"

namespace fourway {

/// A model `generate` runs (see the file comment): KV caches for the blocks it holds and each
/// unit's decode of one token.
template <class M>
concept generative_model =
    requires(M& m, const Context<typename M::backend_type>& ctx,
             const Tensor<typename M::value_type, typename M::backend_type>& x,
             KvCache<typename M::value_type, typename M::backend_type>& cache, std::int32_t tok,
             std::int64_t pos) {
  {
    m.kv_caches(ctx, pos)
    } -> std::same_as<std::vector<KvCache<typename M::value_type, typename M::backend_type>>>;
  {
    m.decode_embedding(ctx, tok, pos)
    } -> std::same_as<Tensor<typename M::value_type, typename M::backend_type>>;
  {
    m.decode_block(ctx, tok, x, cache, pos)
    } -> std::same_as<Tensor<typename M::value_type, typename M::backend_type>>;
  { m.decode_head(ctx, x) } -> std::same_as<std::vector<float>>;
  { m.units() } -> std::convertible_to<int>;
};

/// Token `token` at position `pos` of the sequence whose earlier tokens `caches` hold (one per
/// block, from `kv_caches`), through the whole model: the embedding, every block (each appending
/// the token's key and value to its cache) and the head; returns the next token's logits on the
/// host. The hooks bracket each unit (0 the embedding, i+1 block i, the head last) as forward's
/// do, so a ZeRO-3 strategy gathers one unit at a time. Nothing is kept but the caches.
template <generative_model Model, class Hooks = NoHooks>
std::vector<float> decode_token(
    const Context<typename Model::backend_type>& ctx, Model& model, std::int32_t token,
    std::int64_t pos,
    std::vector<KvCache<typename Model::value_type, typename Model::backend_type>>& caches,
    Hooks&& hooks = Hooks{}) {
  const int layers = model.units() - 2;
  check<ConfigError>(static_cast<int>(caches.size()) == layers, "fourway: decode_token got ",
                     caches.size(), " KV caches for ", layers,
                     " blocks; make them with kv_caches() of the whole model");
  hooks.pre_forward(0);
  auto x = model.decode_embedding(ctx, token, pos);
  hooks.post_forward(0);
  for (int i = 0; i < layers; ++i) {
    hooks.pre_forward(i + 1);
    x = model.decode_block(ctx, i, x, caches[static_cast<std::size_t>(i)], pos);
    hooks.post_forward(i + 1);
  }
  hooks.pre_forward(layers + 1);
  std::vector<float> logits = model.decode_head(ctx, x);
  hooks.post_forward(layers + 1);
  return logits;
}

struct SampleOptions {
  int tokens = 64;           // new tokens after the prompt
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: every token of the vocabulary
  std::uint64_t seed = 1337;
};

/// The next token from `logits` under `o` (the generator is used unless greedy).
inline std::int32_t pick_token(std::span<const float> logits, const SampleOptions& o,
                               std::mt19937_64& rng) {
  check<ConfigError>(!logits.empty(), "fourway: pick_token of no logits");
  check<ConfigError>(o.temperature >= 0.0f && std::isfinite(o.temperature),
                     "fourway: the sampling temperature must be >= 0 (0: greedy), got ",
                     o.temperature);
  check<ConfigError>(o.top_k >= 0, "fourway: top-k must be >= 0 (0: no cut), got ", o.top_k);
  const auto first_max = [&] {
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
  };
  if (o.temperature == 0.0f) return first_max();
  float floor = -INFINITY;  // logits below it are dropped (top-k)
  if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < logits.size()) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(),
                     std::greater<>());
    floor = sorted[static_cast<std::size_t>(o.top_k - 1)];
  }
  const double mx = static_cast<double>(logits[static_cast<std::size_t>(first_max())]);
  std::vector<double> w(logits.size(), 0.0);
  double sum = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] < floor) continue;
    w[i] = std::exp((static_cast<double>(logits[i]) - mx) / static_cast<double>(o.temperature));
    sum += w[i];
  }
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double acc = 0.0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    acc += w[i];
    if (u < acc) return static_cast<std::int32_t>(i);
  }
  return first_max();  // only when rounding leaves u at the very end
}

/// `o.tokens` new tokens after `prompt` (at least one token), from the model as it is now: the
/// prompt is decoded token by token into the caches, then each new token is picked from the
/// last logits and decoded in turn. Prompt and new tokens must fit in the model's context.
template <generative_model Model, class Hooks = NoHooks>
std::vector<std::int32_t> generate(const Context<typename Model::backend_type>& ctx, Model& model,
                                   std::span<const std::int32_t> prompt, const SampleOptions& o,
                                   Hooks&& hooks = Hooks{}) {
  check<ConfigError>(!prompt.empty(), "fourway: generate needs a prompt of at least one token");
  check<ConfigError>(o.tokens >= 1, "fourway: generate needs at least one new token, got ",
                     o.tokens);
  const auto n = static_cast<std::int64_t>(prompt.size());
  auto caches = model.kv_caches(ctx, n + o.tokens);
  std::mt19937_64 rng(o.seed);
  std::vector<float> logits;
  for (std::int64_t i = 0; i < n; ++i)
    logits = decode_token(ctx, model, prompt[static_cast<std::size_t>(i)], i, caches, hooks);
  std::vector<std::int32_t> out;
  for (int k = 0; k < o.tokens; ++k) {
    out.push_back(pick_token(logits, o, rng));
    if (k + 1 < o.tokens) logits = decode_token(ctx, model, out.back(), n + k, caches, hooks);
  }
  return out;
}

}  // namespace fourway
