//! `ParallelAttention<T, B, Comm>`: causal multi-head self-attention split by heads over a
//! `TpGroup` (Megatron-LM's attention): q|k|v is a `ColumnLinear` of 3 parts, so a rank holds
//! NH/N whole heads of each; optional rotary position embeddings turn q and k in place; the
//! flash-style core (layers/attention.hpp `attention_core`) runs on this rank's heads; the
//! output projection is a `RowLinear`, whose g joins the group:
//! ```
//!   x (B, T, C) ─ f ─ qkv (C, 3C/N) ─ [rope(q, k)] ─ attention of NH/N heads ─ out (C/N, C) ─ g
//! ```
//! Under sequence parallelism x and the output are this rank's chunk (B·T/N, C) of the rows and
//! f and g gather and reduce-scatter them; the sequence length then cannot be read off x and
//! comes from `set_sequence_length`. In a group of one rank this is the unsplit attention.
//! The stash keeps the q|k|v projection (rotated), the heads' output and each query row's fp32
//! log-sum-exp; backward recomputes the probabilities tile by tile. Selective recomputation
//! (`drop_recomputable`) frees the heads' output and log-sum-exp after forward.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "fourway/layers/attention.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/parallel_linear.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/rotary.hpp"
#include "fourway/layers/tp_group.hpp"

namespace fourway {

/// The shape and parameters of a `ParallelAttention`.
struct AttentionSpec {
  std::int64_t dim = 0;    // C
  std::int64_t heads = 0;  // NH (head size C/NH)
  bool bias = true;        // biases on the q|k|v and output projections
  /// Rotary position embeddings of q and k with this base (Su et al. 2021); none: positions
  /// come from elsewhere (a learned position embedding).
  std::optional<float> rope_theta{};
  std::uint64_t seed = 0;
  float init_std = 0.02f;    // q|k|v weights: normal(0, init_std)
  float output_std = 0.02f;  // the output projection (GPT-2: 0.02/sqrt(2·layers))
};

template <floating_dtype T, backend B, class Comm = Alone>
class ParallelAttention {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    typename ColumnLinear<T, B, Comm>::Stash qkv;  // linear.y = this rank's q|k|v (B, T, 3C/N)
    Tensor<float, B> lse;                          // (B, NH/N, T)
    Tensor<T, B> heads;                            // (B, T, C/N)
    typename RowLinear<T, B, Comm>::Stash out;
    std::int64_t seq = 0;  // T
  };

  /// Parameters "<qkv_name>.{weight,bias}" (C, 3C/N) and "<out_name>.{weight,bias}" (C/N, C).
  ParallelAttention(const Context<B>& ctx, const std::string& qkv_name, const std::string& out_name,
                    const AttentionSpec& spec, TpGroup<Comm> group = {})
      : C_(checked(spec, group.size(), qkv_name)),
        NH_(spec.heads / group.size()),
        hs_(spec.dim / spec.heads),
        qkv_(ctx, qkv_name, spec.dim, 3 * spec.dim, spec.seed, spec.init_std, spec.bias, group, 3),
        out_(ctx, out_name, spec.dim, spec.dim, spec.seed, spec.output_std, spec.bias, group) {
    if (spec.rope_theta) rotary_.emplace(hs_, *spec.rope_theta);
  }

