//! A GPT-J-style decoder (Wang & Komatsuzaki 2021) written from docs/guide.md and docs/llama.md
//! alone, the third model of the mesh runtime: each block computes attention and the MLP in
//! parallel from one LayerNorm of its input, y = x + attention(ln(x)) + mlp(ln(x)); attention has
//! rotary position embeddings (Su et al. 2021) and grouped-query heads (Ainslie et al. 2023:
//! `kv_heads` key/value heads shared by groups of query heads); the MLP is GELU; the LM head is
//! untied.
//!
//! ```
//!   wte (Vp/N, C)
//!   h.i: x ─ ln ─┬─ attention: q (C, C), kv (C, 2·KV·hs), rope, causal, out (C, C) ─┐
//!                └─ mlp: fc (C, 4C) ─ gelu ─ proj (4C, C) ──────────────────────────┴─ + x = y
//!   ln_f, lm_head (Vp/N, C)
//! ```
//! The model file holds no tensor-parallel or pipeline code: the units are built from fourway's
//! tensor-parallel-ready layers, which split and join themselves, and `fw::Decoder` cuts and runs
//! them on any mesh.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "fourway/fourway.hpp"

namespace gptj {

namespace fw = fourway;

struct Config {
  std::int64_t vocab = 256;
  std::int64_t dim = 64;      // C
  std::int64_t heads = 8;     // query heads (head size C/heads, even)
  std::int64_t kv_heads = 2;  // key/value heads, each read by heads/kv_heads query heads
  int layers = 4;
  std::int64_t max_seq = 64;
  float rope_theta = 10000.0f;
  bool checkpoint = false;  // recompute each block's activations in backward

  void validate() const {
    fw::check<fw::ConfigError>(
        vocab >= 1 && dim >= 1 && heads >= 1 && kv_heads >= 1 && layers >= 1 && max_seq >= 1,
        "fourway: gptj::Config needs positive vocab, dim, heads, kv_heads, "
        "layers and max_seq");
    fw::check<fw::ConfigError>(dim % heads == 0 && (dim / heads) % 2 == 0 && heads % kv_heads == 0,
                               "fourway: gptj::Config dim=", dim, " must be heads=", heads,
                               " heads of an even size, in groups over kv_heads=", kv_heads);
  }
};

/// wte: token rows, split by vocabulary rows.
template <class T, class B, class Comm>
class Embed : public fw::VocabEmbedding<T, B, Comm> {
 public:
  Embed(const fw::Context<B>& ctx, const Config& cfg, fw::TpGroup<Comm> group, std::uint64_t seed)
      : fw::VocabEmbedding<T, B, Comm>(ctx, "wte", cfg.vocab, cfg.dim, seed, 0.02f, group) {}
};

/// One parallel block: attention and MLP side by side on one LayerNorm of the input.
template <class T, class B, class Comm>
class Block {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = fw::Tensor<T, B>;
  using Norm = fw::ReplicatedNorm<fw::LayerNorm<T, B>, Comm>;
  struct Stash {
    typename Norm::Stash ln;
    typename fw::ParallelAttention<T, B, Comm>::Stash attn;
    typename fw::ColumnLinear<T, B, Comm>::Stash fc;
    typename fw::Gelu<T, B>::Stash gelu;
    typename fw::RowLinear<T, B, Comm>::Stash proj;
    fw::Tensor<T, B> y;  // x + attention + MLP
  };

  Block(const fw::Context<B>& ctx, const Config& cfg, int index, fw::TpGroup<Comm> group,
        std::uint64_t seed)
      : Block(ctx, cfg, "h." + std::to_string(index), group, seed,
              fw::Init::gpt2(seed, cfg.layers).residual_std) {}

  void set_sequence_length(std::int64_t seq) { attn_.set_sequence_length(seq); }
  /// Context parallelism: the attention follows the split sequence (ring, rotary positions).
  void bind_sequence_shard(fw::SequenceShard<T, B>* shard) { attn_.bind_sequence_shard(shard); }

