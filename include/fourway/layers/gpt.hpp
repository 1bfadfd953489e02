//! `fw::models::Gpt<T, B>`: GPT-2 (Radford et al. 2019) exactly — token + learned position
//! embedding, pre-LayerNorm blocks with tanh GELU, final LayerNorm (eps 1e-5), language-model
//! head tied to `wte`, loss = mean cross-entropy over all B·T targets.
//!
//! FSDP units and the order hooks see them (L = layers):
//! ```
//!   unit   0        1 .. L            L+1
//!          wte,wpe  h.0 .. h.{L-1}    ln_f, wte (tied head)
//!   forward   0 -> 1 -> ... -> L -> L+1      backward  L+1 -> L -> ... -> 0
//! ```
//! Each unit's compute sits between `pre_forward(u)` and `post_forward(u)` (forward) and between
//! `pre_backward(u)` and `post_backward(u)` (backward; under checkpointing the recomputation of a
//! block happens there too). `wte`'s gradient receives the head's part in unit L+1 and the
//! embedding's part in unit 0: it is complete after `post_backward(0)`.
//! Parameters carry Hugging Face GPT-2 names ("h.3.mlp.c_fc.weight"); matrices are stored
//! (in, out) as HF's Conv1D. Gradients accumulate (`+=`) across backward calls until
//! `zero_grad`. All activations of a micro-batch live in its `Stash`. Under a `DeferWeightGrads`
//! scope (layers/weight_grad_queue.hpp) the backward leaves the matrix weight gradients (every
//! Linear's and the LM head's part of wte's) to the scope's queue; the rest are added in place.
//!
//! A `GptPart` builds only some units (a pipeline chunk): blocks [first_block, end_block), the
//! embedding (wte, wpe) and/or the head (ln_f, tied wte). Blocks keep their global index and
//! names; `visit_parameters` visits only what the part holds (wte once if it holds either end);
//! a part's FSDP units are its own units in model order. Unheld pieces are 1-row placeholders.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fourway/backend/matmul.hpp"
#include "fourway/layers/block.hpp"
#include "fourway/layers/checkpoint.hpp"
#include "fourway/layers/embedding.hpp"
#include "fourway/layers/kv_cache.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/layernorm.hpp"
#include "fourway/layers/loss.hpp"
#include "fourway/layers/model_part.hpp"
#include "fourway/layers/weight_grad_queue.hpp"

namespace fourway::models {

struct GptConfig {
  int layers = 12;
  int heads = 12;
  int dim = 768;
  int vocab = 50257;
  int max_seq = 1024;
  bool checkpoint = false;  // activation checkpointing of every block
  /// Selective recomputation (when not `checkpoint`): each block frees the attention core's
  /// output and log-sum-exp and GELU's output after forward and recomputes them in backward,
  /// keeping the linear layers' outputs (docs/layers.md, "Recomputation").
  bool selective = false;
  /// Token rows of logits the LM head computes at a time (the fused classifier): 0 computes all
  /// B·T rows at once and keeps the (B, T, V) logits from forward to backward; N > 0 computes N
  /// rows at a time into a workspace of N·V values — logits, then the loss in forward; logits
  /// again, their gradient in place, then dx and d wte in backward — so no (B, T, V) buffer
  /// exists, at the cost of the logits GEMM once more (docs/layers.md, "The fused classifier").
  int classifier_chunk = 0;
  /// wte holds the vocabulary padded to a multiple of this (1: no padding; fourway-train-cuda
  /// uses 128, so the LM head's GEMMs run on whole tiles). The padding rows are zero, their
  /// logits are masked out of the loss, and their gradient is zero, so loss and gradients equal
  /// the unpadded model's; files keep `vocab` rows (docs/layers.md, "The padded vocabulary").
  int vocab_alignment = 1;

  /// `vocab` rounded up to a multiple of `vocab_alignment`.
  [[nodiscard]] std::int64_t padded_vocab() const {
    const std::int64_t a = vocab_alignment;
    return (vocab + a - 1) / a * a;
  }