  /// The sequence length of the next forward under sequence parallelism (the input holds this
  /// rank's B·T/N rows, so T cannot be read off it); otherwise read from x (B, T, C).
  void set_sequence_length(std::int64_t seq) { T_ = seq; }
  /// Context parallelism: the rows are the shard's part of each sequence and the attention its
  /// ring (null: whole sequences). Rotary positions follow the row index, so a shard refuses a
  /// rotary attention. Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) {
    check<ConfigError>(shard == nullptr || !rotary_, "fourway: rotary attention under context ",
                       "parallelism needs each row's position in the sequence, which a sequence "
                       "shard does not give this layer; train it without --cp");
    shard_ = shard;
  }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    const auto [Bn, Tn] = batch_and_length(x);
    s.seq = Tn;
    Tensor<T, B> qkv = qkv_.forward(ctx, x, s.qkv);
    if (rotary_) rotary_->forward(ctx, s.qkv.linear.y, Tn, 3 * NH_ * hs_, 2 * NH_);
    attention_core(ctx, qkv, Bn, Tn, NH_ * hs_, NH_, s.lse, s.heads, shard_);
    return out_.forward(ctx, s.heads, s.out);
  }

  /// Selective recomputation: frees the heads' output and log-sum-exp after forward; backward
  /// computes them again from the kept q|k|v.
  void drop_recomputable(Stash& s) const {
    s.heads.reset();
    s.lse.reset();
    s.out.linear.x.reset();
  }
  void recompute(const Context<B>& ctx, Stash& s) const {
    const Tensor<T, B>& qkv = s.qkv.linear.y;
    if (!s.heads.empty() || qkv.empty()) return;
    const std::int64_t Tn = s.seq;
    attention_core(ctx, qkv, qkv.numel() / (Tn * 3 * NH_ * hs_), Tn, NH_ * hs_, NH_, s.lse, s.heads,
                   shard_);
    s.out.linear.x = s.heads.view();
  }

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    recompute(ctx, s);
    check<ShapeError>(s.lse.shape().rank() == 3, "fourway: attention backward without a matching ",
                      "forward: dy ", dy.shape().str());
    const std::int64_t Tn = s.lse.shape()[2];
    Tensor<T, B> dheads = out_.backward(ctx, dy, s.out);
    Tensor<T, B> dqkv = attention_core_backward(ctx, dheads, s.qkv.linear.y, s.heads, s.lse,
                                                NH_ * hs_, NH_, shard_);
    dheads.reset();
    if (rotary_) rotary_->backward(ctx, dqkv, Tn, 3 * NH_ * hs_, 2 * NH_);  // to unrotated q, k
    Tensor<T, B> dx = qkv_.backward(ctx, dqkv, s.qkv);
    s = Stash{};
    return dx;
  }

  template <class F>
  void visit_parameters(F&& f) {
    qkv_.visit_parameters(f);
    out_.visit_parameters(f);
  }

  [[nodiscard]] std::int64_t features() const { return C_; }
  /// This rank's heads, NH/N.
  [[nodiscard]] std::int64_t local_heads() const { return NH_; }
  ColumnLinear<T, B, Comm>& qkv() { return qkv_; }
  RowLinear<T, B, Comm>& out() { return out_; }

 private:
  static std::int64_t checked(const AttentionSpec& spec, int n, const std::string& name) {
    check<ConfigError>(spec.dim >= 1 && spec.heads >= 1 && spec.dim % spec.heads == 0,
                       "fourway: attention ", name, " needs dim C=", spec.dim,
                       " divisible by heads=", spec.heads, "; pick heads dividing C");
    check<ConfigError>(spec.heads % n == 0, "fourway: tensor parallelism over tp=", n,
                       " ranks needs heads=", spec.heads, " divisible by ", n,
                       " (each rank computes heads/tp whole heads of size C/heads=",
                       spec.dim / spec.heads, "); pick a tp that divides ", spec.heads);
    return spec.dim;
  }
  /// (B, T) of the input: (B, T, C), or under sequence parallelism (B·T/N, C) rows of length
  /// `set_sequence_length`.
  std::pair<std::int64_t, std::int64_t> batch_and_length(const Tensor<T, B>& x) const {
    const std::int64_t rows_here = detail::rows_of(x.shape(), C_, "attention");
    if (!qkv_.group().sequence_parallel()) {
      check<ShapeError>(x.shape().rank() == 3, "fourway: attention expects (B, T, ", C_, "), got ",
                        x.shape().str());
      return {x.shape()[0], x.shape()[1]};
    }
    const std::int64_t rows = rows_here * qkv_.group().size();
    check<ShapeError>(T_ >= 1 && rows % T_ == 0, "fourway: sequence-parallel attention got ",
                      x.shape().str(), " (", rows, " rows over the group) at sequence length ", T_,
                      "; call set_sequence_length(T) with T dividing the rows");
    return {rows / T_, T_};
  }

  std::int64_t C_;
  std::int64_t NH_;  // heads on this rank
  std::int64_t hs_;  // head size
  std::int64_t T_ = 0;
  ColumnLinear<T, B, Comm> qkv_;
  RowLinear<T, B, Comm> out_;
  std::optional<Rotary<T, B>> rotary_;
  SequenceShard<T, B>* shard_ = nullptr;
};

static_assert(layer<ParallelAttention<float, Host>>);

}  // namespace fourway
