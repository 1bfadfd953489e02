//! A Llama-style decoder (Touvron et al. 2023) written as a user of fourway would write it:
//! RMSNorm, rotary position embeddings, a SwiGLU MLP and an untied LM head, built from fourway's
//! tensor-parallel-ready layers (layers/parallel_linear.hpp, parallel_attention.hpp,
//! vocab_parallel.hpp, replicated_norm.hpp). Each layer holds its slice, draws its initial values
//! and places its own conjugate operators, so one class is the unsplit model (a group of one
//! rank), its tensor-parallel slices (with or without sequence parallelism), and any pipeline
//! chunk of either, and the model says only what follows what: no placement table, no
//! collective. `fw::model_family<llama::Config>` at the end is all the mesh runtime needs to
//! train it on any `fw::Mesh<TensorParallel, Pipeline, DataParallel | Sharded>` and check it with
//! `fw::check_mesh`.
//!
//! ```
//!   tok_embeddings (Vp/N, C)   VocabEmbedding: masked lookup of this rank's rows, g
//!   layers.i: x ─ attention_norm ─ ParallelAttention: f ─ wqkv (C, 3C/N) ─ rope(q, k) ─ causal
//!             attention of NH/N heads ─ wo (C/N, C) ─ g ─ +x = r
//!             r ─ ffn_norm ─ f ─ w13 (C, 2F/N) ─ SwiGLU ─ w2 (F/N, C) ─ g ─ +r = y
//!   norm, output (Vp/N, C)     VocabHead: untied, vocabulary-parallel cross-entropy
//! ```
//! wqkv is q|k|v and w13 is gate|up side by side (each block split by columns separately), so a
//! rank's columns are whole heads and whole hidden units; no linear has a bias. Parameter names
//! follow Meta's Llama checkpoints with the two fused matrices named wqkv and w13. Initial values
//! are drawn from fourway's (seed, name) stream for the unsplit tensor and sliced, so every split
//! starts from the one-rank model: normal(0, 0.02) for matrices, 0.02/sqrt(2L) for wo and w2,
//! ones for the norms.
//!
//! Not built here: grouped-query attention (k and v have as many heads as q); the model is a
//! proof that the mesh runtime is generic, not a Llama checkpoint loader. Built deferred (layers/
//! parameter.hpp) under ZeRO-3, a rank materialises only its shard.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fourway/fourway.hpp"

namespace llama {

namespace fw = fourway;

struct Config {
  std::int64_t vocab = 256;
  std::int64_t dim = 64;   // C
  std::int64_t heads = 4;  // NH (head size C/NH, even)
  std::int64_t ffn = 176;  // F, the SwiGLU hidden width
  int layers = 4;
  std::int64_t max_seq = 64;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool checkpoint = false;  // recompute each block's activations in backward

  void validate() const {
    fw::check<fw::ConfigError>(
        vocab >= 1 && dim >= 1 && heads >= 1 && ffn >= 1 && layers >= 1 && max_seq >= 1,
        "fourway: llama::Config needs positive vocab, dim, heads, ffn, "
        "layers and max_seq");
    fw::check<fw::ConfigError>(dim % heads == 0 && (dim / heads) % 2 == 0,
                               "fourway: llama::Config dim=", dim, " must be heads=", heads,
                               " heads of an even size (rotary embeddings rotate pairs)");
  }
};

/// One decoder block over a tensor-parallel group of N ranks (N = 1: the unsplit block), built
/// from fourway's tensor-parallel-ready layers: they hold their slices, draw their initial values
/// and place the conjugate operators; the block only says what follows what.
template <class T, class B, class Comm>
class Block {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = fw::Tensor<T, B>;
  using Norm = fw::ReplicatedNorm<fw::RMSNorm<T, B>, Comm>;
  struct Stash {
    typename Norm::Stash attention_norm;
    typename fw::ParallelAttention<T, B, Comm>::Stash attention;
    fw::Tensor<T, B> r;  // x + attention
    typename Norm::Stash ffn_norm;
    typename fw::ColumnLinear<T, B, Comm>::Stash w13;  // y (B, T, 2F/N)
    typename fw::SwiGLU<T, B>::Stash swiglu;
    typename fw::RowLinear<T, B, Comm>::Stash w2;
    fw::Tensor<T, B> y;  // r + MLP
  };

