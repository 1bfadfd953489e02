//! `fw::Decoder<Config, Embed, Block, Head, T, B, Comm>`: a decoder-only language model assembled
//! from the three unit types its author writes — the embedding, one block, the head with its loss
//! — and everything the mesh runtime asks of a model, written once here: the FSDP units and their
//! hooks, activation checkpointing of the blocks, pipeline chunks (`part`: blocks [first, end),
//! the embedding and/or the head; the executor's one-unit-at-a-time interface), the loss left on
//! the backend (`forward_into`), sequence lengths under sequence parallelism, the placement table
//! read off the layers' parameters (tensor-parallel strategies, checkpoints), and the unsplit
//! values for the numerics check. `fw::decoder_family` makes it a `model_family` in one line:
//!
//! ```cpp
//! template <> struct fw::model_family<my::Config>
//!     : fw::decoder_family<my::Config, my::Embed, my::Block, my::Head> {};
//! ```
//!
//! The unit types are templates <T, B, Comm> built from tensor-parallel-ready layers (docs/
//! layers.md), which place their own conjugate operators, so a unit has no line of tensor-parallel
//! or pipeline code:
//! ```
//!   Embed(ctx, cfg, TpGroup<Comm>, seed)           forward(ctx, tokens (B, T), s) -> x
//!                                                  backward(ctx, dx, s), visit_parameters(f)
//!   Block(ctx, cfg, index, TpGroup<Comm>, seed)    a fw::layer: x -> x; optional
//!                                                  set_sequence_length(T), drop_recomputable(s)
//!   Head(ctx, cfg, TpGroup<Comm>, seed)            forward(ctx, x, targets, s, const LossSink*)
//!                                                  -> mean loss; backward(ctx, s, grad_scale) ->
//!                                                  dx; visit_parameters(f)
//! ```
//! Config needs `layers`, `dim`, `vocab`, `max_seq` and `checkpoint`. A tied LM head (GPT-2's) is
//! not expressed here yet: the head owns its matrix.
//!
//! FSDP units and hook order, as fw::models::Gpt's: unit 0 the embedding, 1..L the blocks, L+1 the
//! head; a part's units are its own, in model order.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/layers/checkpoint.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/model_part.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/sequence_shard.hpp"
#include "fourway/layers/sliced_model.hpp"
#include "fourway/layers/tp_group.hpp"
#include "fourway/layers/tp_options.hpp"
#include "fourway/parallel/pp/partition.hpp"

namespace fourway {

template <class Config, template <class, class, class> class EmbedT,
          template <class, class, class> class BlockT, template <class, class, class> class HeadT,
          floating_dtype T, backend B, communicator Comm>
class Decoder : public tp::SlicedModel<Comm> {  // counts_in_norm, state_view, gather_over_tp
 public:
  using value_type = T;
  using backend_type = B;
  using config_type = Config;
  using Embed = EmbedT<T, B, Comm>;
  using Block = BlockT<T, B, Comm>;
  using Head = HeadT<T, B, Comm>;

  static_assert(
      requires(const Config& c) {
        { c.layers } -> std::convertible_to<int>;
        { c.dim } -> std::convertible_to<std::int64_t>;
        { c.max_seq } -> std::convertible_to<std::int64_t>;
        { c.vocab } -> std::convertible_to<std::int64_t>;
        { c.checkpoint } -> std::convertible_to<bool>;
      },
      "fourway: a Decoder's Config needs layers, dim, vocab, max_seq and checkpoint members "
      "(docs/llama.md, \"What you write\")");
  static_assert(
      std::constructible_from<Embed, const Context<B>&, const Config&, TpGroup<Comm>,
                              std::uint64_t> &&
          requires(Embed & e, const Context<B>& ctx, const Tensor<std::int32_t, B>& ids,
                   const Tensor<T, B>& dx, typename Embed::Stash& s) {
            { e.forward(ctx, ids, s) } -> std::same_as<Tensor<T, B>>;
            e.backward(ctx, dx, s);
            e.visit_parameters(detail::ParameterVisitorArchetype<T, B>{});
          },
      "fourway: a Decoder's Embed unit needs Embed(ctx, cfg, TpGroup<Comm>, seed), a "
      "Stash, forward(ctx, tokens, stash) -> Tensor, backward(ctx, dx, stash) and "
      "visit_parameters(f) (docs/llama.md, \"What you write\")");
  static_assert(std::constructible_from<Block, const Context<B>&, const Config&, int, TpGroup<Comm>,
                                        std::uint64_t> &&
                    activation_layer<Block>,
                "fourway: a Decoder's Block unit needs Block(ctx, cfg, index, TpGroup<Comm>, seed) "
                "and to model fw::activation_layer (value_type, backend_type, Input = Tensor, "
                "Stash, forward, backward, visit_parameters; docs/llama.md, \"What you write\")");
  static_assert(
      std::constructible_from<Head, const Context<B>&, const Config&, TpGroup<Comm>,
                              std::uint64_t> &&
          requires(Head & h, const Context<B>& ctx, const Tensor<T, B>& x,
                   const Tensor<std::int32_t, B>& ids, typename Head::Stash& s,
                   const LossSink* sink) {
            { h.forward(ctx, x, ids, s, sink) } -> std::convertible_to<float>;
            { h.backward(ctx, s, 1.0f) } -> std::same_as<Tensor<T, B>>;
            h.visit_parameters(detail::ParameterVisitorArchetype<T, B>{});
          },
      "fourway: a Decoder's Head unit needs Head(ctx, cfg, TpGroup<Comm>, seed), a "
      "Stash, forward(ctx, x, targets, stash, const LossSink*) -> the mean loss, "
      "backward(ctx, stash, grad_scale) -> dx and visit_parameters(f) (docs/llama.md, "
      "\"What you write\")");

