//! Transformer shapes and their exact parameter counts, whole and per tensor/pipeline rank.
//!
//! Two families. `gpt2`: pre-LayerNorm blocks with biases, a 4h GELU MLP, learned positions and
//! an LM head tied to the token embedding — 12h² + 13h parameters per block. `llama`: RMSNorm,
//! no biases, SwiGLU MLP of width `ffn`, rotary positions, grouped-query attention with
//! `kv_heads`, untied head. Under tensor parallelism of degree t the split is Megatron's
//! (Shoeybi et al. 2019): QKV, MLP-in column-parallel (weights and biases / t), attention and MLP
//! output row-parallel (weights / t, bias replicated), norms and position embeddings replicated,
//! the vocabulary split with ceil(V/t) rows on the fullest rank. Under pipeline parallelism the
//! embedding sits on the first stage and the head on the last; a tied head keeps its own copy of
//! the token embedding on the last stage when there is more than one stage (as Megatron does).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "fourway/plan/model_state.hpp"

namespace fourway::plan {

enum class Family : std::uint8_t { gpt2, llama };

struct Architecture {
  std::string_view name = "custom";
  Family family = Family::gpt2;
  std::int64_t layers = 0;
  std::int64_t hidden = 0;    // h
  std::int64_t heads = 0;     // a
  std::int64_t kv_heads = 0;  // grouped-query attention; = heads for multi-head attention
  std::int64_t ffn = 0;       // MLP width: 4h for GPT-2
  std::int64_t vocab = 0;     // V
  std::int64_t seq = 0;       // s, the context the model is trained at

