//! A Llama-style decoder (Touvron et al. 2023) written as a user of fourway would write it:
//! RMSNorm, rotary position embeddings, a SwiGLU MLP and an untied LM head, built from fourway's
//! layers (which know nothing of parallelism) and joined by the tensor-parallel conjugate operators
//! (parallel/tp/conjugate.hpp), so that one class is the unsplit model (a group of one rank), its
//! tensor-parallel slices, and any pipeline chunk of either. `fw::model_family<llama::Config>`
//! at the end is all the mesh runtime needs to train it on any
//! `fw::Mesh<TensorParallel, Pipeline, DataParallel | Sharded>` and check it with `fw::check_mesh`.
//!
//! ```
//!   tok_embeddings (Vp/N, C)   vocab split: masked lookup of this rank's rows + all-reduce
//!   layers.i: x ─ attention_norm ─ f ─ wqkv (C, 3C/N) ─ rope(q, k) ─ causal attention of NH/N
//!             heads ─ wo (C/N, C) ─ g ─ +x = r
//!             r ─ ffn_norm ─ f ─ w13 (C, 2F/N) ─ SwiGLU ─ w2 (F/N, C) ─ g ─ +r = y
//!   norm, output (Vp/N, C)     untied head, vocabulary-parallel cross-entropy (tp/vocab_head.hpp)
//! ```
//! wqkv is q|k|v and w13 is gate|up side by side (each block split by columns separately), so a
//! rank's columns are whole heads and whole hidden units; no linear has a bias. Parameter names
//! follow Meta's Llama checkpoints with the two fused matrices named wqkv and w13. Initial values
//! are drawn from fourway's (seed, name) stream for the unsplit tensor and sliced, so every split
//! starts from the one-rank model: normal(0, 0.02) for matrices, 0.02/sqrt(2L) for wo and w2,
//! ones for the norms.
//!
//! Not built here: sequence parallelism and grouped-query attention (k and v have as many heads
//! as q); the model is a proof that the mesh runtime is generic, not a Llama checkpoint loader.
//! The unsplit model (a group of one rank) takes init rules, so it can be built deferred (layers/
//! parameter.hpp): under ZeRO-3 a rank then materialises only its shard. Tensor-parallel slices
//! are built eagerly (each rank holds only its slices anyway).
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

/// The placement table of the model split over `n` ranks, in `visit_parameters` order.
inline std::vector<fw::tp::Placement> placement_table(const Config& cfg, int n) {
  cfg.validate();
  fw::tp::check_heads_split(cfg.dim, cfg.heads, n);
  fw::check<fw::ConfigError>(cfg.ffn % n == 0, "fourway: llama ffn=", cfg.ffn,
                             " must split over tp=", n, " ranks; pick an ffn divisible by ", n);
  const std::int64_t C = cfg.dim;
  const float residual = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.layers));
  std::vector<fw::tp::Placement> t;
  auto add = [&](std::string name, fw::tp::Split split, std::int64_t rows, std::int64_t cols,
                 int parts, fw::tp::InitRule rule) {
    fw::tp::Placement p;
    p.name = std::move(name);
    p.split = split;
    p.rows = rows;
    p.cols = cols;
    p.parts = parts;
    p.padded_rows = split == fw::tp::Split::vocab ? fw::tp::padded_vocab(rows, n, 1) : rows;
    p.matrix = rows > 1;
    p.init = rule;
    t.push_back(std::move(p));
  };
  using fw::tp::Split;
  const fw::tp::InitRule normal{true, 0.02f};
  const fw::tp::InitRule one{false, 1.0f};
  add("tok_embeddings.weight", Split::vocab, cfg.vocab, C, 1, normal);
  for (int i = 0; i < cfg.layers; ++i) {
    const std::string l = "layers." + std::to_string(i);
    add(l + ".attention_norm.weight", Split::replicated, 1, C, 1, one);
    add(l + ".attention.wqkv.weight", Split::column, C, 3 * C, 3, normal);
    add(l + ".attention.wo.weight", Split::row, C, C, 1, {true, residual});
    add(l + ".ffn_norm.weight", Split::replicated, 1, C, 1, one);
    add(l + ".feed_forward.w13.weight", Split::column, C, 2 * cfg.ffn, 2, normal);
    add(l + ".feed_forward.w2.weight", Split::row, cfg.ffn, C, 1, {true, residual});
  }
  add("norm.weight", Split::replicated, 1, C, 1, one);
  add("output.weight", Split::vocab, cfg.vocab, C, 1, normal);
  return t;
}