  struct Stash {
    typename Embed::Stash embedding;
    std::vector<typename Checkpointed<Block>::Stash> blocks;
    typename Head::Stash head;
    float loss = 0.0f;  // the head's mean loss; NaN when a LossSink took it
  };

  /// This rank's slices of the model (`part`: only those units) over the tensor-parallel group
  /// `tp` (a group of one: the unsplit model). With `sequence_parallel` the residual stream holds
  /// this rank's chunk of the B·T rows between the blocks' splits.
  Decoder(const Context<B>& ctx, const Config& cfg, Comm& tp, std::uint64_t seed = 0,
          ModelPart part = {}, bool sequence_parallel = false)
      : tp::SlicedModel<Comm>(tp),
        cfg_(cfg),
        part_(resolve_part(part, cfg.layers, "model part")),
        group_(tp, sequence_parallel) {
    if constexpr (requires { cfg.validate(); }) cfg.validate();
    if (part_.embedding) embed_.emplace(ctx, cfg, group_, seed);
    blocks_.reserve(static_cast<std::size_t>(part_.end_block - part_.first_block));
    for (int i = part_.first_block; i < part_.end_block; ++i) {
      blocks_.emplace_back(Block(ctx, cfg, i, group_, seed));
    }
    if (part_.head) head_.emplace(ctx, cfg, group_, seed);
    this->read_placements(*this);
  }

  [[nodiscard]] const Config& config() const { return cfg_; }
  [[nodiscard]] const ModelPart& part() const { return part_; }
  void set_checkpointing(bool on) { cfg_.checkpoint = on; }
  [[nodiscard]] int units() const {
    return (part_.embedding ? 1 : 0) + static_cast<int>(blocks_.size()) + (part_.head ? 1 : 0);
  }
  [[nodiscard]] bool sequence_parallel() const { return group_.sequence_parallel(); }
  /// What one unit hands the next: (b, T, C), or this rank's (b·T/N, C) rows under sequence
  /// parallelism.
  [[nodiscard]] Shape boundary_shape(std::int64_t b, std::int64_t Tn) const {
    const std::int64_t C = cfg_.dim;
    return sequence_parallel() ? Shape{b * Tn / group_.size(), C} : Shape{b, Tn, C};
  }
  /// The sequence length the blocks run at (a chunk without the embedding cannot read it from
  /// token ids; under sequence parallelism its input rows do not show it).
  void set_sequence_length(std::int64_t Tn) {
    for (auto& b : blocks_) {
      if constexpr (requires { b.inner().set_sequence_length(Tn); }) {
        b.inner().set_sequence_length(Tn);
      }
    }
  }

  /// Context parallelism (a ContextParallel mesh binds the strategy's shard): every unit that
  /// follows a split sequence gets `shard` — the blocks (their attention's ring and rotary
  /// positions), and the embedding and head when they have `bind_sequence_shard` (learned
  /// positions would). A Decoder offers this only when its Block does, so a mesh refuses a model
  /// whose attention cannot follow the split (train/mesh_strategy.hpp's static_assert).
  void bind_sequence_shard(SequenceShard<T, B>* shard) requires
      requires(Block& b, SequenceShard<T, B>* p) {
    b.bind_sequence_shard(p);
  }
  {
    if constexpr (requires(Embed & e) { e.bind_sequence_shard(shard); }) {
      if (embed_) embed_->bind_sequence_shard(shard);
    }
    for (auto& b : blocks_) b.inner().bind_sequence_shard(shard);
    if constexpr (requires(Head & h) { h.bind_sequence_shard(shard); }) {
      if (head_) head_->bind_sequence_shard(shard);
    }
  }

