//! `tp::Gpt<T, B, Comm>`: fw::models::Gpt split over a tensor-parallel group of N ranks — the
//! same model, the same parameter names and the same FSDP units, each rank holding the slices its
//! placement table (tp/placement.hpp, `gpt_placements`) gives it:
//! ```
//!   wte (Vp/N, C)  vocab      masked lookup + all-reduce (sequence parallel: reduce-scatter);
//!                             the tied LM head: logits (B·T, V_valid) of this rank's rows
//!   wpe, ln_*      replicated  wpe is added by tp rank 0 before the embedding's reduction
//!   blocks         tp::Block   (column c_attn / c_fc, row c_proj, replicated biases)
//!   loss           vocabulary-parallel fused cross-entropy: all-reduce MAX of the row maxima,
//!                  one all-reduce SUM of (Σ exp, target logit); full logits are never formed
//!                  and its backward communicates nothing
//! ```
//! The vocabulary is padded to Vp (a multiple of N·alignment); the padding rows of wte are zero
//! and never enter a product: a rank computes logits only for its real rows, so the padded
//! logits are masked out of the softmax exactly and loss and gradients equal the unpadded
//! model's (Megatron-Core instead trains the padded logits as part of the softmax).
//! Under sequence parallelism the residual stream between the column and row splits holds this
//! rank's B·T/N rows (contiguous chunks of the flattened (B, T) rows).
//! Initial values equal fw::models::Gpt's for the same seed (the full tensor is drawn from the
//! (seed, name) stream and sliced), so every N starts from the one-rank model.
//! No host wait inside the model: every collective above is completed in stream order
//! (layers/conjugate.hpp), and `forward_into` leaves the loss on the device (a `LossSink`, as
//! fw::models::Gpt's), so a Trainer step's host waits are the strategy's step scalars alone
//! (docs/parallel-tp.md). `forward` reads the loss back (one synchronising call).
//!
//! A `ModelPart` (layers/model_part.hpp) builds only some units, as fw::models::Gpt does (a
//! pipeline chunk under tensor parallelism, train/pipeline_strategy.hpp): blocks [first_block,
//! end_block), the embedding and/or the head; `placements()` and `visit_parameters` list only what
//! the part holds (the vocabulary slice of `wte` once if it holds either end). The pieces
//! `forward_embedding`, `forward_block`, `forward_head` and their backwards run one unit at a time
//! (the pipeline executor's interface); what passes between units is `boundary_shape(b, T)`: (b, T,
//! C), or this rank's (b·T/N, C) rows under sequence parallelism.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fourway/comm/communicator.hpp"
#include "fourway/layers/checkpoint.hpp"
#include "fourway/layers/conjugate.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/layers/layernorm.hpp"
#include "fourway/layers/vocab_loss.hpp"
#include "fourway/parallel/tp/block.hpp"
#include "fourway/parallel/tp/options.hpp"
#include "fourway/parallel/tp/placement.hpp"
#include "fourway/parallel/tp/slices.hpp"

