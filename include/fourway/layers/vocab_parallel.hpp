//! Tensor-parallel-ready vocabulary layers over a `TpGroup` (layers/tp_group.hpp): the token
//! embedding and the LM head with its cross-entropy, each holding rows [r·Vp/N, (r+1)·Vp/N) of
//! the vocabulary padded to Vp (a multiple of N·alignment; padding rows are zero and never enter
//! a product), each writing that split on its parameter (`Parameter::placement`) and drawing its
//! slice of the unsplit tensor's initial values:
//! ```
//!   VocabEmbedding  masked lookup of this rank's rows, then the group's sum (g: all-reduce, or
//!                   reduce-scatter to this rank's chunk of the rows under sequence parallelism)
//!   VocabHead       logits of this rank's real rows only, the softmax joined over the group by
//!                   two all-reduces (layers/vocab_loss.hpp); full logits are never formed. Its
//!                   input enters through f (all-gather of the rows under sequence parallelism)
//!                   and its input gradient leaves through f's backward.
//! ```
//! A head is untied (its own `<name>.weight`) or tied to an embedding's table (it borrows the
//! parameter: the embedding visits it, the head adds its part of the gradient).
//! In a group of one rank both are the unsplit layers: a lookup, and the cross-entropy of the
//! full logits.
#pragma once

#include <cstdint>
#include <string>

#include "fourway/layers/embedding.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/loss.hpp"
#include "fourway/layers/parallel_linear.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/placement.hpp"
#include "fourway/layers/replicated_norm.hpp"
#include "fourway/layers/tp_group.hpp"
#include "fourway/layers/vocab_loss.hpp"

namespace fourway {

namespace detail {
/// A vocabulary table (Vp/N, C) of rank r of the group, normal(0, init_std) of the unsplit
/// (vocab, C) tensor, placed as a vocab split.
template <class T, class B>
Parameter<T, B> vocab_table(const Context<B>& ctx, const std::string& name, std::int64_t vocab,
                            std::int64_t C, std::uint64_t seed, float init_std, int n, int r,
                            int alignment) {
  check<ConfigError>(vocab >= 1 && C >= 1, "fourway: ", name, " needs vocab and C >= 1, got ",
                     vocab, " and ", C);
  const std::int64_t Vp = tp::padded_vocab(vocab, n, alignment);
  Parameter<T, B> p;
  {
    const DeferredInit describe_only;
    p = Parameter<T, B>(ctx, name + ".weight", Shape{Vp / n, C});
    init_normal(ctx, p, seed, init_std);
  }
  place_slice(ctx, p, tp::Placement::of(tp::Split::vocab, vocab, C, true, 1, Vp), n, r);
  return p;
}

}  // namespace detail

/// Token ids (B, T) -> rows of the table (B, T, C), split by vocabulary rows over the group.
template <floating_dtype T, backend B, class Comm = Alone>
class VocabEmbedding {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<std::int32_t, B>;
  struct Stash {
    Tensor<std::int32_t, B> tokens;  // view of the input (B, T)
    Tensor<T, B> y;                  // (B, T, C); sequence parallel: this rank's (B·T/N, C)
  };

  /// Parameter "<name>.weight" (Vp/N, C), normal(0, init_std) of the unsplit (vocab, C) table.
  VocabEmbedding(const Context<B>& ctx, const std::string& name, std::int64_t vocab, std::int64_t C,
                 std::uint64_t seed, float init_std = 0.02f, TpGroup<Comm> group = {},
                 int alignment = 1)
      : group_(group),
        V_(vocab),
        C_(C),
        weight_(detail::vocab_table<T, B>(ctx, name, vocab, C, seed, init_std, group.size(),
                                          group.rank(), alignment)) {}

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<std::int32_t, B>& tokens,
                       Stash& s) const {
    check<ShapeError>(tokens.shape().rank() == 2, "fourway: ", weight_.name,
                      " expects token ids (B, T), got ", tokens.shape().str());
    detail::check_vocab_ids(tokens, V_, "token");
    s.tokens = tokens.view();
    Tensor<T, B> e = detail::activation<T, B>(ctx, Shape{tokens.shape()[0], tokens.shape()[1], C_});
    Ops<B>::vocab_embed_forward(ctx, e.data(), tokens.data(), weight_.bound_weight().data(),
                                tokens.numel(), C_, vocab_start(), vocab_valid());
    s.y = group_.row_output(ctx, std::move(e), MemTag::activations);
    return s.y.view();
  }