  /// Mean cross-entropy of predicting `targets` (B, T) from `tokens` (B, T), read back (one
  /// synchronising call); keeps what backward needs in `s`.
  template <class Hooks = NoHooks>
  float forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                const Tensor<std::int32_t, B>& targets, Stash& s, Hooks&& hooks = Hooks{}) {
    return run_forward(ctx, tokens, targets, s, hooks, nullptr);
  }
  /// The same forward with the loss left on the backend (`LossSink`, layers/layer.hpp): no
  /// synchronising call, as fw::models::Gpt's.
  template <class Hooks = NoHooks>
  void forward_into(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                    const Tensor<std::int32_t, B>& targets, Stash& s, const LossSink& sink,
                    Hooks&& hooks = Hooks{}) {
    (void)run_forward(ctx, tokens, targets, s, hooks, &sink);
  }

  template <class Hooks = NoHooks>
  void backward(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f, Hooks&& hooks = Hooks{}) {
    hooks.pre_backward(cfg_.layers + 1);
    Tensor<T, B> dx = backward_head(ctx, s, grad_scale);
    hooks.post_backward(cfg_.layers + 1);
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

  // ---- one unit at a time (the pipeline executor's interface; forward/backward above are these
  // in order) --------------------------------------------------------------------------------
  Tensor<T, B> forward_embedding(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                                 Stash& s) {
    check<ShapeError>(tokens.shape().rank() == 2 && tokens.shape()[1] <= cfg_.max_seq,
                      "fourway: the model expects token ids (B, T) with T <= max_seq=",
                      cfg_.max_seq, ", got ", tokens.shape().str());
    set_sequence_length(tokens.shape()[1]);
    return held(embed_, "the embedding").forward(ctx, tokens, s.embedding);
  }
  Tensor<T, B> forward_block(const Context<B>& ctx, int i, const Tensor<T, B>& x, Stash& s) {
    if (s.blocks.size() != blocks_.size()) s.blocks.resize(blocks_.size());
    auto& b = blocks_[local(i)];
    auto& bs = s.blocks[local(i)];
    return cfg_.checkpoint ? b.forward(ctx, x, bs) : b.inner().forward(ctx, x, bs.inner);
  }
  float forward_head(const Context<B>& ctx, const Tensor<T, B>& x,
                     const Tensor<std::int32_t, B>& targets, Stash& s,
                     const LossSink* sink = nullptr) {
    s.loss = held(head_, "the head").forward(ctx, x, targets, s.head, sink);
    return s.loss;
  }
  Tensor<T, B> backward_head(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f) {
    return held(head_, "the head").backward(ctx, s.head, grad_scale);
  }
  Tensor<T, B> backward_block(const Context<B>& ctx, int i, const Tensor<T, B>& dy, Stash& s) {
    check<ShapeError>(s.blocks.size() == blocks_.size(), "fourway: block ", i,
                      " backward without its forward");
    auto& b = blocks_[local(i)];
    auto& bs = s.blocks[local(i)];
    return cfg_.checkpoint ? b.backward(ctx, dy, bs) : b.inner().backward(ctx, dy, bs.inner);
  }
  void backward_embedding(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    (void)held(embed_, "the embedding").backward(ctx, dy, s.embedding);
  }

  /// Model order: the embedding, the blocks, the head.
  template <class F>
  void visit_parameters(F&& f) {
    if (embed_) embed_->visit_parameters(f);
    for (auto& b : blocks_) b.visit_parameters(f);
    if (head_) head_->visit_parameters(f);
  }
  /// FSDP units: the embedding, each block, the head (a part's own, in model order).
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    check<ConfigError>(u >= 0 && u < units(), "fourway: model unit ", u,
                       " does not exist; units are 0 .. ", units() - 1);
    const int first = part_.embedding ? 1 : 0;
    if (part_.embedding && u == 0) {
      embed_->visit_parameters(f);
    } else if (part_.head && u == units() - 1) {
      head_->visit_parameters(f);
    } else {
      blocks_[static_cast<std::size_t>(u - first)].visit_parameters(f);
    }
  }

  /// This rank's parameter values (as float), in `visit_parameters` order (the numerics check
  /// gathers them over the group with `gather_over_tp`).
  std::vector<std::vector<float>> local_parameters(const Context<B>& ctx) {
    std::vector<std::vector<float>> out;
    visit_parameters([&](Parameter<T, B>& p) { out.push_back(parameter_values(ctx, p)); });
    return out;
  }

