//! `ParallelAttention<T, B, Comm>`: causal multi-head self-attention split by heads over a
//! `TpGroup` (Megatron-LM's attention): q|k|v is a `ColumnLinear` of 3 parts, so a rank holds
//! NH/N whole heads of each; optional rotary position embeddings turn q and k in place; the
//! flash-style core (layers/attention_core.hpp `attention_core`) runs on this rank's heads; the
//! output projection is a `RowLinear`, whose g joins the group. With grouped-query attention
//! (Ainslie et al. 2023; `AttentionSpec::kv_heads` < heads) q and k|v are two column splits fed by
//! one f, a rank holds KV/N key/value heads and the NH/N query heads that read them, and each
//! key/value head is repeated over its group for the kernels (`gqa_pack`; its backward sums the
//! group's gradients, `gqa_unpack_grad`):
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

#include "fourway/layers/attention_core.hpp"
#include "fourway/layers/kv_cache.hpp"
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
  bool bias = true;        // biases on the projections
  /// Rotary position embeddings of q and k with this base (Su et al. 2021); none: positions
  /// come from elsewhere (a learned position embedding).
  std::optional<float> rope_theta{};
  std::uint64_t seed = 0;
  float init_std = 0.02f;    // q, k, v weights: normal(0, init_std)
  float output_std = 0.02f;  // the output projection (GPT-2: 0.02/sqrt(2·layers))
  /// Grouped-query attention (Ainslie et al. 2023): key/value heads, each shared by heads /
  /// kv_heads query heads; 0 (or `heads`): multi-head attention.
  std::int64_t kv_heads = 0;
};