  /// Throws ConfigError naming the numbers when the shape cannot work.
  void validate() const {
    check<ConfigError>(layers >= 1 && heads >= 1 && dim >= 1 && vocab >= 1 && max_seq >= 1,
                       "fourway: GptConfig needs layers, heads, dim, vocab, max_seq >= 1, got ",
                       layers, ", ", heads, ", ", dim, ", ", vocab, ", ", max_seq);
    check<ConfigError>(dim % heads == 0, "fourway: GptConfig dim=", dim,
                       " is not divisible by heads=", heads, "; pick heads dividing dim");
    check<ConfigError>(vocab_alignment >= 1, "fourway: GptConfig vocab_alignment=", vocab_alignment,
                       " must be >= 1 (1: no padding)");
    check<ConfigError>(classifier_chunk >= 0,
                       "fourway: GptConfig classifier_chunk=", classifier_chunk,
                       " must be >= 0 (0: the whole logits at once)");
  }
};

/// Hooks that do nothing (layers/layer.hpp): the single-rank case.
using NoHooks = ::fourway::NoHooks;

/// Which units a `Gpt` object holds (layers/model_part.hpp); the default is the whole model.
using GptPart = ModelPart;
using ::fourway::resolve_part;

/// GPT-2's costs for a pipeline's cut (layers/model_part.hpp): a block 12C² + 13C, the
/// embedding (V + max_seq)·C, ln_f and the tied head V·C + 2C.
inline CutCosts cut_costs(const GptConfig& cfg) {
  const std::int64_t C = cfg.dim;
  return CutCosts{cfg.layers, 12 * C * C + 13 * C, (cfg.vocab + cfg.max_seq) * C,
                  cfg.vocab * C + 2 * C};
}

template <class H>
concept gpt_hooks = requires(H& h, int u) {
  h.pre_forward(u);
  h.post_forward(u);
  h.pre_backward(u);
  h.post_backward(u);
};

template <floating_dtype T, backend B>
class Gpt {
 public:
  using value_type = T;
  using backend_type = B;
  using Block = TransformerBlock<T, B>;

  struct Stash {
    Tensor<std::int32_t, B> targets;  // view (B, T)
    typename Embedding<T, B>::Stash embedding;
    std::vector<typename Checkpointed<Block>::Stash>
        blocks;  // `.inner` used when not checkpointing
    typename LayerNorm<T, B>::Stash ln_f;
    Tensor<T, B> logits;      // (B, T, V) when classifier_chunk is 0, else empty
    Tensor<float, B> losses;  // (B, T) per-token cross-entropy
    float loss = 0.0f;        // mean of `losses`
  };

  /// Builds and initialises the model as GPT-2 / nanoGPT do (normal std 0.02, c_proj weights
  /// 0.02/sqrt(2·layers), biases 0, LayerNorm gains 1); element i of a parameter depends only on
  /// (seed, name, i). With `part`, only those units (values as in the whole model).
  Gpt(const Context<B>& ctx, const GptConfig& cfg, std::uint64_t seed = 0, GptPart part = {})
      : cfg_((cfg.validate(), cfg)),
        part_(resolve_part(part, cfg.layers)),
        embedding_(ctx, holds_wte() ? cfg.vocab : 1, part_.embedding ? cfg.max_seq : 1, cfg.dim,
                   seed, 0.02f, holds_wte() ? cfg.padded_vocab() : 1),
        ln_f_(ctx, "ln_f", part_.head ? cfg.dim : 1) {
    const Init init = Init::gpt2(seed, cfg.layers);
    blocks_.reserve(static_cast<std::size_t>(part_.end_block - part_.first_block));
    for (int i = part_.first_block; i < part_.end_block; ++i) {
      blocks_.emplace_back(Block(ctx, "h." + std::to_string(i), cfg.dim, cfg.heads, init));
    }
  }

  /// The same model described but not allocated (deferred construction, layers/parameter.hpp):
  /// names, shapes, decay flags and init rules, no storage. A strategy materialises what its rank
  /// owns; SingleRank materialises everything.
  static Gpt deferred(const Context<B>& ctx, const GptConfig& cfg, std::uint64_t seed = 0) {
    const DeferredInit scope;
    return Gpt(ctx, cfg, seed);
  }