  Block(const fw::Context<B>& ctx, const std::string& name, const Config& cfg,
        fw::TpGroup<Comm> group, std::uint64_t seed)
      : attention_norm_(ctx, name + ".attention_norm", cfg.dim, cfg.norm_eps, group),
        attention_(ctx, name + ".attention.wqkv", name + ".attention.wo",
                   fw::AttentionSpec{cfg.dim, cfg.heads, false, cfg.rope_theta, seed, 0.02f,
                                     residual_std(cfg)},
                   group),
        ffn_norm_(ctx, name + ".ffn_norm", cfg.dim, cfg.norm_eps, group),
        w13_(ctx, name + ".feed_forward.w13", cfg.dim, 2 * cfg.ffn, seed, 0.02f, false, group, 2),
        w2_(ctx, name + ".feed_forward.w2", cfg.ffn, cfg.dim, seed, residual_std(cfg), false,
            group) {}

  /// wo and w2: 0.02/sqrt(2L).
  static float residual_std(const Config& cfg) {
    return 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.layers));
  }
  /// Under sequence parallelism the input holds this rank's rows only: the attention's T.
  void set_sequence_length(std::int64_t seq) { attention_.set_sequence_length(seq); }

  fw::Tensor<T, B> forward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& x, Stash& s) {
    fw::Tensor<T, B> a =
        attention_.forward(ctx, attention_norm_.forward(ctx, x, s.attention_norm), s.attention);
    s.r = fw::detail::activation<T, B>(ctx, x.shape());
    fw::Ops<B>::residual_forward(ctx, s.r.data(), x.data(), a.data(), x.numel());
    fw::Tensor<T, B> u = w13_.forward(ctx, ffn_norm_.forward(ctx, s.r, s.ffn_norm), s.w13);
    fw::Tensor<T, B> m = w2_.forward(ctx, swiglu_.forward(ctx, u, s.swiglu), s.w2);
    s.y = fw::detail::activation<T, B>(ctx, x.shape());
    fw::Ops<B>::residual_forward(ctx, s.y.data(), s.r.data(), m.data(), x.numel());
    return s.y.view();
  }

  fw::Tensor<T, B> backward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& dy, Stash& s) {
    fw::check<fw::ShapeError>(!s.y.empty() && dy.numel() == s.y.numel(),
                              "fourway: llama::Block backward without a matching forward: dy ",
                              dy.shape().str());
    const std::int64_t n = dy.numel();
    fw::Tensor<T, B> dg = w2_.backward(ctx, dy, s.w2);          // (B, T, F/N)
    fw::Tensor<T, B> du = swiglu_.backward(ctx, dg, s.swiglu);  // (B, T, 2F/N)
    dg.reset();
    fw::Tensor<T, B> dh2 = w13_.backward(ctx, du, s.w13);  // the group's sum
    du.reset();
    fw::Tensor<T, B> dr = ffn_norm_.backward(ctx, dh2, s.ffn_norm);
    dh2.reset();
    fw::Ops<B>::residual_forward(ctx, dr.data(), dr.data(), dy.data(), n);
    fw::Tensor<T, B> dh1 = attention_.backward(ctx, dr, s.attention);
    fw::Tensor<T, B> dx = attention_norm_.backward(ctx, dh1, s.attention_norm);
    fw::Ops<B>::residual_forward(ctx, dx.data(), dx.data(), dr.data(), n);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    attention_norm_.visit_parameters(f);
    attention_.visit_parameters(f);
    ffn_norm_.visit_parameters(f);
    w13_.visit_parameters(f);
    w2_.visit_parameters(f);
  }

 private:
  Norm attention_norm_;
  fw::ParallelAttention<T, B, Comm> attention_;  // wqkv (C, 3C/N) column, wo (C/N, C) row
  Norm ffn_norm_;
  fw::ColumnLinear<T, B, Comm> w13_;  // (C, 2F/N): gate|up, each split by columns
  fw::RowLinear<T, B, Comm> w2_;      // (F/N, C)
  fw::SwiGLU<T, B> swiglu_;
};

