//! `Embedding<T, B, Comm>`: GPT-2's token + learned position embedding, out[b,t] = wte[tok[b,t]] +
//! wpe[t], tensor-parallel ready: without a group (the default) the lookup below; built over a
//! `TpGroup` of N ranks (one included: `TpGroup::has_comm`) wte is split by vocabulary rows (rank r
//! holds rows [r·Vp/N, (r+1)·Vp/N) of the table padded to Vp, `Split::vocab`), each rank looks up
//! the ids its rows hold (the others read zero), rank 0 adds wpe (replicated), and g sums the
//! group's partial rows (all-reduce, or a reduce-scatter to this rank's chunk of the rows under
//! sequence parallelism); the backward gathers the rows under sequence parallelism and every rank
//! adds its rows' gradients and the (replicated) wpe's.
//!
//! Input is token ids (B, T) as `Tensor<std::int32_t, B>`; backward scatter-adds into the
//! gradients of `wte` (V, C) and `wpe` (max_seq, C) and returns an empty tensor (ids have no
//! gradient). In the GPT, `wte` is also the language-model head (tied), so its gradient is
//! complete only after both the head's and this layer's backward.
//!
//! Token ids are checked against the vocabulary: on the host before the kernel runs; on a device
//! backend by the kernel itself (`TokenGuard`: a bad id reads nothing and the first bad position
//! is recorded in a device flag), and the flag is read once per backward, or by `check_tokens`,
//! and turned into a ShapeError naming the first bad id and its position. A caller that checked
//! the ids on the host (the Trainer, through `LossSink::tokens_checked`) sets
//! `Stash::tokens_checked`, and the backward skips that read, a synchronising call.
//!
//! Under context parallelism (a bound `SequenceShard`) row t of the input is not position t: the
//! forward gathers the wpe rows of the rows' positions into a (T, C) workspace and adds those;
//! the backward adds the position gradients into those rows of wpe's gradient.
#pragma once

#include <cstdint>

#include "fourway/layers/kv_cache.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/parallel_linear.hpp"
#include "fourway/layers/sequence_shard.hpp"
#include "fourway/layers/tp_group.hpp"

namespace fourway {

namespace detail {
/// Throws ShapeError naming the first id outside [0, vocab) (host backends; a device backend's
/// kernels read no row for such an id).
template <class B>
void check_vocab_ids(const Tensor<std::int32_t, B>& ids, std::int64_t vocab, const char* what) {
  if constexpr (!B::on_device) {
    for (std::int64_t i = 0; i < ids.numel(); ++i) {
      check<ShapeError>(ids[i] >= 0 && ids[i] < vocab, "fourway: ", what, " id ", ids[i],
                        " at position ", i, " is outside the vocabulary [0, ", vocab, ")");
    }
  } else {
    (void)ids, (void)vocab, (void)what;
  }
}
}  // namespace detail

template <floating_dtype T, backend B, class Comm = Alone>
class Embedding {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<std::int32_t, B>;
  struct Stash {
    Tensor<std::int32_t, B> tokens;  // view of the input (B, T)
    Tensor<T, B> y;                  // (B, T, C)
    bool tokens_checked = false;     // the caller checked the ids on the host (LossSink)
  };