  fw::Tensor<T, B> forward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& x, Stash& s) {
    const fw::Tensor<T, B> h = ln_.forward(ctx, x, s.ln);
    const fw::Tensor<T, B> a = attn_.forward(ctx, h, s.attn);
    const fw::Tensor<T, B> m = proj_.forward(ctx, fc_.forward_gelu(ctx, h, s.fc, s.gelu), s.proj);
    s.y = fw::detail::activation<T, B>(ctx, x.shape());
    fw::Ops<B>::residual_forward(ctx, s.y.data(), x.data(), a.data(), x.numel());
    fw::Ops<B>::residual_forward(ctx, s.y.data(), s.y.data(), m.data(), x.numel());
    return s.y.view();
  }

  fw::Tensor<T, B> backward(const fw::Context<B>& ctx, const fw::Tensor<T, B>& dy, Stash& s) {
    fw::check<fw::ShapeError>(!s.y.empty() && dy.numel() == s.y.numel(),
                              "fourway: gptj::Block backward without a matching forward: dy ",
                              dy.shape().str());
    fw::Tensor<T, B> dh = attn_.backward(ctx, dy, s.attn);
    {
      fw::Tensor<T, B> dg = proj_.backward(ctx, dy, s.proj);
      const fw::Tensor<T, B> du = gelu_.backward(ctx, dg, s.gelu);
      dg.reset();
      const fw::Tensor<T, B> dm = fc_.backward(ctx, du, s.fc);
      fw::Ops<B>::residual_forward(ctx, dh.data(), dh.data(), dm.data(), dh.numel());
    }
    fw::Tensor<T, B> dx = ln_.backward(ctx, dh, s.ln);
    fw::Ops<B>::residual_forward(ctx, dx.data(), dx.data(), dy.data(), dx.numel());
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    ln_.visit_parameters(f);
    attn_.visit_parameters(f);
    fc_.visit_parameters(f);
    proj_.visit_parameters(f);
  }

 private:
  Block(const fw::Context<B>& ctx, const Config& cfg, const std::string& name,
        fw::TpGroup<Comm> group, std::uint64_t seed, float residual)
      : ln_(ctx, name + ".ln_1", cfg.dim, 1e-5f, group),
        attn_(ctx, name + ".attn.q_proj", name + ".attn.kv_proj", name + ".attn.out_proj",
              fw::AttentionSpec{cfg.dim, cfg.heads, true, cfg.rope_theta, seed, 0.02f, residual,
                                cfg.kv_heads},
              group),
        fc_(ctx, name + ".mlp.fc_in", cfg.dim, 4 * cfg.dim, seed, 0.02f, true, group),
        proj_(ctx, name + ".mlp.fc_out", 4 * cfg.dim, cfg.dim, seed, residual, true, group) {}

  Norm ln_;
  fw::ParallelAttention<T, B, Comm> attn_;
  fw::ColumnLinear<T, B, Comm> fc_;
  fw::RowLinear<T, B, Comm> proj_;
  fw::Gelu<T, B> gelu_;
};

/// ln_f and the untied LM head with its cross-entropy.
template <class T, class B, class Comm>
class Head : public fw::NormedVocabHead<fw::LayerNorm<T, B>, Comm> {
 public:
  Head(const fw::Context<B>& ctx, const Config& cfg, fw::TpGroup<Comm> group, std::uint64_t seed)
      : fw::NormedVocabHead<fw::LayerNorm<T, B>, Comm>(ctx, "ln_f", "lm_head", cfg.vocab, cfg.dim,
                                                       1e-5f, seed, 0.02f, group) {}
};

template <class T, class B, class Comm>
using Model = fw::Decoder<Config, Embed, Block, Head, T, B, Comm>;

}  // namespace gptj

template <>
struct fourway::model_family<gptj::Config>
    : fourway::decoder_family<gptj::Config, gptj::Embed, gptj::Block, gptj::Head> {};