/// The model (or a pipeline chunk of it, `part`) over a tensor-parallel group: every interface
/// the mesh runtime asks for — `trainable_model` with FSDP units, `pp::pipeline_chunk`,
/// `model_parallel_model`, and the unsplit values for the numerics check. Its placement table
/// is read off the layers' parameters (SlicedModel::read_placements).
template <class T, class B, class Comm>
class Model : public fw::tp::SlicedModel<Comm> {  // counts_in_norm, state_view, gather_over_tp ..
  using base = fw::tp::SlicedModel<Comm>;

 public:
  using value_type = T;
  using backend_type = B;
  using BlockT = Block<T, B, Comm>;

  struct Stash {
    typename fw::VocabEmbedding<T, B, Comm>::Stash embedding;
    std::vector<typename fw::Checkpointed<BlockT>::Stash> blocks;
    typename fw::RMSNorm<T, B>::Stash norm;
    typename fw::VocabHead<T, B, Comm>::Stash head;
    float loss = 0.0f;
  };

  /// This rank's slices of the model (`part`: only those units). With `sequence_parallel` the
  /// residual stream holds this rank's chunk of the B·T rows between the blocks' splits.
  Model(const fw::Context<B>& ctx, const Config& cfg, Comm& tp, std::uint64_t seed = 0,
        fw::models::GptPart part = {}, bool sequence_parallel = false)
      : base(tp), cfg_(cfg), part_(resolved(cfg, part)), group_(tp, sequence_parallel) {
    if (part_.embedding)
      embedding_.emplace(ctx, "tok_embeddings", cfg.vocab, cfg.dim, seed, 0.02f, group_);
    blocks_.reserve(static_cast<std::size_t>(part_.end_block - part_.first_block));
    for (int i = part_.first_block; i < part_.end_block; ++i)
      blocks_.emplace_back(BlockT(ctx, "layers." + std::to_string(i), cfg, group_, seed));
    if (part_.head) {
      norm_.emplace(ctx, "norm", cfg.dim, cfg.norm_eps, group_);
      head_.emplace(ctx, "output", cfg.vocab, cfg.dim, seed, 0.02f, group_);
    }
    this->read_placements(*this);
  }

  [[nodiscard]] const Config& config() const { return cfg_; }
  [[nodiscard]] const fw::models::GptPart& part() const { return part_; }
  void set_checkpointing(bool on) { cfg_.checkpoint = on; }
  [[nodiscard]] int units() const {
    return (part_.embedding ? 1 : 0) + static_cast<int>(blocks_.size()) + (part_.head ? 1 : 0);
  }
  [[nodiscard]] bool sequence_parallel() const { return group_.sequence_parallel(); }
  /// What one unit hands the next: (b, T, C), or this rank's (b·T/N, C) rows under sequence
  /// parallelism.
  [[nodiscard]] fw::Shape boundary_shape(std::int64_t b, std::int64_t Tn) const {
    return sequence_parallel() ? fw::Shape{b * Tn / group_.size(), cfg_.dim}
                               : fw::Shape{b, Tn, cfg_.dim};
  }
  /// The sequence length the blocks run at (a chunk without the embedding cannot read it).
  void set_sequence_length(std::int64_t Tn) {
    for (auto& b : blocks_) b.inner().set_sequence_length(Tn);
  }

  template <class Hooks = fw::NoHooks>
  float forward(const fw::Context<B>& ctx, const fw::Tensor<std::int32_t, B>& tokens,
                const fw::Tensor<std::int32_t, B>& targets, Stash& s, Hooks&& hooks = Hooks{}) {
    return run_forward(ctx, tokens, targets, s, hooks, nullptr);
  }
  /// The same forward with the loss left on the backend (`fw::LossSink`, layers/loss.hpp): the
  /// Trainer's step then makes one synchronising call, as with the GPT.
  template <class Hooks = fw::NoHooks>
  void forward_into(const fw::Context<B>& ctx, const fw::Tensor<std::int32_t, B>& tokens,
                    const fw::Tensor<std::int32_t, B>& targets, Stash& s, const fw::LossSink& sink,
                    Hooks&& hooks = Hooks{}) {
    (void)run_forward(ctx, tokens, targets, s, hooks, &sink);
  }

