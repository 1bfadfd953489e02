//! `fw::models::Gpt<T, B, Comm>`: GPT-2 (Radford et al. 2019) exactly — token + learned position
//! embedding, pre-LayerNorm blocks with tanh GELU, final LayerNorm (eps 1e-5), language-model
//! head tied to `wte`, loss = mean cross-entropy over all B·T targets — written once, on the
//! tensor-parallel-ready layers, for every mesh. In a group of one rank (`Comm` = fw::Alone, the
//! default) it is the unsplit model; built over a tensor-parallel group of N ranks (`Gpt(ctx, cfg,
//! tp, seed, options, part)`) each rank holds its slices and the layers place their own
//! conjugate operators (docs/parallel-tp.md):
//! ```
//!   wte (Vp/N, C)  vocab       masked lookup + g (sequence parallel: reduce-scatter); the tied
//!                              LM head: logits of this rank's real vocabulary rows only
//!   wpe, ln_*      replicated  wpe added by tp rank 0 before the embedding's g
//!   blocks         TransformerBlock over the group (column c_attn / c_fc, row c_proj)
//!   loss           whole: the (padded) logits' cross-entropy, optionally `classifier_chunk`
//!                  rows at a time; split: vocabulary-parallel (an all-reduce MAX of the row
//!                  maxima, one SUM of (Σ exp, target logit)): full logits are never formed
//! ```
//! "Split" is the model built over a tensor-parallel group, tp = 1 included (a mesh's tp axis of
//! one rank keeps the split form, so its figures are those of every tp). The vocabulary is padded
//! to Vp: whole, a multiple of `GptConfig::vocab_alignment`; split, a multiple of
//! N·`TpOptions::vocab_alignment`. Padding rows are zero and their logits never enter the
//! softmax, so loss and gradients equal the unpadded model's.
//! Initial values are the one-rank model's for the same seed (each slice is drawn from the
//! unsplit tensor's stream), so every N starts from the same model.
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
//! Linear's and, whole, the LM head's part of wte's) to the scope's queue; the rest are added
//! in place. No host wait inside the model: every collective is completed in stream order
//! (layers/conjugate.hpp), and `forward_into` leaves the loss on the device.
//!
//! A `GptPart` builds only some units (a pipeline chunk): blocks [first_block, end_block), the
//! embedding (wte, wpe) and/or the head (ln_f, tied wte). Blocks keep their global index and
//! names; `visit_parameters` visits only what the part holds (wte once if it holds either end);
//! a part's FSDP units are its own units in model order. Unheld pieces are 1-row placeholders.
//! What passes between units is `boundary_shape(b, T)`: (b, T, C), or this rank's (b·T/N, C)
//! rows under sequence parallelism.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
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
#include "fourway/layers/replicated_norm.hpp"
#include "fourway/layers/sliced_model.hpp"
#include "fourway/layers/tp_group.hpp"
#include "fourway/layers/tp_options.hpp"
#include "fourway/layers/vocab_parallel.hpp"
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

namespace detail {
/// What a `Gpt` in a group of one adds to the model: nothing (the strategies treat it as whole).
struct WholeModel {
  explicit WholeModel(const TpGroup<Alone>& /*one rank*/) {}
};
template <class Comm>
struct gpt_base_of {
  using type = tp::SlicedModel<Comm>;
};
template <>
struct gpt_base_of<Alone> {
  using type = WholeModel;
};
template <class Comm>
using gpt_base = typename gpt_base_of<Comm>::type;
}  // namespace detail

template <floating_dtype T, backend B, class Comm = Alone>
class Gpt : public detail::gpt_base<Comm> {  // split: counts_in_norm, state_view, gather_over_tp
  static constexpr bool alone = std::is_same_v<Comm, Alone>;
  using base = detail::gpt_base<Comm>;

 public:
  using value_type = T;
  using backend_type = B;
  using comm_type = Comm;
  using Block = TransformerBlock<T, B, Comm>;
  using Norm = ReplicatedNorm<LayerNorm<T, B>, Comm>;