namespace fourway::tp {

/// The placement table of a GPT-2 model split over `n` ranks, in `visit_parameters` order.
inline std::vector<Placement> gpt_placements(const models::GptConfig& cfg, int n, int alignment,
                                             std::uint64_t seed = 0) {
  cfg.validate();
  check_heads_split(cfg.dim, cfg.heads, n);
  const Init init = Init::gpt2(seed, cfg.layers);
  const std::int64_t C = cfg.dim;
  std::vector<Placement> t;
  auto add = [&](std::string name, Split split, std::int64_t rows, std::int64_t cols, int parts,
                 bool matrix, InitRule rule) {
    Placement p = Placement::of(split, rows, cols, matrix, parts,
                                split == Split::vocab ? padded_vocab(rows, n, alignment) : rows);
    p.name = std::move(name);
    p.init = rule;
    t.push_back(std::move(p));
  };
  const InitRule normal{true, init.std};
  const InitRule residual{true, init.residual_std};
  const InitRule zero{false, 0.0f};
  const InitRule one{false, 1.0f};
  add("wte.weight", Split::vocab, cfg.vocab, C, 1, true, InitRule{true, 0.02f});
  add("wpe.weight", Split::replicated, cfg.max_seq, C, 1, true, InitRule{true, 0.02f});
  for (int i = 0; i < cfg.layers; ++i) {
    const std::string h = "h." + std::to_string(i);
    add(h + ".ln_1.weight", Split::replicated, 1, C, 1, false, one);
    add(h + ".ln_1.bias", Split::replicated, 1, C, 1, false, zero);
    add(h + ".attn.c_attn.weight", Split::column, C, 3 * C, 3, true, normal);
    add(h + ".attn.c_attn.bias", Split::column, 1, 3 * C, 3, false, zero);
    add(h + ".attn.c_proj.weight", Split::row, C, C, 1, true, residual);
    add(h + ".attn.c_proj.bias", Split::replicated, 1, C, 1, false, zero);
    add(h + ".ln_2.weight", Split::replicated, 1, C, 1, false, one);
    add(h + ".ln_2.bias", Split::replicated, 1, C, 1, false, zero);
    add(h + ".mlp.c_fc.weight", Split::column, C, 4 * C, 1, true, normal);
    add(h + ".mlp.c_fc.bias", Split::column, 1, 4 * C, 1, false, zero);
    add(h + ".mlp.c_proj.weight", Split::row, 4 * C, C, 1, true, residual);
    add(h + ".mlp.c_proj.bias", Split::replicated, 1, C, 1, false, zero);
  }
  add("ln_f.weight", Split::replicated, 1, C, 1, false, one);
  add("ln_f.bias", Split::replicated, 1, C, 1, false, zero);
  return t;
}

/// Elements [first, first + count) of `p`'s full (unsplit) initial values, exactly as
/// layers/parameter.hpp's counter-based init draws them for the one-rank model.
inline void initial_values(const Placement& p, std::uint64_t seed, std::int64_t first,
                           std::int64_t count, float* out) {
  if (!p.init.normal) {
    std::fill_n(out, count, p.init.value);
    return;
  }
  const std::uint64_t key = ::fourway::detail::init_key(seed, p.name);
  for (std::int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<float>(p.init.value * ::fourway::detail::init_normal_at(key, first + i));
  }
}

template <floating_dtype T, backend B, communicator Comm>
class Gpt : public SlicedModel<Comm> {
  using base = SlicedModel<Comm>;
  using base::n_;
  using base::rank_;
  using base::table_;
  using base::tp_;

 public:
  using value_type = T;
  using backend_type = B;
  using Block = tp::Block<T, B, Comm>;

  struct Stash {
    Tensor<std::int32_t, B> tokens;   // view (B, T)
    Tensor<std::int32_t, B> targets;  // view (B, T)
    Tensor<T, B> emb;                 // (B, T, C); sequence parallel: (B·T/N, C)
    std::vector<typename Checkpointed<Block>::Stash> blocks;
    typename LayerNorm<T, B>::Stash ln_f;
    Tensor<T, B> h;          // sequence parallel: ln_f's output gathered (B·T, C)
    Tensor<T, B> logits;     // (B·T, Vv): this rank's Vv <= Vp/N real vocabulary columns
    Tensor<float, B> stats;  // (3, B·T): global row max | Σ exp | target logit
    float loss = 0.0f;       // the head's mean loss; NaN when a LossSink took it (forward_into)
  };

  /// Builds this rank's slices of GPT-2 (the values of fw::models::Gpt(ctx, cfg, seed)); with
  /// `part`, only those units.
  Gpt(const Context<B>& ctx, const models::GptConfig& cfg, Comm& tp, std::uint64_t seed = 0,
      TpOptions options = {}, ModelPart part = {})
      : Gpt(ctx, cfg, tp, seed, options, part,
            gpt_placements(cfg, tp.size(), resolve_alignment<B>(options.vocab_alignment), seed)) {}