  /// `padded_vocab` (0: `vocab`) rows of wte, the last padded_vocab - vocab of them padding:
  /// zero, never looked up, absent from files (Parameter::padding_rows).
  Embedding(const Context<B>& ctx, std::int64_t vocab, std::int64_t max_seq, std::int64_t C,
            std::uint64_t seed, float init_std = 0.02f, std::int64_t padded_vocab = 0,
            TpGroup<Comm> group = {})
      : V_(vocab), max_seq_(max_seq), C_(C), group_(group) {
    if (padded_vocab == 0) padded_vocab = vocab;
    const int n = group_.size();
    check<ConfigError>(vocab > 0 && max_seq > 0 && C > 0 && padded_vocab >= vocab,
                       "fourway: Embedding needs vocab, max_seq and C > 0 and padded_vocab >= "
                       "vocab, got ",
                       vocab, ", ", max_seq, ", ", C, " and ", padded_vocab);
    check<ConfigError>(padded_vocab % n == 0, "fourway: Embedding splits its ", padded_vocab,
                       " vocabulary rows over tp=", n,
                       " ranks; pad the vocabulary to a multiple "
                       "of ",
                       n, " (tp::padded_vocab)");
    if (!split()) {
      wte_ = Parameter<T, B>(ctx, "wte.weight", Shape{padded_vocab, C});
      wte_.padding_rows = padded_vocab - vocab;
      init_normal(ctx, wte_, seed, init_std);
    } else {  // this rank's rows of the unsplit table, its slice of the same initial values
      {
        const DeferredInit describe_only;
        wte_ = Parameter<T, B>(ctx, "wte.weight", Shape{padded_vocab / n, C});
        init_normal(ctx, wte_, seed, init_std);
      }
      place_slice(ctx, wte_, tp::Placement::of(tp::Split::vocab, vocab, C, true, 1, padded_vocab),
                  n, group_.rank());
    }
    wpe_ = Parameter<T, B>(ctx, "wpe.weight", Shape{max_seq, C});
    init_normal(ctx, wpe_, seed, init_std);
  }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                       Stash& s) const {
    check<ShapeError>(tokens.shape().rank() == 2, "fourway: Embedding expects token ids (B, T), ",
                      "got ", tokens.shape().str());
    const std::int64_t Bn = tokens.shape()[0];
    const std::int64_t Tn = tokens.shape()[1];
    const std::int64_t seq = sequence_length(shard_, Tn);
    check<ConfigError>(seq <= max_seq_, "fourway: sequence length T=", seq,
                       " exceeds max_seq=", max_seq_,
                       "; shorten the sequences or build the model with max_seq >= ", seq);
    s.tokens = tokens.view();
    if (split()) return split_forward(ctx, tokens, s);
    s.y = detail::activation<T, B>(ctx, Shape{Bn, Tn, C_});
    Tensor<T, B> wpe_rows;  // a sequence shard: (T, C), wpe at the rows' positions
    const T* wpe = position_rows(ctx, shard_, wpe_.bound_weight().data(), Tn, C_, wpe_rows);
    if constexpr (!B::on_device) {
      detail::check_vocab_ids(tokens, V_, "token");
      Ops<B>::embedding_forward(ctx, s.y.data(), tokens.data(), wte_.bound_weight().data(), wpe, Bn,
                                Tn, C_);
    } else {
      if (first_bad_.empty()) {
        first_bad_ = Tensor<std::int64_t, B>(Shape{1}, MemTag::workspace, ctx.memory());
        Ops<B>::fill(ctx, first_bad_.data(), 1, TokenGuard::none);
      }
      Ops<B>::embedding_forward(ctx, s.y.data(), tokens.data(), wte_.bound_weight().data(), wpe, Bn,
                                Tn, C_, TokenGuard{V_, first_bad_.data()});
    }
    return s.y.view();
  }

  /// Device backends: reads the bounds flag of the forwards since the last check (8 bytes, one
  /// synchronisation) and throws ShapeError naming the first bad id of the forward `s` stashed;
  /// resets the flag. Host: the forward already checked.
  void check_tokens(const Context<B>& ctx, const Stash& s) const {
    if constexpr (B::on_device) {
      if (first_bad_.empty()) return;
      std::int64_t at = TokenGuard::none;
      Ops<B>::to_host(ctx, &at, first_bad_.data(), 1);
      if (at == TokenGuard::none) return;
      Ops<B>::fill(ctx, first_bad_.data(), 1, TokenGuard::none);
      std::int32_t id = 0;
      if (at < s.tokens.numel()) Ops<B>::to_host(ctx, &id, s.tokens.data() + at, 1);
      throw ShapeError(detail::cat("fourway: token id ", id, " at position ", at,
                                   " is outside the vocabulary [0, ", V_,
                                   ") (found by the embedding kernel on the device)"));
    } else {
      (void)ctx, (void)s;
    }
  }