/// One decoder block over a tensor-parallel group of N ranks (N = 1: the unsplit block).
template <class T, class B, class Comm>
class Block {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = fw::Tensor<T, B>;
  struct Stash {
    typename fw::RMSNorm<T, B>::Stash attention_norm;
    typename fw::Linear<T, B>::Stash wqkv;  // y = this rank's rotated q|k|v (B, T, 3C/N)
    fw::Tensor<float, B> lse;               // (B, NH/N, T)
    fw::Tensor<T, B> heads;                 // (B, T, C/N)
    typename fw::Linear<T, B>::Stash wo;    // y = the attention output, reduced in place
    fw::Tensor<T, B> r;                     // x + attention
    typename fw::RMSNorm<T, B>::Stash ffn_norm;
    typename fw::Linear<T, B>::Stash w13;  // y (B, T, 2F/N)
    typename fw::SwiGLU<T, B>::Stash swiglu;
    typename fw::Linear<T, B>::Stash w2;  // y = the MLP output, reduced in place
    fw::Tensor<T, B> y;                   // r + MLP
  };

  Block(const fw::Context<B>& ctx, const std::string& name, const Config& cfg, Comm& tp)
      : C_(cfg.dim),
        n_(tp.size()),
        NH_(cfg.heads / n_),
        F_(cfg.ffn / n_),
        tp_(&tp),
        attention_norm_(ctx, name + ".attention_norm", cfg.dim, cfg.norm_eps),
        wqkv_(ctx, name + ".attention.wqkv", C_, 3 * C_ / n_, 0, 0.02f, false),
        wo_(ctx, name + ".attention.wo", C_ / n_, C_, 0, 0.02f, false),
        ffn_norm_(ctx, name + ".ffn_norm", cfg.dim, cfg.norm_eps),
        w13_(ctx, name + ".feed_forward.w13", C_, 2 * F_, 0, 0.02f, false),
        w2_(ctx, name + ".feed_forward.w2", F_, C_, 0, 0.02f, false),
        rotary_(cfg.dim / cfg.heads, cfg.rope_theta) {}