  template <class Hooks = fw::NoHooks>
  void backward(const fw::Context<B>& ctx, Stash& s, float grad_scale = 1.0f,
                Hooks&& hooks = Hooks{}) {
    hooks.pre_backward(cfg_.layers + 1);
    fw::Tensor<T, B> dx = backward_head(ctx, s, grad_scale);
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

  // ---- one unit at a time (the pipeline executor's interface) ---------------------------------
  fw::Tensor<T, B> forward_embedding(const fw::Context<B>& ctx,
                                     const fw::Tensor<std::int32_t, B>& tokens, Stash& s) {
    fw::check<fw::ShapeError>(tokens.shape().rank() == 2 && tokens.shape()[1] <= cfg_.max_seq,
                              "fourway: llama::Model expects token ids (B, T) with T <= max_seq=",
                              cfg_.max_seq, ", got ", tokens.shape().str());
    set_sequence_length(tokens.shape()[1]);
    return held(embedding_, "the embedding").forward(ctx, tokens, s.embedding);
  }
  fw::Tensor<T, B> forward_block(const fw::Context<B>& ctx, int i, const fw::Tensor<T, B>& x,
                                 Stash& s) {
    if (s.blocks.size() != blocks_.size()) s.blocks.resize(blocks_.size());
    auto& b = blocks_[local(i)];
    auto& bs = s.blocks[local(i)];
    return cfg_.checkpoint ? b.forward(ctx, x, bs) : b.inner().forward(ctx, x, bs.inner);
  }
  float forward_head(const fw::Context<B>& ctx, const fw::Tensor<T, B>& x,
                     const fw::Tensor<std::int32_t, B>& targets, Stash& s,
                     const fw::LossSink* sink = nullptr) {
    const fw::Tensor<T, B> h = held(norm_, "the head").forward(ctx, x, s.norm);
    s.loss = head_->forward(ctx, h, targets, s.head, sink);
    return s.loss;
  }
  fw::Tensor<T, B> backward_head(const fw::Context<B>& ctx, Stash& s, float grad_scale = 1.0f) {
    const fw::Tensor<T, B> dh = held(head_, "the head").backward(ctx, s.head, grad_scale);
    return norm_->backward(ctx, dh, s.norm);
  }
  fw::Tensor<T, B> backward_block(const fw::Context<B>& ctx, int i, const fw::Tensor<T, B>& dy,
                                  Stash& s) {
    auto& b = blocks_[local(i)];
    auto& bs = s.blocks[local(i)];
    return cfg_.checkpoint ? b.backward(ctx, dy, bs) : b.inner().backward(ctx, dy, bs.inner);
  }
  void backward_embedding(const fw::Context<B>& ctx, const fw::Tensor<T, B>& dy, Stash& s) {
    (void)held(embedding_, "the embedding").backward(ctx, dy, s.embedding);
  }

  /// Model order: tok_embeddings, layers.0.* .. layers.{L-1}.*, norm, output.
  template <class F>
  void visit_parameters(F&& f) {
    if (embedding_) embedding_->visit_parameters(f);
    for (auto& b : blocks_) b.visit_parameters(f);
    if (norm_) norm_->visit_parameters(f);
    if (head_) head_->visit_parameters(f);
  }
  /// FSDP units: the embedding, each block, the head (norm and output).
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    fw::check<fw::ConfigError>(u >= 0 && u < units(), "fourway: llama::Model unit ", u,
                               " does not exist; units are 0 .. ", units() - 1);
    const int first = part_.embedding ? 1 : 0;
    if (part_.embedding && u == 0) {
      embedding_->visit_parameters(f);
    } else if (part_.head && u == units() - 1) {
      norm_->visit_parameters(f);
      head_->visit_parameters(f);
    } else {
      blocks_[static_cast<std::size_t>(u - first)].visit_parameters(f);
    }
  }

  // ---- the unsplit values (the rest of what the strategies ask comes from SlicedModel) ------
  std::vector<std::vector<float>> local_parameters(const fw::Context<B>& ctx) {
    std::vector<std::vector<float>> out;
    visit_parameters([&](fw::Parameter<T, B>& p) { out.push_back(fw::parameter_values(ctx, p)); });
    return out;
  }