  [[nodiscard]] const GptConfig& config() const { return cfg_; }
  [[nodiscard]] const GptPart& part() const { return part_; }
  [[nodiscard]] bool whole() const {
    return part_.embedding && part_.head && part_.first_block == 0 &&
           part_.end_block == cfg_.layers;
  }
  /// Holds wte: as the embedding, as the tied head, or both.
  [[nodiscard]] bool holds_wte() const { return part_.embedding || part_.head; }
  /// Switches activation checkpointing of the blocks (between steps, never inside one).
  void set_checkpointing(bool on) { cfg_.checkpoint = on; }
  /// Switches selective recomputation of the blocks (GptConfig::selective), between steps.
  void set_selective(bool on) { cfg_.selective = on; }
  /// Rows of logits the head computes at a time (GptConfig::classifier_chunk; between steps).
  void set_classifier_chunk(int rows) {
    check<ConfigError>(rows >= 0, "fourway: classifier_chunk=", rows, " must be >= 0");
    cfg_.classifier_chunk = rows;
  }
  [[nodiscard]] int units() const {
    return (part_.embedding ? 1 : 0) + static_cast<int>(blocks_.size()) + (part_.head ? 1 : 0);
  }

  /// Mean cross-entropy of predicting `targets` (B, T) from `tokens` (B, T); keeps what backward
  /// needs in `s`. Synchronises with the device to return the loss.
  template <class Hooks = NoHooks>
  requires gpt_hooks<std::remove_cvref_t<Hooks>>
  float forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                const Tensor<std::int32_t, B>& targets, Stash& s, Hooks&& hooks = Hooks{}) {
    return run_forward(ctx, tokens, targets, s, hooks, nullptr);
  }
  /// The same forward with the loss left on the device: `sink.weight` × the sum of the per-token
  /// losses is added to `*sink.sum` (layers/layer.hpp), and no synchronising call is made.
  template <class Hooks = NoHooks>
  requires gpt_hooks<std::remove_cvref_t<Hooks>>
  void forward_into(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                    const Tensor<std::int32_t, B>& targets, Stash& s, const LossSink& sink,
                    Hooks&& hooks = Hooks{}) {
    (void)run_forward(ctx, tokens, targets, s, hooks, &sink);
  }

  /// Gradients of `grad_scale` × the mean loss of the forward that filled `s`, added (`+=`) to
  /// every parameter's gradient; `s` is empty afterwards. A trainer summing M micro-batches
  /// passes grad_scale = loss_scale / M.
  template <class Hooks = NoHooks>
  requires gpt_hooks<std::remove_cvref_t<Hooks>>
  void backward(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f, Hooks&& hooks = Hooks{}) {
    check<ShapeError>(!s.losses.empty() && s.blocks.size() == blocks_.size(),
                      "fourway: Gpt backward without a matching forward (empty stash)");
    hooks.pre_backward(head_unit());
    Tensor<T, B> dx = backward_head(ctx, s, grad_scale);
    hooks.post_backward(head_unit());
    for (int i = cfg_.layers; i-- > 0;) {
      hooks.pre_backward(i + 1);
      dx = backward_block(ctx, i, dx, s);
      hooks.post_backward(i + 1);
    }
    hooks.pre_backward(0);
    backward_embedding(ctx, dx, s);
    hooks.post_backward(0);
    s = Stash{};
  }