  /// Adds the rows' gradients to this rank's rows of the table; ids have no gradient (empty).
  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    check<ShapeError>(
        dy.numel() * group_.size() == s.tokens.numel() * C_ || dy.numel() == s.tokens.numel() * C_,
        "fourway: ", weight_.name, " backward without a matching forward: dy ", dy.shape().str(),
        ", tokens ", s.tokens.shape().str());
    const Tensor<T, B> full = group_.row_output_backward(ctx, dy);
    Ops<B>::vocab_embed_backward(ctx, weight_.bound_grad().data(), full.data(), s.tokens.data(),
                                 s.tokens.numel(), C_, vocab_start(), vocab_valid());
    s = Stash{};
    return Tensor<T, B>{};
  }

  template <class F>
  void visit_parameters(F&& f) {
    f(weight_);
  }

  /// The table (this rank's rows), which a tied head borrows.
  Parameter<T, B>& weight() { return weight_; }
  [[nodiscard]] std::int64_t vocab() const { return V_; }
  [[nodiscard]] std::int64_t features() const { return C_; }
  /// This rank's first vocabulary id and how many of its rows are real (not padding).
  [[nodiscard]] std::int64_t vocab_start() const {
    return weight_.placement.vocab_start(group_.size(), group_.rank());
  }
  [[nodiscard]] std::int64_t vocab_valid() const {
    return weight_.placement.valid_rows(group_.size(), group_.rank());
  }
  [[nodiscard]] const TpGroup<Comm>& group() const { return group_; }

 private:
  TpGroup<Comm> group_;
  std::int64_t V_;
  std::int64_t C_;
  Parameter<T, B> weight_;  // (Vp/N, C)
};

/// The LM head and its mean cross-entropy over a vocabulary split by rows over the group.
template <floating_dtype T, backend B, class Comm = Alone>
class VocabHead {
 public:
  using value_type = T;
  using backend_type = B;
  struct Stash {
    Tensor<std::int32_t, B> targets;  // view (rows ids)
    Tensor<T, B> h;                   // the input rows (a view), or under sequence parallelism
                                      // the group's rows gathered (rows, C)
    Tensor<T, B> logits;              // (rows, Vv) this rank's real vocabulary columns
    Tensor<float, B> stats;           // (3, rows): global row max | Σ exp | target logit
    float loss = 0.0f;                // the mean loss; NaN when a LossSink took it
  };

  /// An untied head: parameter "<name>.weight" (Vp/N, C), normal(0, init_std) of the unsplit
  /// (vocab, C) matrix.
  VocabHead(const Context<B>& ctx, const std::string& name, std::int64_t vocab, std::int64_t C,
            std::uint64_t seed, float init_std = 0.02f, TpGroup<Comm> group = {}, int alignment = 1)
      : group_(group),
        own_(detail::vocab_table<T, B>(ctx, name, vocab, C, seed, init_std, group.size(),
                                       group.rank(), alignment)),
        weight_(&own_) {}

  /// A head tied to `embedding`'s table: it borrows the parameter (not visited here; the
  /// embedding's owner keeps it alive and in place). Call `tie` again after moving either.
  explicit VocabHead(VocabEmbedding<T, B, Comm>& embedding)
      : VocabHead(embedding.weight(), embedding.group()) {}
  /// A head tied to `table`, a vocabulary split (Vp/N, C) over `group` (GPT-2's wte, layers/
  /// embedding.hpp), borrowed as above.
  VocabHead(Parameter<T, B>& table, TpGroup<Comm> group) : group_(group), weight_(&table) {}
  void tie(VocabEmbedding<T, B, Comm>& embedding) { weight_ = &embedding.weight(); }

  VocabHead(VocabHead&& o) noexcept
      : group_(o.group_), own_(std::move(o.own_)), weight_(o.tied() ? o.weight_ : &own_) {}
  VocabHead& operator=(VocabHead&& o) noexcept {
    group_ = o.group_;
    own_ = std::move(o.own_);
    weight_ = o.tied() ? o.weight_ : &own_;
    return *this;
  }
  VocabHead(const VocabHead&) = delete;
  VocabHead& operator=(const VocabHead&) = delete;