template <floating_dtype T, backend B, class Comm = Alone>
class ParallelAttention {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    // multi-head: linear.y = this rank's q|k|v (B, T, 3C/N); grouped-query: linear.y = q (B, T,
    // C/N), and `gathered` the input under sequence parallelism
    typename ColumnLinear<T, B, Comm>::Stash qkv;
    typename Linear<T, B>::Stash kv;  // grouped-query: y = this rank's k|v (B, T, 2·KV·hs/N)
    Tensor<T, B> packed;              // grouped-query: q|k|v with k and v repeated (B, T, 3C/N)
    Tensor<float, B> lse;             // (B, NH/N, T)
    Tensor<T, B> heads;               // (B, T, C/N)
    typename RowLinear<T, B, Comm>::Stash out;
    std::int64_t seq = 0;  // T
  };

  /// Multi-head attention: parameters "<qkv_name>.{weight,bias}" (C, 3C/N, q|k|v each split by
  /// heads) and "<out_name>.{weight,bias}" (C/N, C).
  ParallelAttention(const Context<B>& ctx, const std::string& qkv_name, const std::string& out_name,
                    const AttentionSpec& spec, TpGroup<Comm> group = {})
      : C_(checked(spec, group.size(), qkv_name)),
        NH_(spec.heads / group.size()),
        KV_(NH_),
        hs_(spec.dim / spec.heads),
        qkv_(ctx, qkv_name, spec.dim, 3 * spec.dim, spec.seed, spec.init_std, spec.bias, group, 3),
        out_(ctx, out_name, spec.dim, spec.dim, spec.seed, spec.output_std, spec.bias, group) {
    check<ConfigError>(spec.kv_heads == 0 || spec.kv_heads == spec.heads, "fourway: attention ",
                       qkv_name, " with kv_heads=", spec.kv_heads, " < heads=", spec.heads,
                       " is grouped-query attention: name its q and k|v projections apart "
                       "(ParallelAttention(ctx, q_name, kv_name, out_name, spec, group))");
    if (spec.rope_theta) rotary_.emplace(hs_, *spec.rope_theta);
  }

  /// Grouped-query attention: parameters "<q_name>.{weight,bias}" (C, C/N),
  /// "<kv_name>.{weight,bias}" (C, 2·KV·hs/N, k|v each split by heads) and
  /// "<out_name>.{weight,bias}" (C/N, C). A rank holds NH/N query heads and the KV/N key/value
  /// heads they read (KV divides by N).
  ParallelAttention(const Context<B>& ctx, const std::string& q_name, const std::string& kv_name,
                    const std::string& out_name, const AttentionSpec& spec,
                    TpGroup<Comm> group = {})
      : C_(checked(spec, group.size(), q_name)),
        NH_(spec.heads / group.size()),
        KV_(kv_heads(spec) / group.size()),
        hs_(spec.dim / spec.heads),
        qkv_(ctx, q_name, spec.dim, spec.dim, spec.seed, spec.init_std, spec.bias, group),
        kv_(std::in_place, ctx, kv_name, spec.dim, 2 * kv_heads(spec) * hs_, spec.seed,
            spec.init_std, spec.bias, group, 2),
        out_(ctx, out_name, spec.dim, spec.dim, spec.seed, spec.output_std, spec.bias, group) {
    if (spec.rope_theta) rotary_.emplace(hs_, *spec.rope_theta);
  }

  /// The sequence length of the next forward under sequence parallelism (the input holds this
  /// rank's B·T/N rows, so T cannot be read off it); otherwise read from x (B, T, C).
  void set_sequence_length(std::int64_t seq) { T_ = seq; }
  /// Context parallelism: the rows are the shard's part of each sequence, the attention its
  /// ring and the rotary positions the rows' places in the whole sequence (null: whole
  /// sequences). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) { shard_ = shard; }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    const auto [Bn, Tn] = batch_and_length(x);
    s.seq = Tn;
    if (!kv_) {  // multi-head: one projection, q and k rotated in place
      (void)qkv_.forward(ctx, x, s.qkv);
      if (rotary_) rotary_->forward(ctx, s.qkv.linear.y, Tn, 3 * NH_ * hs_, 2 * NH_, shard_);
    } else {  // grouped-query: f once, q and k|v, k|v repeated over each group
      const Tensor<T, B> in = group().column_input(ctx, x, s.qkv.gathered);
      (void)qkv_.local().forward(ctx, in, s.qkv.linear);
      (void)kv_->local().forward(ctx, in, s.kv);
      if (rotary_) {
        rotary_->forward(ctx, s.qkv.linear.y, Tn, NH_ * hs_, NH_, shard_);
        rotary_->forward(ctx, s.kv.y, Tn, 2 * KV_ * hs_, KV_, shard_);
      }
      s.packed = detail::activation<T, B>(ctx, Shape{Bn, Tn, 3 * NH_ * hs_});
      Ops<B>::gqa_pack(ctx, s.packed.data(), s.qkv.linear.y.data(), s.kv.y.data(), Bn * Tn, NH_,
                       KV_, hs_);
    }
    attention_core(ctx, packed_qkv(s), Bn, Tn, NH_ * hs_, NH_, s.lse, s.heads, shard_);
    return out_.forward(ctx, s.heads, s.out);
  }

  /// One new token of one sequence, x (1, 1, C) on every rank of the group (a single row is
  /// never split, sequence parallel or not): its keys and values go to row `pos` of `cache` (this
  /// rank's NH/N heads, layers/kv_cache.hpp), it attends over rows [0, pos], and the output
  /// projection's partial sums are summed over the group. Returns (1, 1, C); nothing is kept for
  /// a backward. Multi-head attention with learned positions (GPT-2's).
  Tensor<T, B> decode(const Context<B>& ctx, const Tensor<T, B>& x, KvCache<T, B>& cache,
                      std::int64_t pos) const {
    check<ConfigError>(!kv_ && !rotary_, "fourway: decoding one token at a time is implemented ",
                       "for multi-head attention without rotary embeddings (GPT-2's); this ",
                       "attention has ", kv_ ? "grouped-query heads" : "rotary embeddings");
    typename Linear<T, B>::Stash in;
    typename RowLinear<T, B, Comm>::Stash out;
    const Tensor<T, B> qkv = qkv_.local().forward(ctx, x, in);
    const Tensor<T, B> y = decode_attention(ctx, qkv, cache, pos, NH_ * hs_, NH_);
    (void)out_.forward_replicated(ctx, y, out);
    return std::move(out.linear.y);
  }

  /// Selective recomputation: frees the heads' output and log-sum-exp after forward; backward
  /// computes them again from the kept q|k|v.
  void drop_recomputable(Stash& s) const {
    s.heads.reset();
    s.lse.reset();
    s.out.linear.x.reset();
  }
  void recompute(const Context<B>& ctx, Stash& s) const {
    const Tensor<T, B>& qkv = packed_qkv(s);
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
    Tensor<T, B> dqkv =
        attention_core_backward(ctx, dheads, packed_qkv(s), s.heads, s.lse, NH_ * hs_, NH_, shard_);
    dheads.reset();
    if (!kv_) {
      if (rotary_) rotary_->backward(ctx, dqkv, Tn, 3 * NH_ * hs_, 2 * NH_, shard_);  // unrotated
      Tensor<T, B> dx = qkv_.backward(ctx, dqkv, s.qkv);
      s = Stash{};
      return dx;
    }
    const std::int64_t rows = dqkv.numel() / (3 * NH_ * hs_);
    Tensor<T, B> dq = detail::workspace<T, B>(ctx, Shape{rows, NH_ * hs_});
    Tensor<T, B> dkv = detail::workspace<T, B>(ctx, Shape{rows, 2 * KV_ * hs_});
    Ops<B>::gqa_unpack_grad(ctx, dq.data(), dkv.data(), dqkv.data(), rows, NH_, KV_, hs_);
    dqkv.reset();
    if (rotary_) {
      rotary_->backward(ctx, dq, Tn, NH_ * hs_, NH_, shard_);
      rotary_->backward(ctx, dkv, Tn, 2 * KV_ * hs_, KV_, shard_);
    }
    Tensor<T, B> dx = qkv_.local().backward(ctx, dq, s.qkv.linear);
    const Tensor<T, B> dx_kv = kv_->local().backward(ctx, dkv, s.kv);
    Ops<B>::residual_forward(ctx, dx.data(), dx.data(), dx_kv.data(), dx.numel());
    s = Stash{};
    return group().column_input_backward(ctx, std::move(dx));
  }

  template <class F>
  void visit_parameters(F&& f) {
    qkv_.visit_parameters(f);
    if (kv_) kv_->visit_parameters(f);
    out_.visit_parameters(f);
  }

  [[nodiscard]] std::int64_t features() const { return C_; }
  /// This rank's query heads, NH/N, and key/value heads, KV/N (NH/N without grouped queries).
  [[nodiscard]] std::int64_t local_heads() const { return NH_; }
  [[nodiscard]] std::int64_t local_kv_heads() const { return KV_; }
  /// The q|k|v projection (multi-head) or the q projection (grouped-query).
  ColumnLinear<T, B, Comm>& qkv() { return qkv_; }
  RowLinear<T, B, Comm>& out() { return out_; }

 private:
  static std::int64_t kv_heads(const AttentionSpec& spec) {
    return spec.kv_heads == 0 ? spec.heads : spec.kv_heads;
  }
  static std::int64_t checked(const AttentionSpec& spec, int n, const std::string& name) {
    check<ConfigError>(spec.dim >= 1 && spec.heads >= 1 && spec.dim % spec.heads == 0,
                       "fourway: attention ", name, " needs dim C=", spec.dim,
                       " divisible by heads=", spec.heads, "; pick heads dividing C");
    check<ConfigError>(spec.heads % n == 0, "fourway: tensor parallelism over tp=", n,
                       " ranks needs heads=", spec.heads, " divisible by ", n,
                       " (each rank computes heads/tp whole heads of size C/heads=",
                       spec.dim / spec.heads, "); pick a tp that divides ", spec.heads);
    const std::int64_t kv = kv_heads(spec);
    check<ConfigError>(kv >= 1 && spec.heads % kv == 0, "fourway: attention ", name, " has ",
                       spec.heads, " query heads in groups over kv_heads=", kv,
                       "; kv_heads must divide heads");
    check<ConfigError>(kv % n == 0, "fourway: tensor parallelism over tp=", n,
                       " ranks needs kv_heads=", kv, " divisible by ", n,
                       " (each rank holds whole key/value heads and the query heads that read "
                       "them); pick a tp that divides ",
                       kv);
    return spec.dim;
  }
  [[nodiscard]] const TpGroup<Comm>& group() const { return qkv_.group(); }
  /// What the attention kernels read: q|k|v of equal heads.
  [[nodiscard]] const Tensor<T, B>& packed_qkv(const Stash& s) const {
    return kv_ ? s.packed : s.qkv.linear.y;
  }
  /// (B, T) of the input: (B, T, C), or under sequence parallelism (B·T/N, C) rows of length
  /// `set_sequence_length`.
  std::pair<std::int64_t, std::int64_t> batch_and_length(const Tensor<T, B>& x) const {
    const std::int64_t rows_here = detail::rows_of(x.shape(), C_, "attention");
    if (!group().sequence_parallel()) {
      check<ShapeError>(x.shape().rank() == 3, "fourway: attention expects (B, T, ", C_, "), got ",
                        x.shape().str());
      return {x.shape()[0], x.shape()[1]};
    }
    const std::int64_t rows = rows_here * group().size();
    check<ShapeError>(T_ >= 1 && rows % T_ == 0, "fourway: sequence-parallel attention got ",
                      x.shape().str(), " (", rows, " rows over the group) at sequence length ", T_,
                      "; call set_sequence_length(T) with T dividing the rows");
    return {rows / T_, T_};
  }

  std::int64_t C_;
  std::int64_t NH_;  // query heads on this rank
  std::int64_t KV_;  // key/value heads on this rank
  std::int64_t hs_;  // head size
  std::int64_t T_ = 0;
  ColumnLinear<T, B, Comm> qkv_;                // q|k|v, or q (grouped-query)
  std::optional<ColumnLinear<T, B, Comm>> kv_;  // grouped-query: k|v
  RowLinear<T, B, Comm> out_;
  std::optional<Rotary<T, B>> rotary_;
  SequenceShard<T, B>* shard_ = nullptr;
};

static_assert(layer<ParallelAttention<float, Host>>);

}  // namespace fourway