  struct Stash {
    Tensor<std::int32_t, B> targets;  // view (B, T)
    typename Embedding<T, B, Comm>::Stash embedding;
    std::vector<typename Checkpointed<Block>::Stash>
        blocks;  // `.inner` used when not checkpointing
    typename Norm::Stash ln_f;
    Tensor<T, B> logits;      // whole: (B, T, Vp) when classifier_chunk is 0, else empty
    Tensor<float, B> losses;  // whole: (B, T) per-token cross-entropy
    typename VocabHead<T, B, Comm>::Stash head;  // split: the vocabulary-parallel head's
    float loss = 0.0f;  // the head's mean loss; NaN when a LossSink took it
  };

  /// Builds and initialises the model as GPT-2 / nanoGPT do (normal std 0.02, c_proj weights
  /// 0.02/sqrt(2·layers), biases 0, LayerNorm gains 1); element i of a parameter depends only on
  /// (seed, name, i). With `part`, only those units (values as in the whole model).
  Gpt(const Context<B>& ctx, const GptConfig& cfg, std::uint64_t seed = 0,
      GptPart part = {}) requires alone
      : Gpt(ctx, cfg, TpGroup<Comm>{}, seed, part, (cfg.validate(), cfg.padded_vocab())) {}

  /// This rank's slices of the same model over the tensor-parallel group `tp` (the values of
  /// `Gpt<T, B>(ctx, cfg, seed)`, sliced); with `part`, only those units. `options`: sequence
  /// parallelism and the vocabulary's padding (a multiple of tp·alignment).
  Gpt(const Context<B>& ctx, const GptConfig& cfg, Comm& tp, std::uint64_t seed = 0,
      tp::TpOptions options = {}, GptPart part = {}) requires(!alone)
      : Gpt(ctx, cfg, TpGroup<Comm>(tp, options.sequence_parallel), seed, part,
            tp::padded_vocab(cfg.vocab, tp.size(),
                             tp::resolve_alignment<B>(options.vocab_alignment))) {
    this->read_placements(*this);
  }

  /// The same model described but not allocated (deferred construction, layers/parameter.hpp):
  /// names, shapes, decay flags and init rules, no storage. A strategy materialises what its rank
  /// owns; SingleRank materialises everything.
  static Gpt deferred(const Context<B>& ctx, const GptConfig& cfg,
                      std::uint64_t seed = 0) requires alone {
    const DeferredInit scope;
    return Gpt(ctx, cfg, seed);
  }

  [[nodiscard]] const GptConfig& config() const { return cfg_; }
  [[nodiscard]] const GptPart& part() const { return part_; }
  [[nodiscard]] bool whole() const {
    return part_.embedding && part_.head && part_.first_block == 0 &&
           part_.end_block == cfg_.layers;
  }
  /// Holds wte (this rank's vocabulary rows): as the embedding, as the tied head, or both.
  [[nodiscard]] bool holds_wte() const { return part_.embedding || part_.head; }
  /// Switches activation checkpointing of the blocks (between steps, never inside one).
  void set_checkpointing(bool on) { cfg_.checkpoint = on; }
  /// Switches selective recomputation of the blocks (GptConfig::selective), between steps.
  void set_selective(bool on) { cfg_.selective = on; }
  /// Rows of logits the head computes at a time (GptConfig::classifier_chunk; between steps).
  /// The vocabulary-parallel head (split) never forms the full logits and ignores it.
  void set_classifier_chunk(int rows) {
    check<ConfigError>(rows >= 0, "fourway: classifier_chunk=", rows, " must be >= 0");
    cfg_.classifier_chunk = rows;
  }
  [[nodiscard]] int units() const {
    return (part_.embedding ? 1 : 0) + static_cast<int>(blocks_.size()) + (part_.head ? 1 : 0);
  }
  [[nodiscard]] const TpGroup<Comm>& group() const { return group_; }
  [[nodiscard]] bool sequence_parallel() const { return group_.sequence_parallel(); }
  /// The vocabulary with its padding rows, Vp.
  [[nodiscard]] std::int64_t padded_vocab() const { return padded_; }