  fw::Tensor<T, B> forward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& x, Stash& s) {
    fw::check<fw::ShapeError>(x.shape().rank() == 3 && x.shape()[2] == C_,
                              "fourway: llama::Block expects (B, T, ", C_, "), got ",
                              x.shape().str());
    const std::int64_t Bn = x.shape()[0], Tn = x.shape()[1];
    const std::int64_t hs = C_ / (NH_ * n_);
    // attention: (B, T, 3C/N) = (B, T, C)·(C, 3C/N), q and k rotated in place
    fw::Tensor<T, B> qkv =
        wqkv_.forward(ctx, attention_norm_.forward(ctx, x, s.attention_norm), s.wqkv);
    rotary_.forward(ctx, s.wqkv.y, Tn, 3 * NH_ * hs, 2 * NH_);
    s.lse = fw::detail::activation<float, B>(ctx, fw::Shape{Bn, NH_, Tn});
    s.heads = fw::detail::activation<T, B>(ctx, fw::Shape{Bn, Tn, NH_ * hs});
    fw::Ops<B>::flash_attention_forward(ctx, s.heads.data(), s.lse.data(), qkv.data(), Bn, Tn,
                                        NH_ * hs, NH_);
    fw::Tensor<T, B> a = wo_.forward(ctx, s.heads, s.wo);  // partial sum over the group
    fw::tp::all_reduce_sum(*tp_, s.wo.y);                  // g
    s.r = fw::detail::activation<T, B>(ctx, x.shape());
    fw::Ops<B>::residual_forward(ctx, s.r.data(), x.data(), a.data(), x.numel());
    // MLP: (B, T, F/N) = SwiGLU((B, T, C)·(C, 2F/N)), then (B, T, C) = Σ (B, T, F/N)·(F/N, C)
    fw::Tensor<T, B> u = w13_.forward(ctx, ffn_norm_.forward(ctx, s.r, s.ffn_norm), s.w13);
    fw::Tensor<T, B> m = w2_.forward(ctx, swiglu_.forward(ctx, u, s.swiglu), s.w2);
    fw::tp::all_reduce_sum(*tp_, s.w2.y);  // g
    s.y = fw::detail::activation<T, B>(ctx, x.shape());
    fw::Ops<B>::residual_forward(ctx, s.y.data(), s.r.data(), m.data(), x.numel());
    return s.y.view();
  }

  fw::Tensor<T, B> backward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& dy, Stash& s) {
    fw::check<fw::ShapeError>(!s.y.empty() && dy.numel() == s.y.numel(),
                              "fourway: llama::Block backward without a matching forward: dy ",
                              dy.shape().str());
    const std::int64_t n = dy.numel();
    const std::int64_t Bn = s.lse.shape()[0], Tn = s.lse.shape()[2];
    const std::int64_t hs = C_ / (NH_ * n_);
    fw::Tensor<T, B> dg = w2_.backward(ctx, dy, s.w2);          // (B, T, F/N); g backward: identity
    fw::Tensor<T, B> du = swiglu_.backward(ctx, dg, s.swiglu);  // (B, T, 2F/N)
    dg.reset();
    fw::Tensor<T, B> dh2 = w13_.backward(ctx, du, s.w13);  // partial sum; f backward: all-reduce
    du.reset();
    fw::tp::all_reduce_sum(*tp_, dh2);
    fw::Tensor<T, B> dr = ffn_norm_.backward(ctx, dh2, s.ffn_norm);
    dh2.reset();
    fw::Ops<B>::residual_forward(ctx, dr.data(), dr.data(), dy.data(), n);

    fw::Tensor<T, B> dheads = wo_.backward(ctx, dr, s.wo);  // (B, T, C/N)
    fw::Tensor<T, B> dqkv = fw::detail::workspace<T, B>(ctx, fw::Shape{Bn, Tn, 3 * NH_ * hs});
    {
      fw::Tensor<float, B> delta = fw::detail::workspace<float, B>(ctx, s.lse.shape());
      fw::Ops<B>::flash_attention_backward(ctx, dqkv.data(), delta.data(), dheads.data(),
                                           s.wqkv.y.data(), s.heads.data(), s.lse.data(), Bn, Tn,
                                           NH_ * hs, NH_);
    }
    dheads.reset();
    rotary_.backward(ctx, dqkv, Tn, 3 * NH_ * hs, 2 * NH_);  // to the unrotated q and k
    fw::Tensor<T, B> dh1 = wqkv_.backward(ctx, dqkv, s.wqkv);
    dqkv.reset();
    fw::tp::all_reduce_sum(*tp_, dh1);
    fw::Tensor<T, B> dx = attention_norm_.backward(ctx, dh1, s.attention_norm);
    fw::Ops<B>::residual_forward(ctx, dx.data(), dx.data(), dr.data(), n);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    attention_norm_.visit_parameters(f);
    f(wqkv_.weight());
    f(wo_.weight());
    ffn_norm_.visit_parameters(f);
    f(w13_.weight());
    f(w2_.weight());
  }

 private:
  std::int64_t C_;
  int n_;
  std::int64_t NH_;  // heads on this rank
  std::int64_t F_;   // hidden units on this rank
  Comm* tp_;
  fw::RMSNorm<T, B> attention_norm_;
  fw::Linear<T, B> wqkv_;  // (C, 3C/N)  column
  fw::Linear<T, B> wo_;    // (C/N, C)   row
  fw::RMSNorm<T, B> ffn_norm_;
  fw::Linear<T, B> w13_;  // (C, 2F/N)   column
  fw::Linear<T, B> w2_;   // (F/N, C)    row
  fw::SwiGLU<T, B> swiglu_;
  fw::Rotary<T, B> rotary_;
};

/// The model (or a pipeline chunk of it, `part`) over a tensor-parallel group: every interface
/// the mesh runtime asks for — `trainable_model` with FSDP units, `pp::pipeline_chunk`,
/// `model_parallel_model`, and the unsplit values for the numerics check.
template <class T, class B, class Comm>
class Model : public fw::tp::SlicedModel<Comm> {  // counts_in_norm, state_view, gather_over_tp ..
  using base = fw::tp::SlicedModel<Comm>;
  using base::n_;
  using base::rank_;
  using base::table_;
  using base::tp_;

 public:
  using value_type = T;
  using backend_type = B;
  using BlockT = Block<T, B, Comm>;

  struct Stash {
    fw::Tensor<std::int32_t, B> tokens;   // view (B, T)
    fw::Tensor<std::int32_t, B> targets;  // view (B, T)
    fw::Tensor<T, B> emb;                 // (B, T, C)
    std::vector<typename fw::Checkpointed<BlockT>::Stash> blocks;
    typename fw::RMSNorm<T, B>::Stash norm;
    fw::Tensor<T, B> logits;     // (B·T, Vv) this rank's vocabulary columns
    fw::Tensor<float, B> stats;  // (3, B·T)
    float loss = 0.0f;
  };

