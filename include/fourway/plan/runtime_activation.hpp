//! fourway's own activation footprint: the bytes `fw::models::Gpt` keeps under
//! `MemTag::activations`, tensor by tensor, and their peak over one micro-batch's forward and
//! backward.
//!
//! This is not Korthikanti et al.'s 34 + 5as/h (see `activation.hpp`): fourway has no dropout,
//! keeps every layer's output as llm.c does, and its flash-style attention keeps one fp32
//! log-sum-exp per (batch, head, query) instead of the (B, NH, T, T) probabilities. Per block, for
//! B sequences of T tokens, C channels, NH heads, w bytes a value:
//!
//!   ln_1.y  c_attn.y  lse          attn.y  c_proj.y  r   ln_2.y  c_fc.y  gelu.y  c_proj.y  y
//!   BTC     3BTC      B·NH·T (4 B) BTC     BTC       BTC BTC     4BTC    4BTC    BTC       BTC
//!   = 18·BTC·w + B·NH·T·4, plus each LayerNorm's fp32 mean and rstd, 2·BT·4 B, twice.
//!
//! Embedding: its output BTC·w. Head: ln_f (BTC·w + 2·BT·4), logits BTV·w, per-token losses BT·4;
//! with the fused classifier (`GptConfig::classifier_chunk` > 0) the logits are never kept (their
//! chunk is workspace, MemTag::workspace, in forward and again in backward).
//! Without checkpointing everything is alive at the end of forward, which is the peak (backward
//! only frees). `Checkpointed` blocks keep their output only, but build each block's whole stash
//! once more (forward, and again in backward): the peak is the embedding, L block outputs and the
//! larger of one block's stash and the head. Selective recomputation (`GptConfig::selective`)
//! keeps a block's stash less attn.y, lse and gelu.y (5·BTC·w + B·NH·T·4) and recomputes them in
//! backward (`runtime_selective_activation_bytes`).
#pragma once

#include <algorithm>
#include <cstdint>

#include "fourway/plan/activation.hpp"
#include "fourway/plan/model_state.hpp"