 private:
  template <class Hooks>
  float run_forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                    const Tensor<std::int32_t, B>& targets, Stash& s, Hooks& hooks,
                    const LossSink* sink) {
    check<ConfigError>(whole(), "fourway: Gpt::forward runs the whole model; this object holds a ",
                       "part (a pipeline chunk): run its units one at a time");
    check<ShapeError>(targets.shape() == tokens.shape(), "fourway: Gpt targets ",
                      targets.shape().str(), " must have the shape of tokens ",
                      tokens.shape().str());
    hooks.pre_forward(0);
    Tensor<T, B> x = forward_embedding(ctx, tokens, s);
    s.embedding.tokens_checked = sink != nullptr && sink->tokens_checked;
    hooks.post_forward(0);
    for (int i = 0; i < cfg_.layers; ++i) {
      hooks.pre_forward(i + 1);
      x = forward_block(ctx, i, x, s);
      hooks.post_forward(i + 1);
    }
    hooks.pre_forward(head_unit());
    const float loss = forward_head(ctx, x, targets, s, sink);
    hooks.post_forward(head_unit());
    return loss;
  }

 public:
  // ---- one unit at a time (a pipeline stage runs only its own units; forward/backward above
  // are these in order). Each forward piece keeps its part of the micro-batch in `s`.

  /// Unit 0: token ids (B, T) -> (B, T, C).
  Tensor<T, B> forward_embedding(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                                 Stash& s) {
    return embedding_.forward(ctx, tokens, s.embedding);
  }
  /// Unit i+1: block i, (B, T, C) -> (B, T, C); recomputed in backward when checkpointing.
  Tensor<T, B> forward_block(const Context<B>& ctx, int i, const Tensor<T, B>& x, Stash& s) {
    check_block(i);
    if (s.blocks.size() != blocks_.size()) s.blocks.resize(blocks_.size());
    auto& b = blocks_[local_block(i)];
    auto& bs = s.blocks[local_block(i)];
    if (cfg_.checkpoint) return b.forward(ctx, x, bs);
    Tensor<T, B> y = b.inner().forward(ctx, x, bs.inner);
    if (cfg_.selective) b.inner().drop_recomputable(bs.inner);
    return y;
  }
  /// Unit L+1: ln_f, tied LM head and the mean cross-entropy of `targets` (B, T). With a sink,
  /// the loss stays on the device (added to the sink; NaN returned), else it is read back.
  float forward_head(const Context<B>& ctx, const Tensor<T, B>& x,
                     const Tensor<std::int32_t, B>& targets, Stash& s,
                     const LossSink* sink = nullptr) {
    check<ShapeError>(x.shape().rank() == 3 && targets.shape() == Shape{x.shape()[0], x.shape()[1]},
                      "fourway: Gpt head expects x (B, T, C) and targets (B, T), got ",
                      x.shape().str(), " and ", targets.shape().str());
    s.targets = targets.view();
    s.loss = head_forward(ctx, x, s, sink);
    return s.loss;
  }
  /// Unit L+1 backward: d(grad_scale × mean loss) / dx (B, T, C); adds to ln_f's and wte's grads.
  Tensor<T, B> backward_head(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f) {
    check<ShapeError>(!s.losses.empty(), "fourway: Gpt head backward without its forward");
    return head_backward(ctx, s, grad_scale);
  }
  /// Unit i+1 backward: block i.
  Tensor<T, B> backward_block(const Context<B>& ctx, int i, const Tensor<T, B>& dy, Stash& s) {
    check_block(i);
    check<ShapeError>(s.blocks.size() == blocks_.size(), "fourway: Gpt block ", i,
                      " backward without its forward");
    auto& b = blocks_[local_block(i)];
    auto& bs = s.blocks[local_block(i)];
    return cfg_.checkpoint ? b.backward(ctx, dy, bs) : b.inner().backward(ctx, dy, bs.inner);
  }
  /// Unit 0 backward: adds to wte's and wpe's grads.
  void backward_embedding(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    (void)embedding_.backward(ctx, dy, s.embedding);
  }

  // ---- incremental decoding (layers/generate.hpp): one token at a time over KV caches, unit by
  // unit as forward runs them (`fw::decode_token` brackets each with the hooks) -----------------

  /// One `KvCache` per block this object holds, for one sequence of up to `capacity` tokens
  /// (backend memory, activations: 2 · capacity · C elements per block).
  [[nodiscard]] std::vector<KvCache<T, B>> kv_caches(const Context<B>& ctx,
                                                     std::int64_t capacity) const {
    return make_kv_caches<T, B>(ctx, blocks_.size(), cfg_.heads, cfg_.dim / cfg_.heads, capacity,
                                cfg_.max_seq);
  }
  /// Unit 0 of one token: wte[token] + wpe[pos], (1, 1, C).
  Tensor<T, B> decode_embedding(const Context<B>& ctx, std::int32_t token, std::int64_t pos) {
    detail::check_decode_position(token, pos, cfg_.vocab, cfg_.max_seq);
    const std::int64_t C = cfg_.dim;
    Tensor<T, B> x = detail::activation<T, B>(ctx, Shape{1, 1, C});
    Ops<B>::residual_forward(ctx, x.data(), embedding_.wte().bound_weight().data() + token * C,
                             embedding_.wpe().bound_weight().data() + pos * C, C);
    return x;
  }
  /// Unit i+1 of one token: block i over its cache `cache` (this object's cache of that block).
  Tensor<T, B> decode_block(const Context<B>& ctx, int i, const Tensor<T, B>& x,
                            KvCache<T, B>& cache, std::int64_t pos) {
    check_block(i);
    return blocks_[local_block(i)].inner().decode(ctx, x, cache, pos);
  }
  /// Unit L+1 of one token: ln_f and the tied head; the next token's `vocab` logits (the padding
  /// rows left out) on the host.
  std::vector<float> decode_head(const Context<B>& ctx, const Tensor<T, B>& x) {
    const std::int64_t C = cfg_.dim;
    const std::int64_t Vp = cfg_.padded_vocab();
    typename LayerNorm<T, B>::Stash ls;
    const Tensor<T, B> h = ln_f_.forward(ctx, x, ls);
    Tensor<T, B> logits = detail::workspace<T, B>(ctx, Shape{1, Vp});
    matmul(ctx, matrix(logits.data(), 1, Vp), matrix(h.data(), 1, C),
           matrix(embedding_.wte().bound_weight()).t());
    return detail::logits_to_host(ctx, logits, cfg_.vocab);
  }

  /// Every parameter once, in Hugging Face order: wte, wpe, h.0.* .. h.{L-1}.*, ln_f.*.
  template <class F>
  void visit_parameters(F&& f) {
    if (holds_wte()) f(embedding_.wte());
    if (part_.embedding) f(embedding_.wpe());
    for (auto& b : blocks_) b.visit_parameters(f);
    if (part_.head) ln_f_.visit_parameters(f);
  }

  /// The parameters of FSDP unit `u` (0 embedding, 1..L blocks, L+1 = ln_f and the tied wte).
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    check<ConfigError>(u >= 0 && u < units(), "fourway: Gpt unit ", u, " does not exist; units ",
                       "are 0 .. ", units() - 1, " for ", cfg_.layers, " layers");
    const int first = part_.embedding ? 1 : 0;
    if (part_.embedding && u == 0) {
      embedding_.visit_parameters(f);
    } else if (part_.head && u == units() - 1) {
      ln_f_.visit_parameters(f);
      f(embedding_.wte());
    } else {
      blocks_[static_cast<std::size_t>(u - first)].visit_parameters(f);
    }
  }

  [[nodiscard]] std::int64_t num_parameters() {
    std::int64_t n = 0;
    visit_parameters([&](Parameter<T, B>& p) { n += p.numel(); });
    return n;
  }

  Embedding<T, B>& embedding() { return embedding_; }
  /// Context parallelism: the token rows are the shard's part of each sequence; the position
  /// embedding and every block's attention follow it (null: whole sequences). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) {
    embedding_.bind_sequence_shard(shard);
    for (auto& b : blocks_) b.inner().attn().bind_sequence_shard(shard);
  }
  /// The token embedding, which the LM head shares (tied).
  Parameter<T, B>& wte() { return embedding_.wte(); }
  /// What one unit hands the next for a micro-batch of b sequences of T tokens: (b, T, C).
  [[nodiscard]] Shape boundary_shape(std::int64_t b, std::int64_t Tn) const {
    return Shape{b, Tn, cfg_.dim};
  }
  Block& block(int i) {
    check_block(i);
    return blocks_[local_block(i)].inner();
  }
  LayerNorm<T, B>& ln_f() { return ln_f_; }

 private:
  [[nodiscard]] int head_unit() const { return cfg_.layers + 1; }
  void check_block(int i) const {
    check<ConfigError>(i >= 0 && i < cfg_.layers, "fourway: Gpt block ", i, " does not exist; ",
                       "blocks are 0 .. ", cfg_.layers - 1);
    check<ConfigError>(i >= part_.first_block && i < part_.end_block, "fourway: Gpt block ", i,
                       " is not in this part, which holds blocks ", part_.first_block, " .. ",
                       part_.end_block - 1);
  }
  [[nodiscard]] std::size_t local_block(int i) const {
    return static_cast<std::size_t>(i - part_.first_block);
  }
  /// Rows per classifier chunk for a micro-batch of `rows` token rows.
  [[nodiscard]] std::int64_t classifier_rows(std::int64_t rows) const {
    return cfg_.classifier_chunk > 0 ? std::min<std::int64_t>(cfg_.classifier_chunk, rows) : rows;
  }

  float head_forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s, const LossSink* sink) {
    const std::int64_t Bn = x.shape()[0];
    const std::int64_t Tn = x.shape()[1];
    const std::int64_t rows = Bn * Tn;
    const std::int64_t V = cfg_.vocab;
    const std::int64_t Vp = cfg_.padded_vocab();  // logits row stride: the padding is masked
    const std::int64_t C = cfg_.dim;
    Tensor<T, B> h = ln_f_.forward(ctx, x, s.ln_f);
    s.losses = detail::activation<float, B>(ctx, Shape{Bn, Tn});
    const Matrix<T> wt = matrix(embedding_.wte().bound_weight()).t();
    // logits (n, V) = h (n, C) · wteᵀ (C, V), the LM head tied to the token embedding, then the
    // losses: all rows at once into the stash (kept for backward), or, the fused classifier,
    // `chunk` rows at a time into one workspace buffer
    const bool keep = cfg_.classifier_chunk == 0;
    const std::int64_t chunk = classifier_rows(rows);
    Tensor<T, B> logits = keep ? detail::activation<T, B>(ctx, Shape{Bn, Tn, Vp})
                               : detail::workspace<T, B>(ctx, Shape{chunk, Vp});
    for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::int64_t n = std::min(chunk, rows - r0);
      matmul(ctx, matrix(logits.data(), n, Vp), matrix(h.data() + r0 * C, n, C), wt);
      Ops<B>::cross_entropy_forward(ctx, s.losses.data() + r0, logits.data(), s.targets.data() + r0,
                                    n, V, Vp);
    }
    if (keep) s.logits = std::move(logits);
    return model_loss(ctx, s.losses.data(), rows, sink);
  }

  Tensor<T, B> head_backward(const Context<B>& ctx, Stash& s, float grad_scale) {
    const std::int64_t rows = s.losses.numel();
    const std::int64_t V = cfg_.vocab;
    const std::int64_t Vp = cfg_.padded_vocab();
    const std::int64_t C = cfg_.dim;
    const float dloss = grad_scale / static_cast<float>(rows);
    Parameter<T, B>& wte = embedding_.wte();
    Tensor<T, B> dh = detail::workspace<T, B>(ctx, s.ln_f.y.shape());
    auto* q = DeferWeightGrads<T, B>::active();
    // Kept logits: one chunk of every row, turned into their gradient in place. The fused
    // classifier: `chunk` rows of logits computed again; a deferred W keeps each chunk's
    // gradient, otherwise one buffer serves every chunk.
    const bool kept = !s.logits.empty();
    const std::int64_t chunk = kept ? rows : classifier_rows(rows);
    Tensor<T, B> logits = std::move(s.logits);
    for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::int64_t n = std::min(chunk, rows - r0);
      const Matrix<T> hn = matrix(s.ln_f.y.data() + r0 * C, n, C);
      if (!kept) {
        if (q != nullptr) {
          logits = detail::activation<T, B>(ctx, Shape{n, Vp});
        } else if (logits.empty()) {
          logits = detail::workspace<T, B>(ctx, Shape{chunk, Vp});
        }
        matmul(ctx, matrix(logits.data(), n, Vp), hn, matrix(wte.bound_weight()).t());
      }
      // d logits in place; the padded columns become 0, so no gradient reaches wte's padding
      Ops<B>::cross_entropy_backward(ctx, logits.data(), logits.data(), s.targets.data() + r0, n, V,
                                     dloss, Vp);
      // dh (n, C) = dlogits (n, Vp) · wte (Vp, C)
      matmul(ctx, matrix(dh.data() + r0 * C, n, C), matrix(logits.data(), n, Vp),
             matrix(wte.bound_weight()));
      if (q != nullptr) {  // d logits kept until W
        q->push(ctx, wte, std::move(logits), s.ln_f.y.slice(r0 * C, Shape{n, C}), n);
      } else {
        // dwte (Vp, C) += dlogitsᵀ (Vp, n) · h (n, C)
        matmul_add(ctx, matrix(wte.bound_grad()), matrix(logits.data(), n, Vp).t(), hn);
      }
    }
    logits.reset();
    s.losses.reset();
    return ln_f_.backward(ctx, dh, s.ln_f);
  }

  GptConfig cfg_;
  GptPart part_;
  Embedding<T, B> embedding_;  // 1-row placeholders for what the part does not hold
  std::vector<Checkpointed<Block>> blocks_;
  LayerNorm<T, B> ln_f_;
};

}  // namespace fourway::models
