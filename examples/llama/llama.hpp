//! A Llama-style decoder (Touvron et al. 2023) written as a user of fourway would write it:
//! RMSNorm, rotary position embeddings, a SwiGLU MLP and an untied LM head, built from fourway's
//! tensor-parallel-ready layers (layers/parallel_linear.hpp, parallel_attention.hpp,
//! vocab_parallel.hpp, replicated_norm.hpp). Each layer holds its slice, draws its initial values
//! and places its own conjugate operators, so the example writes three unit types (Embed, Block,
//! Head) that say only what follows what: no placement table, no collective, no pipeline code.
//! `fw::Decoder` (train/decoder.hpp) assembles them into the model — the unsplit model (a group of
//! one rank), its tensor-parallel slices (with or without sequence parallelism), and any pipeline
//! chunk of either — and `fw::decoder_family`, one line at the end, is all the mesh runtime needs
//! to train it on any `fw::Mesh<TensorParallel, Pipeline, DataParallel | Sharded>` and check it
//! with `fw::check_mesh`.
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
//! Not built here: grouped-query attention (k and v have as many heads as q; examples/gptj/ has
//! it, `AttentionSpec::kv_heads`); the model is a proof that the mesh runtime is generic, not a
//! Llama checkpoint loader. Built deferred (layers/parameter.hpp) under ZeRO-3, a rank
//! materialises only its shard.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

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

  Block(const fw::Context<B>& ctx, const Config& cfg, int index, fw::TpGroup<Comm> group,
        std::uint64_t seed)
      : Block(ctx, cfg, "layers." + std::to_string(index), group, seed) {}

 private:
  Block(const fw::Context<B>& ctx, const Config& cfg, const std::string& name,
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

 public:
  /// wo and w2: 0.02/sqrt(2L).
  static float residual_std(const Config& cfg) {
    return fw::Init::gpt2(0, cfg.layers).residual_std;
  }
  /// Under sequence parallelism the input holds this rank's rows only: the attention's T.
  void set_sequence_length(std::int64_t seq) { attention_.set_sequence_length(seq); }
  /// Context parallelism: the attention follows the split sequence (ring, rotary positions).
  void bind_sequence_shard(fw::SequenceShard<T, B>* shard) {
    attention_.bind_sequence_shard(shard);
  }

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

/// The embedding unit: tok_embeddings (Vp/N, C), split by vocabulary rows.
template <class T, class B, class Comm>
class Embed : public fw::VocabEmbedding<T, B, Comm> {
 public:
  Embed(const fw::Context<B>& ctx, const Config& cfg, fw::TpGroup<Comm> group, std::uint64_t seed)
      : fw::VocabEmbedding<T, B, Comm>(ctx, "tok_embeddings", cfg.vocab, cfg.dim, seed, 0.02f,
                                       group) {}
};

/// The head unit: the final RMSNorm and the untied output matrix with its cross-entropy.
template <class T, class B, class Comm>
class Head : public fw::NormedVocabHead<fw::RMSNorm<T, B>, Comm> {
 public:
  Head(const fw::Context<B>& ctx, const Config& cfg, fw::TpGroup<Comm> group, std::uint64_t seed)
      : fw::NormedVocabHead<fw::RMSNorm<T, B>, Comm>(ctx, "norm", "output", cfg.vocab, cfg.dim,
                                                     cfg.norm_eps, seed, 0.02f, group) {}
};

/// The model (or a pipeline chunk of it) over a tensor-parallel group: fw::Decoder assembles the
/// units and answers everything the mesh runtime asks (FSDP units, pipeline parts, the placement
/// table read off the layers, the unsplit values for the numerics check).
template <class T, class B, class Comm>
using Model = fw::Decoder<Config, Embed, Block, Head, T, B, Comm>;

}  // namespace llama

/// The mesh runtime's view of the Llama model: a configuration, a builder and the unit list.
template <>
struct fourway::model_family<llama::Config>
    : fourway::decoder_family<llama::Config, llama::Embed, llama::Block, llama::Head> {};