  Model(const fw::Context<B>& ctx, const Config& cfg, Comm& tp, std::uint64_t seed = 0,
        fw::models::GptPart part = {})
      : base(tp, held(resolved(cfg, part), placement_table(cfg, tp.size()))),
        cfg_(cfg),
        part_(resolved(cfg, part)),
        norm_(ctx, "norm", part_.head ? cfg.dim : 1, cfg.norm_eps) {
    const std::int64_t Vp = fw::tp::padded_vocab(cfg.vocab, n_, 1);
    embed_ = fw::Parameter<T, B>(ctx, "tok_embeddings.weight",
                                 part_.embedding ? fw::Shape{Vp / n_, cfg.dim} : fw::Shape{1, 1});
    output_ = fw::Parameter<T, B>(ctx, "output.weight",
                                  part_.head ? fw::Shape{Vp / n_, cfg.dim} : fw::Shape{1, 1});
    blocks_.reserve(static_cast<std::size_t>(part_.end_block - part_.first_block));
    for (int i = part_.first_block; i < part_.end_block; ++i)
      blocks_.emplace_back(BlockT(ctx, "layers." + std::to_string(i), cfg, tp));
    if (n_ == 1) {  // the unsplit tensors: their init rules (deferred construction keeps them)
      std::size_t i = 0;
      visit_parameters([&](fw::Parameter<T, B>& p) {
        const fw::tp::InitRule rule = table_[i++].init;
        if (rule.normal) {
          fw::init_normal(ctx, p, seed, rule.value);
        } else {
          fw::init_constant(ctx, p, rule.value);
        }
      });
    } else {  // slices of the unsplit tensors
      fw::check<fw::ConfigError>(!fw::DeferredInit::active(),
                                 "fourway: llama::Model builds tensor-parallel slices (tp=", n_,
                                 ") eagerly; construct it outside a DeferredInit scope");
      fw::tp::load_slices(ctx, *this, table_, n_, rank_,
                          [&](const fw::tp::Placement& p, std::int64_t first, std::int64_t count,
                              float* out) { fw::tp::initial_values(p, seed, first, count, out); });
    }
  }

  [[nodiscard]] const Config& config() const { return cfg_; }
  [[nodiscard]] const fw::models::GptPart& part() const { return part_; }
  void set_checkpointing(bool on) { cfg_.checkpoint = on; }
  [[nodiscard]] int units() const {
    return (part_.embedding ? 1 : 0) + static_cast<int>(blocks_.size()) + (part_.head ? 1 : 0);
  }
  [[nodiscard]] fw::Shape boundary_shape(std::int64_t b, std::int64_t Tn) const {
    return fw::Shape{b, Tn, cfg_.dim};
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
    check_ids(tokens, "token");
    const std::int64_t rows = tokens.numel();
    s.tokens = tokens.view();
    s.emb = fw::detail::activation<T, B>(
        ctx, fw::Shape{tokens.shape()[0], tokens.shape()[1], cfg_.dim});  // partial sum
    fw::Ops<B>::vocab_embed_forward(ctx, s.emb.data(), tokens.data(), embed_.bound_weight().data(),
                                    rows, cfg_.dim, vocab_start(), vocab_valid());
    fw::tp::all_reduce_sum(*tp_, s.emb);
    return s.emb.view();
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
    fw::check<fw::ShapeError>(targets.numel() * cfg_.dim == x.numel(),
                              "fourway: llama::Model head got x ", x.shape().str(), " for targets ",
                              targets.shape().str());
    check_ids(targets, "target");
    s.targets = targets.view();
    fw::Tensor<T, B> h = norm_.forward(ctx, x, s.norm);
    s.loss = fw::tp::vocab_parallel_loss_forward(ctx, *tp_, head_slice(), h.data(), targets.numel(),
                                                 cfg_.dim, targets.data(), s.logits, s.stats, sink);
    return s.loss;
  }
  fw::Tensor<T, B> backward_head(const fw::Context<B>& ctx, Stash& s, float grad_scale = 1.0f) {
    fw::check<fw::ShapeError>(!s.stats.empty(),
                              "fourway: llama::Model head backward without "
                              "its forward");
    const std::int64_t rows = s.targets.numel();
    fw::Tensor<T, B> dh = fw::detail::workspace<T, B>(ctx, s.norm.y.shape());
    fw::tp::vocab_parallel_loss_backward(ctx, head_slice(), output_.bound_grad().data(),
                                         s.norm.y.data(), rows, cfg_.dim, s.targets.data(),
                                         s.logits, s.stats, grad_scale, dh.data());
    fw::tp::all_reduce_sum(*tp_, dh);
    return norm_.backward(ctx, dh, s.norm);
  }
  fw::Tensor<T, B> backward_block(const fw::Context<B>& ctx, int i, const fw::Tensor<T, B>& dy,
                                  Stash& s) {
    auto& b = blocks_[local(i)];
    auto& bs = s.blocks[local(i)];
    return cfg_.checkpoint ? b.backward(ctx, dy, bs) : b.inner().backward(ctx, dy, bs.inner);
  }
  void backward_embedding(const fw::Context<B>& ctx, const fw::Tensor<T, B>& dy, Stash& s) {
    fw::Ops<B>::vocab_embed_backward(ctx, embed_.bound_grad().data(), dy.data(), s.tokens.data(),
                                     s.tokens.numel(), cfg_.dim, vocab_start(), vocab_valid());
  }