 private:
  template <class Hooks>
  float run_forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                    const Tensor<std::int32_t, B>& targets, Stash& s, Hooks& hooks,
                    const LossSink* sink) {
    check<ConfigError>(whole(), "fourway: forward runs the whole model; this part holds blocks [",
                       part_.first_block, ", ", part_.end_block,
                       "): run it with forward_embedding / forward_block / forward_head");
    hooks.pre_forward(0);
    Tensor<T, B> x = forward_embedding(ctx, tokens, s);
    hooks.post_forward(0);
    for (int i = 0; i < cfg_.layers; ++i) {
      hooks.pre_forward(i + 1);
      x = forward_block(ctx, i, x, s);
      hooks.post_forward(i + 1);
    }
    hooks.pre_forward(cfg_.layers + 1);
    forward_head(ctx, x, targets, s, sink);
    hooks.post_forward(cfg_.layers + 1);
    return s.loss;
  }

  [[nodiscard]] bool whole() const {
    return part_.embedding && part_.head && part_.first_block == 0 &&
           part_.end_block == cfg_.layers;
  }
  /// A unit this part may not hold, named when it is missing.
  template <class U>
  static U& held(std::optional<U>& unit, const char* what) {
    check<ConfigError>(unit.has_value(), "fourway: this model part does not hold ", what);
    return *unit;
  }
  [[nodiscard]] std::size_t local(int i) const {
    check<ConfigError>(i >= part_.first_block && i < part_.end_block, "fourway: block ", i,
                       " is not in this part, which holds blocks [", part_.first_block, ", ",
                       part_.end_block, ")");
    return static_cast<std::size_t>(i - part_.first_block);
  }

  Config cfg_;
  ModelPart part_;
  TpGroup<Comm> group_;
  std::optional<Embed> embed_;
  std::vector<Checkpointed<Block>> blocks_;
  std::optional<Head> head_;
};

/// What a pipeline balances for a decoder: each unit's parameter count, counted on units built
/// deferred (no storage) in a group of one rank.
template <class Config, template <class, class, class> class EmbedT,
          template <class, class, class> class BlockT, template <class, class, class> class HeadT>
pp::CutCosts decoder_cut_costs(const Config& cfg) {
  MemoryAccountant memory;
  const Context<Host> ctx(memory);
  const DeferredInit describe_only;
  const auto count = [](auto&& unit) {
    std::int64_t n = 0;
    unit.visit_parameters([&](auto& p) { n += p.logical_numel(); });
    return n;
  };
  const TpGroup<> one;
  return pp::CutCosts{cfg.layers, count(BlockT<float, Host, Alone>(ctx, cfg, 0, one, 0)),
                      count(EmbedT<float, Host, Alone>(ctx, cfg, one, 0)),
                      count(HeadT<float, Host, Alone>(ctx, cfg, one, 0))};
}

/// `model_family<Config>` of a `Decoder` (train/model_family.hpp): every rank holds the decoder
/// over its tensor-parallel group; without a tensor-parallel axis, a pipeline part or a loader it
/// is built deferred, so a ZeRO-3 rank materialises only its shard.
template <class Config, template <class, class, class> class EmbedT,
          template <class, class, class> class BlockT, template <class, class, class> class HeadT>
struct decoder_family {
  using config_type = Config;
  template <class T, class B, class Comm>
  using model = Decoder<Config, EmbedT, BlockT, HeadT, T, B, Comm>;
  template <class T, class B, class Comm, bool TensorParallel>
  using rank_model = model<T, B, Comm>;
  template <class T, class B, class Comm>
  using one_rank_model = model<T, B, Comm>;

  template <class M, class B, class Comm>
  static std::unique_ptr<M> make(const Context<B>& ctx, const config_type& cfg, std::uint64_t seed,
                                 Comm& tp, const tp::TpOptions& options,
                                 std::optional<ModelPart> part, bool loaded) {
    if (!loaded && !part && tp.size() == 1) {  // deferred: a strategy materialises what it owns
      const DeferredInit scope;
      return std::make_unique<M>(ctx, cfg, tp, seed);
    }
    return std::make_unique<M>(ctx, cfg, tp, seed, part.value_or(ModelPart{}),
                               options.sequence_parallel);
  }
  template <class T, class B, class Comm>
  static std::unique_ptr<model<T, B, Comm>> make_one_rank(const Context<B>& ctx,
                                                          const config_type& cfg,
                                                          std::uint64_t seed, Comm& single) {
    return std::make_unique<model<T, B, Comm>>(ctx, cfg, single, seed);
  }
  static pp::CutCosts cut_costs(const config_type& cfg) {
    return decoder_cut_costs<Config, EmbedT, BlockT, HeadT>(cfg);
  }
};

}  // namespace fourway