  /// Adds the rows' gradients to wte's and wpe's (dy: the forward's output shape); ids have no
  /// gradient (an empty tensor is returned).
  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    check<ShapeError>(
        dy.numel() * group_.size() == s.tokens.numel() * C_ || dy.numel() == s.tokens.numel() * C_,
        "fourway: Embedding backward without a matching forward: dy ", dy.shape().str(),
        ", tokens ", s.tokens.shape().str());
    const std::int64_t Bn = s.tokens.shape()[0];
    const std::int64_t Tn = s.tokens.shape()[1];
    Tensor<T, B> dwpe_rows;  // a sequence shard: the rows' position gradients
    T* dwpe = position_grad_rows(ctx, shard_, wpe_.bound_grad().data(), Tn, C_, dwpe_rows);
    if (!split()) {
      if (!s.tokens_checked) check_tokens(ctx, s);
      Ops<B>::embedding_backward(ctx, wte_.bound_grad().data(), dwpe, dy.data(), s.tokens.data(),
                                 Bn, Tn, C_);
    } else {  // g's backward (the rows gathered under sequence parallelism), then this rank's rows
      const Tensor<T, B> full = group_.row_output_backward(ctx, dy);
      Ops<B>::bias_backward(ctx, dwpe, full.data(), Bn, Tn * C_);
      Ops<B>::vocab_embed_backward(ctx, wte_.bound_grad().data(), full.data(), s.tokens.data(),
                                   Bn * Tn, C_, vocab_start(), vocab_valid());
    }
    add_position_grads(ctx, shard_, wpe_.bound_grad().data(), dwpe_rows, Tn, C_);
    s = Stash{};
    return Tensor<T, B>{};
  }

  /// One token of one sequence: wte[token] + wpe[pos], (1, 1, C), the same on every rank of the
  /// group (a masked row of this rank's vocabulary, rank 0 adding wpe, summed over the group).
  Tensor<T, B> decode(const Context<B>& ctx, std::int32_t token, std::int64_t pos) const {
    detail::check_decode_position(token, pos, V_, max_seq_);
    Tensor<T, B> x = detail::activation<T, B>(ctx, Shape{1, 1, C_});
    if (!split()) {
      Ops<B>::residual_forward(ctx, x.data(), wte_.bound_weight().data() + token * C_,
                               wpe_.bound_weight().data() + pos * C_, C_);
      return x;
    }
    Tensor<std::int32_t, B> id(Shape{1}, MemTag::workspace, ctx.memory());
    Ops<B>::from_host(ctx, id.data(), &token, 1);
    Ops<B>::vocab_embed_forward(ctx, x.data(), id.data(), wte_.bound_weight().data(), 1, C_,
                                vocab_start(), vocab_valid());
    if (group_.rank() == 0) {
      Ops<B>::bias_add(ctx, x.data(), wpe_.bound_weight().data() + pos * C_, 1, C_);
    }
    group_.all_reduce(x);
    return x;
  }

  template <class F>
  void visit_parameters(F&& f) {
    f(wte_);
    f(wpe_);
  }

  [[nodiscard]] std::int64_t vocab() const { return V_; }
  [[nodiscard]] std::int64_t max_seq() const { return max_seq_; }
  [[nodiscard]] std::int64_t features() const { return C_; }
  Parameter<T, B>& wte() { return wte_; }
  Parameter<T, B>& wpe() { return wpe_; }
  [[nodiscard]] const TpGroup<Comm>& group() const { return group_; }
  /// This rank's rows of the padded vocabulary: the first id and how many are real (not
  /// padding); the whole vocabulary in a group of one.
  [[nodiscard]] std::int64_t vocab_start() const {
    return split() ? wte_.placement.vocab_start(group_.size(), group_.rank()) : 0;
  }
  [[nodiscard]] std::int64_t vocab_valid() const {
    return split() ? wte_.placement.valid_rows(group_.size(), group_.rank()) : V_;
  }
  /// Built over a tensor-parallel group (`TpGroup::has_comm`, one rank included): wte is a
  /// vocabulary split and the lookup the masked one.
  [[nodiscard]] bool split() const { return group_.has_comm(); }
  /// Context parallelism: the input's rows are the shard's positions of each sequence (null:
  /// row t is position t). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) { shard_ = shard; }

 private:
  /// The split lookup (see the file comment): this rank's partial rows, rank 0 adding wpe, then
  /// g over the group.
  Tensor<T, B> split_forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                             Stash& s) const {
    const std::int64_t Bn = tokens.shape()[0];
    const std::int64_t Tn = tokens.shape()[1];
    detail::check_vocab_ids(tokens, V_, "token");
    Tensor<T, B> e = detail::activation<T, B>(ctx, Shape{Bn, Tn, C_});
    Ops<B>::vocab_embed_forward(ctx, e.data(), tokens.data(), wte_.bound_weight().data(), Bn * Tn,
                                C_, vocab_start(), vocab_valid());
    if (group_.rank() == 0) {
      Tensor<T, B> wpe_rows;  // a sequence shard: wpe at the rows' positions
      const T* wpe = position_rows(ctx, shard_, wpe_.bound_weight().data(), Tn, C_, wpe_rows);
      Ops<B>::bias_add(ctx, e.data(), wpe, Bn, Tn * C_);
    }
    s.y = group_.row_output(ctx, std::move(e), MemTag::activations);
    return s.y.view();
  }

  std::int64_t V_;
  std::int64_t max_seq_;
  std::int64_t C_;
  TpGroup<Comm> group_;
  Parameter<T, B> wte_;  // (Vp, C); split: this rank's (Vp/N, C)
  Parameter<T, B> wpe_;  // (max_seq, C)
  SequenceShard<T, B>* shard_ = nullptr;
  // device backends: (1) the TokenGuard flag; written by the (const) forward's kernel
  mutable Tensor<std::int64_t, B> first_bad_;
};

static_assert(layer<Embedding<float, Host>>);

}  // namespace fourway