  /// Mean cross-entropy of predicting `targets` (B, T) from `tokens` (B, T); keeps what backward
  /// needs in `s`. Synchronises with the device to return the loss.
  template <class Hooks = NoHooks>
  requires gpt_hooks<std::remove_cvref_t<Hooks>>
  float forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                const Tensor<std::int32_t, B>& targets, Stash& s, Hooks&& hooks = Hooks{}) {
    return run_forward(ctx, tokens, targets, s, hooks, nullptr);
  }
  /// The same forward with the loss left on the device: `sink.weight` × the sum of the per-token
  /// losses is added to `*sink.sum` (layers/layer.hpp), and no synchronising call is made (the
  /// Trainer's path: the step's one read-back is then the strategy's, of its scalars).
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
    check<ShapeError>(head_stashed(s) && s.blocks.size() == blocks_.size(),
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
                       "part (a pipeline chunk, blocks [", part_.first_block, ", ", part_.end_block,
                       ")): run its units one at a time");
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

  /// Unit 0: token ids (B, T) -> boundary_shape(B, T).
  Tensor<T, B> forward_embedding(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                                 Stash& s) {
    check<ConfigError>(part_.embedding, "fourway: this Gpt part does not hold the embedding");
    check<ShapeError>(tokens.shape().rank() == 2, "fourway: Gpt expects token ids (B, T), got ",
                      tokens.shape().str());
    set_sequence_length(tokens.shape()[1]);
    return embedding_.forward(ctx, tokens, s.embedding);
  }
  /// Unit i+1: block i, boundary_shape -> boundary_shape; recomputed in backward when
  /// checkpointing. The blocks run at the last `set_sequence_length`.
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
    check<ConfigError>(part_.head, "fourway: this Gpt part does not hold the head");
    if (split()) {
      check<ShapeError>(
          targets.shape().rank() == 2 &&
              x.numel() * (sequence_parallel() ? group_.size() : 1) == targets.numel() * cfg_.dim,
          "fourway: Gpt head got x ", x.shape().str(), " for targets ", targets.shape().str());
    } else {
      check<ShapeError>(
          x.shape().rank() == 3 && targets.shape() == Shape{x.shape()[0], x.shape()[1]},
          "fourway: Gpt head expects x (B, T, C) and targets (B, T), got ", x.shape().str(),
          " and ", targets.shape().str());
    }
    s.targets = targets.view();
    s.loss = split() ? split_head_forward(ctx, x, s, sink) : head_forward(ctx, x, s, sink);
    return s.loss;
  }
  /// Unit L+1 backward: d(grad_scale × mean loss) / dx; adds to ln_f's and wte's grads.
  Tensor<T, B> backward_head(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f) {
    check<ShapeError>(head_stashed(s), "fourway: Gpt head backward without its forward");
    return split() ? split_head_backward(ctx, s, grad_scale) : head_backward(ctx, s, grad_scale);
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
    check<ConfigError>(part_.embedding, "fourway: this Gpt part does not hold the embedding");
    (void)embedding_.backward(ctx, dy, s.embedding);
  }

  // ---- incremental decoding (layers/generate.hpp): one token of one sequence at a time over KV
  // caches, unit by unit as forward runs them (`fw::decode_token` brackets each with the hooks);
  // every rank of a tensor-parallel group decodes the same row ---------------------------------

  /// One `KvCache` per block this object holds (of this rank's NH/N heads), for one sequence of
  /// up to `capacity` tokens (backend memory, activations: 2 · capacity · C/N elements per block).
  [[nodiscard]] std::vector<KvCache<T, B>> kv_caches(const Context<B>& ctx,
                                                     std::int64_t capacity) const {
    return make_kv_caches<T, B>(ctx, blocks_.size(), cfg_.heads / group_.size(),
                                cfg_.dim / cfg_.heads, capacity, cfg_.max_seq);
  }
  /// Unit 0 of one token: wte[token] + wpe[pos], (1, 1, C).
  Tensor<T, B> decode_embedding(const Context<B>& ctx, std::int32_t token, std::int64_t pos) {
    return embedding_.decode(ctx, token, pos);
  }
  /// Unit i+1 of one token: block i over its cache `cache` (this object's cache of that block).
  Tensor<T, B> decode_block(const Context<B>& ctx, int i, const Tensor<T, B>& x,
                            KvCache<T, B>& cache, std::int64_t pos) {
    check_block(i);
    return blocks_[local_block(i)].inner().decode(ctx, x, cache, pos);
  }
  /// Unit L+1 of one token: ln_f and the tied head; the next token's `vocab` logits (the padding
  /// rows left out) on the host of every rank (each rank's rows placed in a row of Vp and summed
  /// over a tensor-parallel group).
  std::vector<float> decode_head(const Context<B>& ctx, const Tensor<T, B>& x) {
    const std::int64_t C = cfg_.dim;
    typename Norm::Stash ls;
    const Tensor<T, B> h = ln_f_.forward(ctx, x, ls);
    Tensor<T, B> logits = ::fourway::detail::workspace<T, B>(ctx, Shape{1, padded_});
    if (!split()) {
      matmul(ctx, matrix(logits.data(), 1, padded_), matrix(h.data(), 1, C),
             matrix(wte().bound_weight()).t());
    } else {
      Ops<B>::fill(ctx, logits.data(), logits.numel(), convert<T>(0.0f));
      const std::int64_t start = embedding_.vocab_start();
      const std::int64_t valid = embedding_.vocab_valid();
      if (valid > 0) {
        matmul(ctx, matrix(logits.data() + start, 1, valid), matrix(h.data(), 1, C),
               matrix(wte().bound_weight().data(), valid, C).t());
      }
      group_.all_reduce(logits);
    }
    return ::fourway::detail::logits_to_host(ctx, logits, cfg_.vocab);
  }

  /// Every parameter once, in Hugging Face order: wte, wpe, h.0.* .. h.{L-1}.*, ln_f.*.
  template <class F>
  void visit_parameters(F&& f) {
    if (holds_wte()) f(embedding_.wte());
    if (part_.embedding) f(embedding_.wpe());
    for (auto& b : blocks_) b.visit_parameters(f);
    if (part_.head) ln_f_.visit_parameters(f);
  }

  /// The parameters of FSDP unit `u` (0 embedding, 1..L blocks, L+1 = ln_f and the tied wte; a
  /// part's units are its own, in model order).
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

  // ---- values of a split model (what a strategy needs of it besides — counts_in_norm,
  // state_view, sum_over_model_parallel, gather_over_tp — comes from tp::SlicedModel) ----------

  /// Sets every parameter to its slice of the unsplit tensors: `read(placement, first, count,
  /// out)` writes elements [first, first + count) of the full tensor (Hugging Face layout, as
  /// float) to `out`. Only the runs this rank holds are asked for; padding rows are zero.
  /// Gradients are untouched (checkpoint/tp_checkpoint.hpp loads through it).
  template <class Read>
  void load_runs(const Context<B>& ctx, Read&& read) requires(!alone) {
    tp::load_slices(ctx, *this, this->table_, this->n_, this->rank_, read);
  }
  /// Sets every parameter to its slice of `full(placement)` (the whole unsplit tensor as float).
  template <class Full>
  void load(const Context<B>& ctx, Full&& full) requires(!alone) {
    const tp::Placement* held = nullptr;
    std::vector<float> values;
    load_runs(ctx,
              [&](const tp::Placement& pl, std::int64_t first, std::int64_t count, float* out) {
                if (held != &pl) {
                  values = full(pl);
                  check<ShapeError>(static_cast<std::int64_t>(values.size()) == pl.full_numel(),
                                    "fourway: Gpt load of ", pl.name, ": got ", values.size(),
                                    " values for a tensor of ", pl.full_numel());
                  held = &pl;
                }
                std::copy_n(values.data() + first, count, out);
              });
  }
  /// This rank's parameter values (as float), in `visit_parameters` order.
  std::vector<std::vector<float>> local_parameters(const Context<B>& ctx) {
    std::vector<std::vector<float>> out;
    visit_parameters([&](Parameter<T, B>& p) { out.push_back(parameter_values(ctx, p)); });
    return out;
  }

  Embedding<T, B, Comm>& embedding() { return embedding_; }
  /// The sequence length the blocks run at (a chunk without the embedding cannot read it from
  /// the token ids; under sequence parallelism its input rows do not show it).
  void set_sequence_length(std::int64_t Tn) {
    for (auto& b : blocks_) b.inner().set_sequence_length(Tn);
  }
  /// Context parallelism: the token rows are the shard's part of each sequence; the position
  /// embedding and every block's attention follow it (null: whole sequences). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) {
    embedding_.bind_sequence_shard(shard);
    for (auto& b : blocks_) b.inner().bind_sequence_shard(shard);
  }
  /// The token embedding (this rank's vocabulary rows), which the LM head shares (tied).
  Parameter<T, B>& wte() { return embedding_.wte(); }
  /// What one unit hands the next for a micro-batch of b sequences of T tokens: (b, T, C), or
  /// this rank's (b·T/N, C) rows under sequence parallelism.
  [[nodiscard]] Shape boundary_shape(std::int64_t b, std::int64_t Tn) const {
    return sequence_parallel() ? Shape{b * Tn / group_.size(), cfg_.dim} : Shape{b, Tn, cfg_.dim};
  }
  Block& block(int i) {
    check_block(i);
    return blocks_[local_block(i)].inner();
  }
  LayerNorm<T, B>& ln_f() { return ln_f_.norm(); }

 private:
  /// Every constructor's body: `padded` rows of the vocabulary over `group`.
  Gpt(const Context<B>& ctx, const GptConfig& cfg, TpGroup<Comm> group, std::uint64_t seed,
      GptPart part, std::int64_t padded)
      : base(base_argument(group)),
        cfg_((cfg.validate(), cfg)),
        part_(resolve_part(part, cfg.layers)),
        group_(group),
        padded_(padded),
        // unheld ends: 1-row placeholders (one row per rank of a split vocabulary)
        embedding_(ctx, holds_wte() ? cfg.vocab : 1, part_.embedding ? cfg.max_seq : 1, cfg.dim,
                   seed, 0.02f, holds_wte() ? padded : group.size(), group),
        ln_f_(ctx, "ln_f", part_.head ? cfg.dim : 1, 1e-5f, group) {
    const Init init = Init::gpt2(seed, cfg.layers);
    blocks_.reserve(static_cast<std::size_t>(part_.end_block - part_.first_block));
    for (int i = part_.first_block; i < part_.end_block; ++i) {
      blocks_.emplace_back(Block(ctx, "h." + std::to_string(i), cfg.dim, cfg.heads, init, group));
    }
  }
  static decltype(auto) base_argument(const TpGroup<Comm>& group) {
    if constexpr (alone) {
      return group;
    } else {
      return *group.comm();
    }
  }

  /// Built over a tensor-parallel group (of any size, tp = 1 included): the vocabulary-parallel
  /// head and the split embedding, as every tp of a mesh has them.
  [[nodiscard]] bool split() const { return group_.has_comm(); }
  [[nodiscard]] static bool head_stashed(const Stash& s) {
    return !s.losses.empty() || !s.head.stats.empty();
  }
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
  /// The split model's LM head: a vocabulary-parallel head tied to wte (this rank's rows),
  /// made where it is used, so that it always borrows this object's wte.
  VocabHead<T, B, Comm> split_head() { return VocabHead<T, B, Comm>(wte(), group_); }

  // ---- the head of the whole model: the padded logits' cross-entropy -------------------------

  float head_forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s, const LossSink* sink) {
    const std::int64_t Bn = x.shape()[0];
    const std::int64_t Tn = x.shape()[1];
    const std::int64_t rows = Bn * Tn;
    const std::int64_t V = cfg_.vocab;
    const std::int64_t Vp = padded_;  // logits row stride: the padding is masked
    const std::int64_t C = cfg_.dim;
    Tensor<T, B> h = ln_f_.forward(ctx, x, s.ln_f);
    s.losses = ::fourway::detail::activation<float, B>(ctx, Shape{Bn, Tn});
    const Matrix<T> wt = matrix(wte().bound_weight()).t();
    // logits (n, V) = h (n, C) · wteᵀ (C, V), the LM head tied to the token embedding, then the
    // losses: all rows at once into the stash (kept for backward), or, the fused classifier,
    // `chunk` rows at a time into one workspace buffer
    const bool keep = cfg_.classifier_chunk == 0;
    const std::int64_t chunk = classifier_rows(rows);
    Tensor<T, B> logits = keep ? ::fourway::detail::activation<T, B>(ctx, Shape{Bn, Tn, Vp})
                               : ::fourway::detail::workspace<T, B>(ctx, Shape{chunk, Vp});
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
    const std::int64_t Vp = padded_;
    const std::int64_t C = cfg_.dim;
    const float dloss = grad_scale / static_cast<float>(rows);
    Parameter<T, B>& w = wte();
    Tensor<T, B> dh = ::fourway::detail::workspace<T, B>(ctx, s.ln_f.y.shape());
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
          logits = ::fourway::detail::activation<T, B>(ctx, Shape{n, Vp});
        } else if (logits.empty()) {
          logits = ::fourway::detail::workspace<T, B>(ctx, Shape{chunk, Vp});
        }
        matmul(ctx, matrix(logits.data(), n, Vp), hn, matrix(w.bound_weight()).t());
      }
      // d logits in place; the padded columns become 0, so no gradient reaches wte's padding
      Ops<B>::cross_entropy_backward(ctx, logits.data(), logits.data(), s.targets.data() + r0, n, V,
                                     dloss, Vp);
      // dh (n, C) = dlogits (n, Vp) · wte (Vp, C)
      matmul(ctx, matrix(dh.data() + r0 * C, n, C), matrix(logits.data(), n, Vp),
             matrix(w.bound_weight()));
      if (q != nullptr) {  // d logits kept until W
        q->push(ctx, w, std::move(logits), s.ln_f.y.slice(r0 * C, Shape{n, C}), n);
      } else {
        // dwte (Vp, C) += dlogitsᵀ (Vp, n) · h (n, C)
        matmul_add(ctx, matrix(w.bound_grad()), matrix(logits.data(), n, Vp).t(), hn);
      }
    }
    logits.reset();
    s.losses.reset();
    return ln_f_.backward(ctx, dh, s.ln_f);
  }

  // ---- the head over a tensor-parallel group: VocabHead, tied (layers/vocab_parallel.hpp) ----

  float split_head_forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s,
                           const LossSink* sink) {
    const Tensor<T, B> h = ln_f_.forward(ctx, x, s.ln_f);  // sequence parallel: (B·T/N, C)
    return split_head().forward(ctx, h, s.targets, s.head, sink);
  }

  Tensor<T, B> split_head_backward(const Context<B>& ctx, Stash& s, float grad_scale) {
    // the head's stash is freed before f's backward; dh comes back in ln_f's output's rows
    const Tensor<T, B> dh = split_head().backward(ctx, s.head, grad_scale);
    return ln_f_.backward(ctx, dh.view(s.ln_f.y.shape()), s.ln_f);
  }

  GptConfig cfg_;
  GptPart part_;
  TpGroup<Comm> group_;
  std::int64_t padded_;              // Vp
  Embedding<T, B, Comm> embedding_;  // 1-row placeholders for what the part does not hold
  std::vector<Checkpointed<Block>> blocks_;
  Norm ln_f_;
};

}  // namespace fourway::models