namespace fourway::plan {

/// One micro-batch through fourway's GPT-2.
struct GptActivationShape {
  std::int64_t batch = 1;   // B, sequences in the micro-batch
  std::int64_t seq = 0;     // T
  std::int64_t dim = 0;     // C
  std::int64_t heads = 0;   // NH
  std::int64_t vocab = 0;   // V
  std::int64_t layers = 0;  // L
  Precision precision = Precision::fp32;
  std::int64_t classifier_chunk = 0;  // rows of logits at a time; 0: all, kept for backward
};

/// Bytes of one `TransformerBlock` stash.
constexpr std::int64_t runtime_block_activation_bytes(const GptActivationShape& x) {
  const std::int64_t w = working_bytes(x.precision);
  const std::int64_t btc = x.batch * x.seq * x.dim;
  const std::int64_t bt = x.batch * x.seq;
  return 18 * btc * w + x.batch * x.heads * x.seq * 4 + 2 * (2 * bt * 4);
}

/// Bytes of the `Embedding` stash (its output).
constexpr std::int64_t runtime_embedding_activation_bytes(const GptActivationShape& x) {
  return x.batch * x.seq * x.dim * working_bytes(x.precision);
}

/// Bytes of the head: ln_f's stash, the logits and the per-token losses.
constexpr std::int64_t runtime_head_activation_bytes(const GptActivationShape& x) {
  const std::int64_t w = working_bytes(x.precision);
  const std::int64_t bt = x.batch * x.seq;
  const std::int64_t logits = x.classifier_chunk > 0 ? 0 : bt * x.vocab * w;
  return bt * x.dim * w + 2 * bt * 4 + logits + bt * 4;
}

/// Bytes selective recomputation (`GptConfig::selective`) frees of one block's stash on one
/// tensor-parallel rank of `tp`: the attention core's output (B, T, C/tp), its log-sum-exp
/// (B, NH/tp, T) fp32 and GELU's output (B, T, 4C/tp).
constexpr std::int64_t runtime_block_recomputable_bytes(const GptActivationShape& x, int tp = 1) {
  const std::int64_t w = working_bytes(x.precision);
  const std::int64_t btc = x.batch * x.seq * x.dim;
  return 5 * btc / tp * w + x.batch * x.heads / tp * x.seq * 4;
}

/// What one micro-batch keeps after its forward under selective recomputation: the embedding's
/// output `emb`, every block's stash `block` less its recomputable part, the head's `head`.
constexpr std::int64_t runtime_selective_kept_bytes(const GptActivationShape& x, int tp,
                                                    std::int64_t emb, std::int64_t block,
                                                    std::int64_t head) {
  return emb + x.layers * (block - runtime_block_recomputable_bytes(x, tp)) + head;
}

/// The activation peak of one micro-batch under selective recomputation, from the embedding's
/// output `emb`, a block's whole stash `block`, the head's `head` and what a block's forward
/// holds for a moment above its whole stash (`runtime_block_peak_extra` without checkpointing:
/// under sequence parallelism the row split's partial sum, else 0): each block's forward holds
/// its whole stash before it frees the recomputable part (the last one's on top of L-1 reduced
/// stashes), then the head's stash joins them; each block's backward first recomputes what it
/// freed (its whole stash again, the head already freed), so the backward adds nothing above.
constexpr std::int64_t runtime_selective_activation_bytes(const GptActivationShape& x, int tp,
                                                          std::int64_t emb, std::int64_t block,
                                                          std::int64_t head,
                                                          std::int64_t forward_extra = 0) {
  const std::int64_t kept = block - runtime_block_recomputable_bytes(x, tp);
  return emb + (x.layers - 1) * kept + std::max(block + forward_extra, kept + head);
}

/// Peak of `MemTag::activations` over one micro-batch's forward and backward of the GPT, with or
/// without checkpointing of every block.
constexpr std::int64_t runtime_activation_bytes(const GptActivationShape& x, bool checkpoint) {
  detail::require(
      x.batch >= 1 && x.seq >= 1 && x.dim >= 1 && x.heads >= 1 && x.vocab >= 1 && x.layers >= 1,
      "fourway: a GPT activation shape needs batch, seq, dim, heads, vocab, layers >= 1");
  const std::int64_t emb = runtime_embedding_activation_bytes(x);
  const std::int64_t block = runtime_block_activation_bytes(x);
  const std::int64_t head = runtime_head_activation_bytes(x);
  if (!checkpoint) return emb + x.layers * block + head;
  const std::int64_t out = x.batch * x.seq * x.dim * working_bytes(x.precision);
  return emb + x.layers * out + std::max(block, head);
}

/// The same for any recomputation: none, selective (`GptConfig::selective`) or full.
constexpr std::int64_t runtime_activation_bytes(const GptActivationShape& x, Checkpointing r) {
  if (r != Checkpointing::selective) return runtime_activation_bytes(x, r == Checkpointing::full);
  (void)runtime_activation_bytes(x, false);  // the shape's checks
  return runtime_selective_activation_bytes(x, 1, runtime_embedding_activation_bytes(x),
                                            runtime_block_activation_bytes(x),
                                            runtime_head_activation_bytes(x));
}

/// Bytes one rank of a tensor-parallel group of `tp` keeps per `TransformerBlock` over the group
/// (layers/block.hpp) after forward. The split parts are /tp: c_attn.y 3, heads 1, c_fc.y 4, gelu.y
/// 4 (·BTC) and the attention's log-sum-exp B·NH·T (fp32). The LayerNorm/residual region — ln_1.y,
/// attention output, r, ln_2.y, MLP output, y (6·BTC) and the LayerNorm statistics — is whole on
/// every rank, or /tp under sequence parallelism, which then keeps the gathered inputs of the two
/// column splits (2·BTC) instead (Megatron-LM gathers them again in backward; fourway keeps them).
constexpr std::int64_t runtime_tp_block_activation_bytes(const GptActivationShape& x, int tp,
                                                         bool sequence_parallel) {
  const std::int64_t w = working_bytes(x.precision);
  const std::int64_t btc = x.batch * x.seq * x.dim;
  const std::int64_t bt = x.batch * x.seq;
  const std::int64_t split = 12 * btc / tp * w + x.batch * x.heads / tp * x.seq * 4;
  if (!sequence_parallel || tp == 1) return split + 6 * btc * w + 2 * (2 * bt * 4);
  return split + 6 * btc / tp * w + 2 * btc * w + 2 * (2 * bt / tp * 4);
}

/// Bytes one tensor-parallel rank keeps of the embedding: its output (BTC, /tp under sequence
/// parallelism).
constexpr std::int64_t runtime_tp_embedding_activation_bytes(const GptActivationShape& x, int tp,
                                                             bool sequence_parallel) {
  const std::int64_t part = sequence_parallel && tp > 1 ? tp : 1;
  return x.batch * x.seq * x.dim / part * working_bytes(x.precision);
}

/// Bytes one tensor-parallel rank keeps of the head: ln_f (its output gathered again under
/// sequence parallelism), the logits of the rank's `vocab_rows` real vocabulary rows, and three
/// fp32 values per token (max, Σ exp, target logit).
constexpr std::int64_t runtime_tp_head_activation_bytes(const GptActivationShape& x, int tp,
                                                        bool sequence_parallel,
                                                        std::int64_t vocab_rows) {
  const std::int64_t w = working_bytes(x.precision);
  const std::int64_t btc = x.batch * x.seq * x.dim;
  const std::int64_t bt = x.batch * x.seq;
  const bool sp = sequence_parallel && tp > 1;
  const std::int64_t part = sp ? tp : 1;
  return btc / part * w + 2 * (bt / part) * 4 + (sp ? btc * w : 0) + bt * vocab_rows * w +
         3 * bt * 4;
}

/// Bytes one tensor-parallel rank keeps after the forward of one micro-batch (no checkpointing):
/// the embedding's output, L blocks, and the head.
constexpr std::int64_t runtime_tp_activation_bytes(const GptActivationShape& x, int tp,
                                                   bool sequence_parallel,
                                                   std::int64_t vocab_rows) {
  return runtime_tp_embedding_activation_bytes(x, tp, sequence_parallel) +
         x.layers * runtime_tp_block_activation_bytes(x, tp, sequence_parallel) +
         runtime_tp_head_activation_bytes(x, tp, sequence_parallel, vocab_rows);
}

/// The bytes a block's forward holds for a moment above what the micro-batch then keeps ("kept":
/// its input, every block's kept part and, when it follows on this chunk, the head's stash
/// `head`):
///  - checkpointed (`checkpoint`): the block's whole stash (`block`) on top of the outputs kept
///    before it, with, before the stash is released, either the output's kept copy (`out`) or —
///    under sequence parallelism — the row split's (b·T, C) partial sum beside this rank's
///    reduced rows instead of the block's output: block + max(out, full − out) − out;
///  - not checkpointed: only that partial sum in place of the output, full − out (0 without
///    sequence parallelism, where out = full).
/// Returns that minus the head, at least 0.
constexpr std::int64_t runtime_block_peak_extra(const GptActivationShape& x, std::int64_t out,
                                                std::int64_t block, std::int64_t head,
                                                bool checkpoint) {
  const std::int64_t full = x.batch * x.seq * x.dim * working_bytes(x.precision);
  const std::int64_t over = checkpoint ? block + std::max(out, full - out) - out : full - out;
  return std::max<std::int64_t>(over - head, 0);
}

}  // namespace fourway::plan