 private:
  /// `all`: the whole model's placement table (this part keeps the rows it holds).
  Gpt(const Context<B>& ctx, const models::GptConfig& cfg, Comm& tp, std::uint64_t seed,
      TpOptions options, ModelPart part, std::vector<Placement> all)
      : base(tp, held_placements(resolve_part(part, cfg.layers), all)),
        cfg_(cfg),
        sp_(options.sequence_parallel),
        part_(resolve_part(part, cfg.layers)),
        vocab_(all.front()),
        ln_f_(ctx, "ln_f", part_.head ? cfg.dim : 1) {
    wte_ = Parameter<T, B>(ctx, vocab_.name,
                           holds_wte() ? Shape{vocab_.local_rows(n_), vocab_.cols} : Shape{1, 1});
    wpe_ = Parameter<T, B>(ctx, "wpe.weight",
                           part_.embedding ? Shape{cfg.max_seq, cfg.dim} : Shape{1, 1});
    const Init init = Init::gpt2(seed, cfg.layers);
    blocks_.reserve(static_cast<std::size_t>(part_.end_block - part_.first_block));
    for (int i = part_.first_block; i < part_.end_block; ++i) {
      blocks_.emplace_back(Block(ctx, "h." + std::to_string(i), cfg.dim, cfg.heads, init, tp, sp_));
    }
    load_runs(ctx, [&](const Placement& p, std::int64_t first, std::int64_t count, float* out) {
      initial_values(p, seed, first, count, out);
    });
  }

 public:
  [[nodiscard]] const models::GptConfig& config() const { return cfg_; }
  /// The units this object holds (end_block resolved).
  [[nodiscard]] const ModelPart& part() const { return part_; }
  [[nodiscard]] bool whole() const {
    return part_.embedding && part_.head && part_.first_block == 0 &&
           part_.end_block == cfg_.layers;
  }
  /// Holds this rank's vocabulary slice of wte: as the embedding, the tied head, or both.
  [[nodiscard]] bool holds_wte() const { return part_.embedding || part_.head; }
  void set_checkpointing(bool on) { cfg_.checkpoint = on; }
  /// Switches selective recomputation of the blocks (GptConfig::selective), between steps.
  void set_selective(bool on) { cfg_.selective = on; }
  [[nodiscard]] int units() const {
    return (part_.embedding ? 1 : 0) + static_cast<int>(blocks_.size()) + (part_.head ? 1 : 0);
  }
  [[nodiscard]] bool sequence_parallel() const { return sp_; }
  [[nodiscard]] std::int64_t padded_vocab() const { return vocab_.padded_rows; }
  /// This rank's slice of wte (the embedding's and the tied head's; a placeholder when the part
  /// holds neither end).
  Parameter<T, B>& wte() { return wte_; }
  /// What one unit hands the next for a micro-batch of b sequences of T tokens.
  [[nodiscard]] Shape boundary_shape(std::int64_t b, std::int64_t Tn) const {
    return sp_ ? Shape{b * Tn / n_, cfg_.dim} : Shape{b, Tn, cfg_.dim};
  }
  /// The sequence length the blocks run at (a chunk without the embedding cannot read it from
  /// the token ids; under sequence parallelism its input rows do not show it).
  void set_sequence_length(std::int64_t Tn) {
    for (auto& b : blocks_) b.inner().set_sequence_length(Tn);
  }
  /// Context parallelism: the token rows are the shard's part of each sequence; the position
  /// embedding and every block's attention follow it (null: whole sequences). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) {
    shard_ = shard;
    for (auto& b : blocks_) b.inner().bind_sequence_shard(shard);
  }

