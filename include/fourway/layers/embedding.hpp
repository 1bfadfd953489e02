//! `Embedding<T, B>`: GPT-2's token + learned position embedding, out[b,t] = wte[tok[b,t]] +
//! wpe[t].
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

#include "fourway/layers/layer.hpp"
#include "fourway/layers/sequence_shard.hpp"

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

template <floating_dtype T, backend B>
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
            std::uint64_t seed, float init_std = 0.02f, std::int64_t padded_vocab = 0)
      : V_(vocab), max_seq_(max_seq), C_(C) {
    if (padded_vocab == 0) padded_vocab = vocab;
    check<ConfigError>(vocab > 0 && max_seq > 0 && C > 0 && padded_vocab >= vocab,
                       "fourway: Embedding needs vocab, max_seq and C > 0 and padded_vocab >= "
                       "vocab, got ",
                       vocab, ", ", max_seq, ", ", C, " and ", padded_vocab);
    wte_ = Parameter<T, B>(ctx, "wte.weight", Shape{padded_vocab, C});
    wte_.padding_rows = padded_vocab - vocab;
    wpe_ = Parameter<T, B>(ctx, "wpe.weight", Shape{max_seq, C});
    init_normal(ctx, wte_, seed, init_std);
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

  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    check<ShapeError>(dy.numel() == s.tokens.numel() * C_, "fourway: Embedding backward without ",
                      "a matching forward: dy ", dy.shape().str(), ", tokens ",
                      s.tokens.shape().str());
    if (!s.tokens_checked) check_tokens(ctx, s);
    const std::int64_t Tn = s.tokens.shape()[1];
    Tensor<T, B> dwpe_rows;  // a sequence shard: the rows' position gradients
    T* dwpe = position_grad_rows(ctx, shard_, wpe_.bound_grad().data(), Tn, C_, dwpe_rows);
    Ops<B>::embedding_backward(ctx, wte_.bound_grad().data(), dwpe, dy.data(), s.tokens.data(),
                               s.tokens.shape()[0], Tn, C_);
    add_position_grads(ctx, shard_, wpe_.bound_grad().data(), dwpe_rows, Tn, C_);
    s = Stash{};
    return Tensor<T, B>{};
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
  /// Context parallelism: the input's rows are the shard's positions of each sequence (null:
  /// row t is position t). Not owned.
  void bind_sequence_shard(SequenceShard<T, B>* shard) { shard_ = shard; }

 private:
  std::int64_t V_;
  std::int64_t max_seq_;
  std::int64_t C_;
  Parameter<T, B> wte_;  // (V, C)
  Parameter<T, B> wpe_;  // (max_seq, C)
  SequenceShard<T, B>* shard_ = nullptr;
  // device backends: (1) the TokenGuard flag; written by the (const) forward's kernel
  mutable Tensor<std::int64_t, B> first_bad_;
};

static_assert(layer<Embedding<float, Host>>);

}  // namespace fourway