  [[nodiscard]] constexpr bool tied() const { return family == Family::gpt2; }
  [[nodiscard]] constexpr std::int64_t head_dim() const { return hidden / heads; }
};

/// A GPT-2-family shape (the MLP is 4h wide, multi-head attention).
constexpr Architecture gpt2_shape(std::int64_t layers, std::int64_t hidden, std::int64_t heads,
                                  std::int64_t vocab, std::int64_t seq,
                                  std::string_view name = "custom") {
  return Architecture{name, Family::gpt2, layers, hidden, heads, heads, 4 * hidden, vocab, seq};
}

/// Checks that the shape is a transformer and that tensor parallelism of degree `tp` splits it.
constexpr void validate(const Architecture& a, int tp = 1) {
  detail::require(
      a.layers >= 1 && a.hidden >= 1 && a.heads >= 1 && a.vocab >= 1 && a.seq >= 1,
      "fourway: the model needs layers, hidden, heads, vocab and seq >= 1 (got layers=", a.layers,
      " hidden=", a.hidden, " heads=", a.heads, " vocab=", a.vocab, " seq=", a.seq, ")");
  detail::require(a.hidden % a.heads == 0, "fourway: hidden ", a.hidden,
                  " does not divide by heads ", a.heads, "; the head size must be whole");
  detail::require(a.kv_heads >= 1 && a.heads % a.kv_heads == 0, "fourway: heads ", a.heads,
                  " do not divide by kv_heads ", a.kv_heads);
  detail::require(a.ffn >= 1, "fourway: MLP width ", a.ffn, " must be >= 1");
  detail::require(tp >= 1, "fourway: tensor-parallel degree ", tp, " must be >= 1");
  detail::require(a.heads % tp == 0, "fourway: tensor parallelism ", tp, " does not divide the ",
                  a.heads, " attention heads; choose tp among the divisors of ", a.heads);
  detail::require(a.kv_heads % tp == 0, "fourway: tensor parallelism ", tp, " does not divide the ",
                  a.kv_heads, " key/value heads");
  detail::require(a.ffn % tp == 0, "fourway: tensor parallelism ", tp,
                  " does not divide the MLP width ", a.ffn);
}

/// Parameters of one transformer block on one tensor-parallel rank.
constexpr std::int64_t layer_params(const Architecture& a, int tp = 1) {
  validate(a, tp);
  const std::int64_t h = a.hidden, t = tp;
  if (a.family == Family::gpt2) {
    const std::int64_t f = a.ffn;
    return 2 * h                      // ln_1
           + (h * 3 * h + 3 * h) / t  // c_attn, column-parallel
           + h * h / t + h            // attn c_proj, row-parallel, bias replicated
           + 2 * h                    // ln_2
           + (h * f + f) / t          // c_fc, column-parallel
           + f * h / t + h;           // mlp c_proj, row-parallel
  }
  const std::int64_t kv = a.kv_heads * a.head_dim();
  return h                           // input RMSNorm
         + (h * h + 2 * h * kv) / t  // q, k, v
         + h * h / t                 // o
         + h                         // post-attention RMSNorm
         + 3 * h * a.ffn / t;        // gate, up, down
}

/// The input embedding on one tensor-parallel rank (the fullest one when V does not divide).
constexpr std::int64_t embedding_params(const Architecture& a, int tp = 1) {
  validate(a, tp);
  const std::int64_t rows = ceil_div(a.vocab, tp) * a.hidden;
  return a.family == Family::gpt2 ? rows + a.seq * a.hidden : rows;
}

/// The final norm and the LM head on one tensor-parallel rank. A tied head adds nothing unless
/// the last stage is not the first (`pipeline_stages > 1`): then it holds its own copy.
constexpr std::int64_t head_params(const Architecture& a, int tp = 1, int pipeline_stages = 1) {
  validate(a, tp);
  const std::int64_t norm = a.family == Family::gpt2 ? 2 * a.hidden : a.hidden;
  const std::int64_t proj = ceil_div(a.vocab, tp) * a.hidden;
  if (a.tied()) return norm + (pipeline_stages > 1 ? proj : 0);
  return norm + proj;
}

/// Every parameter of the model (one rank, no parallelism).
constexpr std::int64_t total_params(const Architecture& a) {
  return embedding_params(a) + a.layers * layer_params(a) + head_params(a);
}

/// Transformer blocks on pipeline stage `stage` of `stages`: as even as possible, the extra
/// blocks on the *last* stages (1F1B keeps the most micro-batches in flight on the first).
constexpr std::int64_t layers_on_stage(std::int64_t layers, int stages, int stage) {
  detail::require(stages >= 1, "fourway: pipeline degree ", stages, " must be >= 1");
  detail::require(stages <= layers, "fourway: ", stages, " pipeline stages for ", layers,
                  " layers; every stage needs a layer, use pp <= ", layers);
  detail::require(stage >= 0 && stage < stages, "fourway: stage ", stage, " of ", stages);
  const std::int64_t base = layers / stages, extra = layers % stages;
  return base + (stage >= stages - extra ? 1 : 0);
}

/// Parameters held by one rank of pipeline stage `stage` under tensor parallelism `tp`.
constexpr std::int64_t stage_params(const Architecture& a, int tp, int stages, int stage) {
  std::int64_t n = layers_on_stage(a.layers, stages, stage) * layer_params(a, tp);
  if (stage == 0) n += embedding_params(a, tp);
  if (stage == stages - 1) n += head_params(a, tp, stages);
  return n;
}

/// The FSDP units of one rank (contracts.md): unit 0 the embedding, units 1..L the blocks, unit
/// L+1 the head (its final norm; a tied projection is the embedding's parameter).
inline std::vector<std::int64_t> fsdp_units(const Architecture& a) {
  std::vector<std::int64_t> u;
  u.push_back(embedding_params(a));
  for (std::int64_t i = 0; i < a.layers; ++i) u.push_back(layer_params(a));
  u.push_back(head_params(a));
  return u;
}

// ---- published shapes ------------------------------------------------------------------------
// GPT-2: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", Table 2
// (layers, d_model), and the Hugging Face configs gpt2, gpt2-medium, gpt2-large, gpt2-xl
// (n_head, vocab_size 50257, n_positions 1024).
inline constexpr Architecture gpt2_124m = gpt2_shape(12, 768, 12, 50257, 1024, "gpt2-124M");
inline constexpr Architecture gpt2_350m = gpt2_shape(24, 1024, 16, 50257, 1024, "gpt2-350M");
inline constexpr Architecture gpt2_774m = gpt2_shape(36, 1280, 20, 50257, 1024, "gpt2-774M");
inline constexpr Architecture gpt2_1558m = gpt2_shape(48, 1600, 25, 50257, 1024, "gpt2-1.5B");
// Llama 2: Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models", Table 1
// (context 4096, GQA for 70B), with layers / d_model / heads of Touvron et al. 2023 "LLaMA" Table 2
// and the Hugging Face configs meta-llama/Llama-2-{7b,13b,70b}-hf (intermediate_size 11008,
// 13824, 28672; num_key_value_heads 8 for 70B; vocab_size 32000).
inline constexpr Architecture llama2_7b{"llama2-7B", Family::llama, 32,    4096, 32,
                                        32,          11008,         32000, 4096};
inline constexpr Architecture llama2_13b{"llama2-13B", Family::llama, 40,    5120, 40,
                                         40,           13824,         32000, 4096};
inline constexpr Architecture llama2_70b{"llama2-70B", Family::llama, 80,  8192, 64, 8,
                                         28672,        32000,         4096};

/// A preset by the name the CLI takes: family "gpt2" with 124M|350M|774M|1.5B, "llama" with
/// 7B|13B|70B.
constexpr std::optional<Architecture> preset(std::string_view family, std::string_view size) {
  if (family == "gpt2") {
    if (size == "124M") return gpt2_124m;
    if (size == "350M") return gpt2_350m;
    if (size == "774M") return gpt2_774m;
    if (size == "1.5B" || size == "1558M") return gpt2_1558m;
  } else if (family == "llama") {
    if (size == "7B") return llama2_7b;
    if (size == "13B") return llama2_13b;
    if (size == "70B") return llama2_70b;
  }
  return std::nullopt;
}

}  // namespace fourway::plan