  /// The mean cross-entropy of `targets` (rows ids) for the hidden states h (rows, C), or under
  /// sequence parallelism this rank's chunk (rows/N, C) of them. Without `sink` the loss is read
  /// back (one synchronising call); with it, sink.weight × the sum of the per-row losses is added
  /// to *sink.sum on the backend and NaN is returned.
  float forward(const Context<B>& ctx, const Tensor<T, B>& h,
                const Tensor<std::int32_t, B>& targets, Stash& s,
                const LossSink* sink = nullptr) const {
    const std::int64_t C = features();
    const std::int64_t rows = targets.numel();
    check<ShapeError>(h.numel() * group_.size() == rows * C || h.numel() == rows * C,
                      "fourway: ", weight_->name, " head got h ", h.shape().str(), " for ",
                      targets.shape().str(), " targets");
    detail::check_vocab_ids(targets, vocab(), "target");
    s.targets = targets.view();
    Tensor<T, B> gathered;
    s.h = group_.column_input(ctx, h, gathered);
    if (!gathered.empty()) s.h = std::move(gathered);
    const auto reduce = [this](float* p, std::int64_t count, ReduceOp op) {
      group_.all_reduce(p, count, op);
    };
    s.loss = tp::vocab_parallel_loss_forward_with(ctx, reduce, slice(), s.h.data(), rows, C,
                                                  targets.data(), s.logits, s.stats, sink);
    return s.loss;
  }

  /// d(grad_scale × mean loss) / dh: the group's sum (rows, C), or this rank's chunk of its rows
  /// under sequence parallelism; adds this rank's rows of the weight's gradient.
  Tensor<T, B> backward(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f) {
    check<ShapeError>(!s.stats.empty(), "fourway: ", weight_->name,
                      " head backward without its forward");
    const std::int64_t rows = s.targets.numel();
    const std::int64_t C = features();
    Tensor<T, B> dh = detail::workspace<T, B>(ctx, Shape{rows, C});
    tp::vocab_parallel_loss_backward(ctx, slice(), weight_->bound_grad().data(), s.h.data(), rows,
                                     C, s.targets.data(), s.logits, s.stats, grad_scale, dh.data());
    s.h.reset();  // the stash is done with: freed before f's backward allocates
    s.logits.reset();
    s.stats.reset();
    return group_.column_input_backward(ctx, std::move(dh));
  }

  /// Untied: the head's matrix; tied: nothing (the embedding visits the table).
  template <class F>
  void visit_parameters(F&& f) {
    if (!tied()) f(own_);
  }

  [[nodiscard]] bool tied() const { return weight_ != &own_; }
  Parameter<T, B>& weight() { return *weight_; }
  [[nodiscard]] std::int64_t vocab() const { return weight_->placement.rows; }
  [[nodiscard]] std::int64_t features() const { return weight_->placement.cols; }
  [[nodiscard]] const TpGroup<Comm>& group() const { return group_; }

 private:
  [[nodiscard]] tp::VocabSlice<T, B> slice() const {
    const int n = group_.size();
    const int r = group_.rank();
    return {weight_->bound_weight().data(), weight_->placement.vocab_start(n, r),
            weight_->placement.valid_rows(n, r)};
  }
  TpGroup<Comm> group_;
  Parameter<T, B> own_;      // untied: (Vp/N, C)
  Parameter<T, B>* weight_;  // own_, or the tied embedding's table
};

/// The head unit of most decoders: a final norm (LayerNorm, RMSNorm; replicated, sequence-
/// parallel ready) and an untied `VocabHead` with its cross-entropy.
template <class Norm, class Comm = Alone>
class NormedVocabHead {
 public:
  using value_type = typename Norm::value_type;
  using backend_type = typename Norm::backend_type;
  using T = value_type;
  using B = backend_type;
  struct Stash {
    typename Norm::Stash norm;
    typename VocabHead<T, B, Comm>::Stash head;
  };

  /// Parameters "<norm_name>.*" and "<head_name>.weight" (Vp/N, C).
  NormedVocabHead(const Context<B>& ctx, const std::string& norm_name, const std::string& head_name,
                  std::int64_t vocab, std::int64_t C, float eps, std::uint64_t seed,
                  float init_std = 0.02f, TpGroup<Comm> group = {})
      : norm_(ctx, norm_name, C, eps, group),
        head_(ctx, head_name, vocab, C, seed, init_std, group) {}

  /// The mean cross-entropy of `targets` for the rows x (see VocabHead::forward).
  float forward(const Context<B>& ctx, const Tensor<T, B>& x,
                const Tensor<std::int32_t, B>& targets, Stash& s,
                const LossSink* sink = nullptr) const {
    return head_.forward(ctx, norm_.forward(ctx, x, s.norm), targets, s.head, sink);
  }
  /// d(grad_scale × mean loss) / dx.
  Tensor<T, B> backward(const Context<B>& ctx, Stash& s, float grad_scale = 1.0f) {
    const Tensor<T, B> dh = head_.backward(ctx, s.head, grad_scale);
    return norm_.backward(ctx, dh, s.norm);
  }
  template <class F>
  void visit_parameters(F&& f) {
    norm_.visit_parameters(f);
    head_.visit_parameters(f);
  }

 private:
  ReplicatedNorm<Norm, Comm> norm_;
  VocabHead<T, B, Comm> head_;
};

}  // namespace fourway