  /// Mean cross-entropy of predicting `targets` (B, T) from `tokens` (B, T), read back to the
  /// host (one synchronising call); keeps what backward needs in `s`.
  template <class Hooks = NoHooks>
  float forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                const Tensor<std::int32_t, B>& targets, Stash& s, Hooks&& hooks = Hooks{}) {
    return run_forward(ctx, tokens, targets, s, hooks, nullptr);
  }
  /// The same forward with the loss left on the device: `sink.weight` × the sum of the per-token
  /// losses is added to `*sink.sum` (layers/layer.hpp) and no synchronising call is made (the
  /// Trainer's path: the step's one read-back is then the strategy's, of its scalars).
  template <class Hooks = NoHooks>
  void forward_into(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                    const Tensor<std::int32_t, B>& targets, Stash& s, const LossSink& sink,
                    Hooks&& hooks = Hooks{}) {
    (void)run_forward(ctx, tokens, targets, s, hooks, &sink);
  }

 private:
  template <class Hooks>
  float run_forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                    const Tensor<std::int32_t, B>& targets, Stash& s, Hooks& hooks,
                    const LossSink* sink) {
    check<ConfigError>(whole(), "fourway: tp::Gpt::forward runs the whole model; this part holds ",
                       "blocks [", part_.first_block, ", ", part_.end_block,
                       "): run it with forward_embedding / forward_block / forward_head");
    check<ShapeError>(targets.shape() == tokens.shape() && tokens.shape().rank() == 2,
                      "fourway: tp::Gpt expects tokens and targets (B, T) of one shape, got ",
                      tokens.shape().str(), " and ", targets.shape().str());
    hooks.pre_forward(0);
    Tensor<T, B> x = forward_embedding(ctx, tokens, s);
    hooks.post_forward(0);
    for (int i = 0; i < cfg_.layers; ++i) {
      hooks.pre_forward(i + 1);
      x = forward_block(ctx, i, x, s);
      hooks.post_forward(i + 1);
    }
    hooks.pre_forward(head_unit());
    forward_head(ctx, x, targets, s, sink);
    hooks.post_forward(head_unit());
    return s.loss;
  }

 public:
  template <class Hooks = NoHooks>
  void backward(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f, Hooks&& hooks = Hooks{}) {
    check<ShapeError>(!s.stats.empty() && s.blocks.size() == blocks_.size(),
                      "fourway: tp::Gpt backward without a matching forward (empty stash)");
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

  // ---- one unit at a time (a pipeline chunk runs only its own units; forward/backward above
  // are these in order). Each forward piece keeps its part of the micro-batch in `s`.

  /// Unit 0: token ids (B, T) -> boundary_shape(B, T).
  Tensor<T, B> forward_embedding(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                                 Stash& s) {
    check<ConfigError>(part_.embedding, "fourway: tp::Gpt part without the embedding");
    check<ShapeError>(tokens.shape().rank() == 2, "fourway: tp::Gpt expects token ids (B, T), got ",
                      tokens.shape().str());
    set_sequence_length(tokens.shape()[1]);
    return embed(ctx, tokens, s);
  }
  /// Unit i+1: block i; the blocks run at the last `set_sequence_length`.
  Tensor<T, B> forward_block(const Context<B>& ctx, int i, const Tensor<T, B>& x, Stash& s) {
    auto& b = blocks_[local_block(i)];
    if (s.blocks.size() != blocks_.size()) s.blocks.resize(blocks_.size());
    auto& bs = s.blocks[local_block(i)];
    if (cfg_.checkpoint) return b.forward(ctx, x, bs);
    Tensor<T, B> y = b.inner().forward(ctx, x, bs.inner);
    if (cfg_.selective) b.inner().drop_recomputable(bs.inner);
    return y;
  }
  /// Unit L+1: ln_f, the vocabulary-parallel head and the mean cross-entropy of `targets` (B, T),
  /// read back; with `sink`, left on the device instead (see `forward_into`; NaN is returned).
  float forward_head(const Context<B>& ctx, const Tensor<T, B>& x,
                     const Tensor<std::int32_t, B>& targets, Stash& s,
                     const LossSink* sink = nullptr) {
    check<ConfigError>(part_.head, "fourway: tp::Gpt part without the head");
    check<ShapeError>(
        targets.shape().rank() == 2 && x.numel() == targets.numel() * cfg_.dim / (sp_ ? n_ : 1),
        "fourway: tp::Gpt head got x ", x.shape().str(), " for targets ", targets.shape().str());
    s.targets = targets.view();
    s.loss = head_forward(ctx, x, s, sink);
    return s.loss;
  }
  /// Unit L+1 backward: d(grad_scale × mean loss) / dx; adds to ln_f's and wte's gradients.
  Tensor<T, B> backward_head(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f) {
    check<ShapeError>(!s.stats.empty(), "fourway: tp::Gpt head backward without its forward");
    return head_backward(ctx, s, grad_scale);
  }
  /// Unit i+1 backward: block i.
  Tensor<T, B> backward_block(const Context<B>& ctx, int i, const Tensor<T, B>& dy, Stash& s) {
    auto& b = blocks_[local_block(i)];
    check<ShapeError>(s.blocks.size() == blocks_.size(), "fourway: tp::Gpt block ", i,
                      " backward without its forward");
    auto& bs = s.blocks[local_block(i)];
    return cfg_.checkpoint ? b.backward(ctx, dy, bs) : b.inner().backward(ctx, dy, bs.inner);
  }
  /// Unit 0 backward: adds to wte's and wpe's gradients.
  void backward_embedding(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    check<ConfigError>(part_.embedding, "fourway: tp::Gpt part without the embedding");
    embedding_backward(ctx, dy, s);
  }

  // ---- incremental decoding (layers/generate.hpp), as fw::models::Gpt's: one token of one
  // sequence, every rank of the group the same row -------------------------------------------

  /// One `KvCache` per block this object holds, of its NH/N heads.
  [[nodiscard]] std::vector<KvCache<T, B>> kv_caches(const Context<B>& ctx,
                                                     std::int64_t capacity) const {
    return make_kv_caches<T, B>(ctx, blocks_.size(), cfg_.heads / n_, cfg_.dim / cfg_.heads,
                                capacity, cfg_.max_seq);
  }
  /// Unit 0 of one token: the vocabulary-parallel lookup (a masked row, summed over the group)
  /// plus wpe[pos], (1, 1, C) on every rank.
  Tensor<T, B> decode_embedding(const Context<B>& ctx, std::int32_t token, std::int64_t pos) {
    detail::check_decode_position(token, pos, cfg_.vocab, cfg_.max_seq);
    const std::int64_t C = cfg_.dim;
    Tensor<std::int32_t, B> id(Shape{1}, MemTag::workspace, ctx.memory());
    Ops<B>::from_host(ctx, id.data(), &token, 1);
    Tensor<T, B> e = detail::activation<T, B>(ctx, Shape{1, 1, C});
    Ops<B>::vocab_embed_forward(ctx, e.data(), id.data(), wte_.bound_weight().data(), 1, C,
                                vocab_start(), vocab_valid());
    if (rank_ == 0) Ops<B>::bias_add(ctx, e.data(), wpe_.bound_weight().data() + pos * C, 1, C);
    all_reduce_sum(*tp_, e);
    return e;
  }
  /// Unit i+1 of one token: block i over this rank's heads' cache.
  Tensor<T, B> decode_block(const Context<B>& ctx, int i, const Tensor<T, B>& x,
                            KvCache<T, B>& cache, std::int64_t pos) {
    return blocks_[local_block(i)].inner().decode(ctx, x, cache, pos);
  }
  /// Unit L+1 of one token: ln_f, each rank's logits of its vocabulary rows placed in a row of
  /// Vp and summed over the group; the `vocab` logits on the host of every rank.
  std::vector<float> decode_head(const Context<B>& ctx, const Tensor<T, B>& x) {
    const std::int64_t C = cfg_.dim;
    typename LayerNorm<T, B>::Stash ls;
    const Tensor<T, B> h = ln_f_.forward(ctx, x, ls);
    Tensor<T, B> logits = detail::workspace<T, B>(ctx, Shape{1, padded_vocab()});
    Ops<B>::fill(ctx, logits.data(), logits.numel(), convert<T>(0.0f));
    const VocabSlice<T, B> w = head_slice();
    if (w.valid > 0) {
      matmul(ctx, matrix(logits.data() + w.start, 1, w.valid), matrix(h.data(), 1, C),
             matrix(w.weight, w.valid, C).t());
    }
    all_reduce_sum(*tp_, logits);
    return detail::logits_to_host(ctx, logits, cfg_.vocab);
  }

  /// Hugging Face order (as fw::models::Gpt): wte, wpe, h.0.* .. h.{L-1}.*, ln_f.*.
  template <class F>
  void visit_parameters(F&& f) {
    if (holds_wte()) f(wte_);
    if (part_.embedding) f(wpe_);
    for (auto& b : blocks_) b.visit_parameters(f);
    if (part_.head) ln_f_.visit_parameters(f);
  }

  /// The FSDP units of fw::models::Gpt: 0 = wte, wpe; 1..L = blocks; L+1 = ln_f and wte (a
  /// part's units are its own, in model order).
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    check<ConfigError>(u >= 0 && u < units(), "fourway: tp::Gpt unit ", u, " does not exist; ",
                       "units are 0 .. ", units() - 1);
    const int first = part_.embedding ? 1 : 0;
    if (part_.embedding && u == 0) {
      f(wte_);
      f(wpe_);
    } else if (part_.head && u == units() - 1) {
      ln_f_.visit_parameters(f);
      f(wte_);
    } else {
      blocks_[static_cast<std::size_t>(u - first)].visit_parameters(f);
    }
  }

  // what a strategy needs of a model-parallel model (counts_in_norm, state_view,
  // sum_over_model_parallel, gather_over_tp) comes from SlicedModel (tp/slices.hpp)

  // ---- values -------------------------------------------------------------------------------
  /// Sets every parameter to its slice of the unsplit tensors: `read(placement, first, count,
  /// out)` writes elements [first, first + count) of the full tensor (Hugging Face layout, as
  /// float) to `out`. Only the runs this rank holds are asked for; padding rows are zero.
  /// Gradients are untouched.
  template <class Read>
  void load_runs(const Context<B>& ctx, Read&& read) {
    load_slices(ctx, *this, table_, n_, rank_, read);
  }

  /// Sets every parameter to its slice of `full(placement)` (the whole unsplit tensor as float).
  template <class Full>
  void load(const Context<B>& ctx, Full&& full) {
    const Placement* held = nullptr;
    std::vector<float> values;
    load_runs(ctx, [&](const Placement& pl, std::int64_t first, std::int64_t count, float* out) {
      if (held != &pl) {
        values = full(pl);
        check<ShapeError>(static_cast<std::int64_t>(values.size()) == pl.full_numel(),
                          "fourway: tp::Gpt load of ", pl.name, ": got ", values.size(),
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

 private:
  [[nodiscard]] int head_unit() const { return cfg_.layers + 1; }
  [[nodiscard]] const Placement& vocab() const { return vocab_; }
  [[nodiscard]] std::size_t local_block(int i) const {
    check<ConfigError>(i >= part_.first_block && i < part_.end_block, "fourway: tp::Gpt block ", i,
                       " is not in this part, which holds blocks [", part_.first_block, ", ",
                       part_.end_block, ")");
    return static_cast<std::size_t>(i - part_.first_block);
  }
  /// The rows of the whole table this part holds, in `visit_parameters` order.
  static std::vector<Placement> held_placements(const ModelPart& part,
                                                const std::vector<Placement>& all) {
    std::vector<Placement> out;
    const auto block_of = [](const std::string& name) {
      return name.starts_with("h.") ? std::stoi(name.substr(2)) : -1;
    };
    for (const auto& p : all) {
      const int b = block_of(p.name);
      const bool held = p.split == Split::vocab  ? part.embedding || part.head
                        : p.name == "wpe.weight" ? part.embedding
                        : b >= 0                 ? b >= part.first_block && b < part.end_block
                                                 : part.head;  // ln_f
      if (held) out.push_back(p);
    }
    return out;
  }
  [[nodiscard]] std::int64_t vocab_start() const { return vocab().vocab_start(n_, rank_); }
  [[nodiscard]] std::int64_t vocab_valid() const { return vocab().valid_rows(n_, rank_); }

  void check_ids(const Tensor<std::int32_t, B>& ids, const char* what) const {
    ::fourway::detail::check_vocab_ids(ids, cfg_.vocab, what);
  }

  Tensor<T, B> embed(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens, Stash& s) {
    const std::int64_t Bn = tokens.shape()[0];
    const std::int64_t Tn = tokens.shape()[1];
    const std::int64_t C = cfg_.dim;
    const std::int64_t seq = sequence_length(shard_, Tn);
    check<ConfigError>(seq <= cfg_.max_seq, "fourway: sequence length T=", seq,
                       " exceeds max_seq=", cfg_.max_seq,
                       "; shorten the sequences or build the model with max_seq >= ", seq);
    check_ids(tokens, "token");
    s.tokens = tokens.view();
    Tensor<T, B> e = detail::activation<T, B>(ctx, Shape{Bn, Tn, C});  // partial sum over the group
    Ops<B>::vocab_embed_forward(ctx, e.data(), tokens.data(), wte_.bound_weight().data(), Bn * Tn,
                                C, vocab_start(), vocab_valid());
    if (rank_ == 0) {
      Tensor<T, B> wpe_rows;  // a sequence shard: wpe at the rows' positions
      const T* wpe = position_rows(ctx, shard_, wpe_.bound_weight().data(), Tn, C, wpe_rows);
      Ops<B>::bias_add(ctx, e.data(), wpe, Bn, Tn * C);
    }
    if (sp_) {
      s.emb = reduce_scatter_rows(ctx, *tp_, e, MemTag::activations);
    } else {
      all_reduce_sum(*tp_, e);
      s.emb = std::move(e);
    }
    return s.emb.view();
  }

  void embedding_backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    const std::int64_t Bn = s.tokens.shape()[0];
    const std::int64_t Tn = s.tokens.shape()[1];
    const std::int64_t C = cfg_.dim;
    Tensor<T, B> dyf =
        sp_ ? gather_rows(ctx, *tp_, dy, Shape{Bn, Tn, C}, MemTag::workspace) : dy.view();
    Tensor<T, B> dwpe_rows;  // a sequence shard: the rows' position gradients
    T* dwpe = position_grad_rows(ctx, shard_, wpe_.bound_grad().data(), Tn, C, dwpe_rows);
    Ops<B>::bias_backward(ctx, dwpe, dyf.data(), Bn, Tn * C);
    add_position_grads(ctx, shard_, wpe_.bound_grad().data(), dwpe_rows, Tn, C);
    Ops<B>::vocab_embed_backward(ctx, wte_.bound_grad().data(), dyf.data(), s.tokens.data(),
                                 Bn * Tn, C, vocab_start(), vocab_valid());
  }

  /// This rank's rows of the tied head: its real vocabulary rows of wte.
  VocabSlice<T, B> head_slice() {
    return {wte_.bound_weight().data(), vocab_start(), vocab_valid()};
  }

  float head_forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s, const LossSink* sink) {
    const std::int64_t rows = s.targets.numel();
    const std::int64_t C = cfg_.dim;
    check_ids(s.targets, "target");
    Tensor<T, B> l = ln_f_.forward(ctx, x, s.ln_f);  // (B, T, C); sequence parallel: (B·T/N, C)
    if (sp_ && n_ > 1) s.h = gather_rows(ctx, *tp_, l, Shape{rows, C}, MemTag::activations);
    const T* h = s.h.empty() ? l.data() : s.h.data();
    return vocab_parallel_loss_forward(ctx, *tp_, head_slice(), h, rows, C, s.targets.data(),
                                       s.logits, s.stats, sink);
  }

  Tensor<T, B> head_backward(const Context<B>& ctx, Stash& s, float grad_scale) {
    const std::int64_t rows = s.targets.numel();
    const std::int64_t C = cfg_.dim;
    const T* h = s.h.empty() ? s.ln_f.y.data() : s.h.data();
    // (B·T, C), a partial sum over the group until reduced
    Tensor<T, B> dh = detail::workspace<T, B>(ctx, sp_ ? Shape{rows, C} : s.ln_f.y.shape());
    vocab_parallel_loss_backward(ctx, head_slice(), wte_.bound_grad().data(), h, rows, C,
                                 s.targets.data(), s.logits, s.stats, grad_scale, dh.data());
    s.h.reset();  // the head's stash is done with: freed before the blocks' backward
    s.logits.reset();
    s.stats.reset();
    if (!sp_) {
      all_reduce_sum(*tp_, dh);
      return ln_f_.backward(ctx, dh, s.ln_f);
    }
    Tensor<T, B> dl = reduce_scatter_rows(ctx, *tp_, dh, MemTag::workspace);  // (B·T/N, C)
    dh.reset();
    return layernorm_backward_rows(ctx, *tp_, ln_f_, dl, s.ln_f);
  }

  models::GptConfig cfg_;
  bool sp_;
  ModelPart part_;
  Placement vocab_;      // wte's row of the whole table
  Parameter<T, B> wte_;  // (Vp/N, C) this rank's vocabulary rows
  Parameter<T, B> wpe_;  // (max_seq, C)
  SequenceShard<T, B>* shard_ = nullptr;
  std::vector<Checkpointed<Block>> blocks_;
  LayerNorm<T, B> ln_f_;
};

}  // namespace fourway::tp