  /// Model order: tok_embeddings, layers.0.* .. layers.{L-1}.*, norm, output.
  template <class F>
  void visit_parameters(F&& f) {
    if (part_.embedding) f(embed_);
    for (auto& b : blocks_) b.visit_parameters(f);
    if (part_.head) {
      norm_.visit_parameters(f);
      f(output_);
    }
  }
  /// FSDP units: the embedding, each block, the head (norm and output).
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    fw::check<fw::ConfigError>(u >= 0 && u < units(), "fourway: llama::Model unit ", u,
                               " does not exist; units are 0 .. ", units() - 1);
    const int first = part_.embedding ? 1 : 0;
    if (part_.embedding && u == 0) {
      f(embed_);
    } else if (part_.head && u == units() - 1) {
      norm_.visit_parameters(f);
      f(output_);
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
  /// The rows of the whole table `part` holds.
  static std::vector<fw::tp::Placement> held(const fw::models::GptPart& part,
                                             std::vector<fw::tp::Placement> all) {
    std::vector<fw::tp::Placement> out;
    for (auto& p : all) {
      bool keep = false;
      if (p.name.starts_with("layers.")) {
        const int b = std::stoi(p.name.substr(7));
        keep = b >= part.first_block && b < part.end_block;
      } else {
        keep = p.name.starts_with("tok_embeddings") ? part.embedding : part.head;
      }
      if (keep) out.push_back(std::move(p));
    }
    return out;
  }
  [[nodiscard]] std::size_t local(int i) const {
    fw::check<fw::ConfigError>(i >= part_.first_block && i < part_.end_block,
                               "fourway: llama block ", i, " is not in this part [",
                               part_.first_block, ", ", part_.end_block, ")");
    return static_cast<std::size_t>(i - part_.first_block);
  }
  [[nodiscard]] std::int64_t vocab_rows() const {
    return fw::tp::padded_vocab(cfg_.vocab, n_, 1) / n_;
  }
  [[nodiscard]] std::int64_t vocab_start() const { return rank_ * vocab_rows(); }
  [[nodiscard]] std::int64_t vocab_valid() const {
    return std::clamp<std::int64_t>(cfg_.vocab - vocab_start(), 0, vocab_rows());
  }
  fw::tp::VocabSlice<T, B> head_slice() {
    return {output_.bound_weight().data(), vocab_start(), vocab_valid()};
  }
  void check_ids(const fw::Tensor<std::int32_t, B>& ids, const char* what) const {
    if constexpr (!B::on_device) {
      for (std::int64_t i = 0; i < ids.numel(); ++i)
        fw::check<fw::ShapeError>(ids[i] >= 0 && ids[i] < cfg_.vocab, "fourway: llama ", what,
                                  " id ", ids[i], " at position ", i,
                                  " is outside the vocabulary [0, ", cfg_.vocab, ")");
    }
  }

  Config cfg_;
  fw::models::GptPart part_;
  fw::RMSNorm<T, B> norm_;
  fw::Parameter<T, B> embed_;  // (Vp/N, C)
  std::vector<fw::Checkpointed<BlockT>> blocks_;
  fw::Parameter<T, B> output_;  // (Vp/N, C)
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
    check<ConfigError>(!options.sequence_parallel,
                       "fourway: the llama example has no sequence parallelism; drop the option");
    if (!loaded && !part && tp.size() == 1) {  // deferred: a strategy materialises what it owns
      const DeferredInit scope;
      return std::make_unique<M>(ctx, cfg, tp, seed);
    }
    return std::make_unique<M>(ctx, cfg, tp, seed, part.value_or(models::GptPart{}));
  }
  template <class T, class B, class Comm>
  static std::unique_ptr<llama::Model<T, B, Comm>> make_one_rank(const Context<B>& ctx,
                                                                 const config_type& cfg,
                                                                 std::uint64_t seed, Comm& single) {
    return std::make_unique<llama::Model<T, B, Comm>>(ctx, cfg, single, seed);
  }
  static pp::CutCosts cut_costs(const config_type& cfg) { return llama::cut_costs(cfg); }
};