 private:
  // forward and forward_into: the whole model, the loss read back or left in `sink`
  template <class Hooks>
  float run_forward(const fw::Context<B>& ctx, const fw::Tensor<std::int32_t, B>& tokens,
                    const fw::Tensor<std::int32_t, B>& targets, Stash& s, Hooks& hooks,
                    const fw::LossSink* sink) {
    fw::check<fw::ConfigError>(whole(),
                               "fourway: llama::Model::forward runs the whole model; "
                               "this part holds blocks [",
                               part_.first_block, ", ", part_.end_block, ")");
    hooks.pre_forward(0);
    fw::Tensor<T, B> x = forward_embedding(ctx, tokens, s);
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
  static fw::models::GptPart resolved(const Config& cfg, fw::models::GptPart p) {
    cfg.validate();
    return fw::models::resolve_part(p, cfg.layers, "llama part");
  }
  /// A unit this part may not hold, named when it is missing.
  template <class U>
  static U& held(std::optional<U>& unit, const char* what) {
    fw::check<fw::ConfigError>(unit.has_value(), "fourway: this llama::Model part does not hold ",
                               what);
    return *unit;
  }
  [[nodiscard]] std::size_t local(int i) const {
    fw::check<fw::ConfigError>(i >= part_.first_block && i < part_.end_block,
                               "fourway: llama block ", i, " is not in this part [",
                               part_.first_block, ", ", part_.end_block, ")");
    return static_cast<std::size_t>(i - part_.first_block);
  }

  Config cfg_;
  fw::models::GptPart part_;
  fw::TpGroup<Comm> group_;
  std::optional<fw::VocabEmbedding<T, B, Comm>> embedding_;  // (Vp/N, C)
  std::vector<fw::Checkpointed<BlockT>> blocks_;
  std::optional<fw::ReplicatedNorm<fw::RMSNorm<T, B>, Comm>> norm_;
  std::optional<fw::VocabHead<T, B, Comm>> head_;  // untied output (Vp/N, C)
};

/// Cut costs for the pipeline: a block 4C² + 2CF + 2C, the embedding V·C, the head V·C + C.
inline fw::pp::CutCosts cut_costs(const Config& cfg) {
  const std::int64_t C = cfg.dim;
  return fw::pp::CutCosts{cfg.layers, 4 * C * C + 2 * C * cfg.ffn + 2 * C, cfg.vocab * C,
                          cfg.vocab * C + C};
}

}  // namespace llama

/// The mesh runtime's view of the Llama model: every rank builds `llama::Model` over its
/// tensor-parallel group (a group of one rank without a TensorParallel axis).
template <>
struct fourway::model_family<llama::Config> {
  using config_type = llama::Config;
  template <class T, class B, class Comm, bool TensorParallel>
  using rank_model = llama::Model<T, B, Comm>;
  template <class T, class B, class Comm>
  using one_rank_model = llama::Model<T, B, Comm>;

  template <class M, class B, class Comm>
  static std::unique_ptr<M> make(const Context<B>& ctx, const config_type& cfg, std::uint64_t seed,
                                 Comm& tp, const tp::TpOptions& options,
                                 std::optional<models::GptPart> part, bool loaded) {
    if (!loaded && !part && tp.size() == 1) {  // deferred: a strategy materialises what it owns
      const DeferredInit scope;
      return std::make_unique<M>(ctx, cfg, tp, seed);
    }
    return std::make_unique<M>(ctx, cfg, tp, seed, part.value_or(models::GptPart{}),
                               options.sequence_parallel);
  }
  template <class T, class B, class Comm>
  static std::unique_ptr<llama::Model<T, B, Comm>> make_one_rank(const Context<B>& ctx,
                                                                 const config_type& cfg,
                                                                 std::uint64_t seed, Comm& single) {
    return std::make_unique<llama::Model<T, B, Comm>>(ctx, cfg, single, seed);
  }
  static pp::CutCosts cut_costs(const config_type& cfg) { return llama::cut_costs(cfg); }
};
