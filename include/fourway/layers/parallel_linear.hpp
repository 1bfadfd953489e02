//! Tensor-parallel-ready linear layers: `ColumnLinear` and `RowLinear` over a `TpGroup`
//! (layers/tp_group.hpp). Each builds its slice of the unsplit Linear (in, out), writes how it is
//! split on its parameters (`Parameter::placement`, so a model's placement table is read off
//! them), draws its initial values from the unsplit tensor's stream (every split starts from the
//! one-rank values), and places its own conjugate operator:
//! ```
//!   ColumnLinear  W (in, out/N), b (out/N)   input: f (identity | all-gather of the rows)
//!                 columns in `parts` blocks split separately (q|k|v: 3, gate|up: 2), so a
//!                 rank's columns are whole heads or whole hidden units
//!   RowLinear     W (in/N, out), b (out)     output: g (all-reduce | reduce-scatter), then + b
//!                 b is replicated, added once after g; its gradient comes from the full output
//!                 gradient, the same on every rank
//! ```
//! A column split feeds a row split with nothing between them but per-column work (an
//! activation, attention over whole heads), so a Megatron MLP or attention costs one all-reduce
//! forward and one backward. In a group of one rank (`TpGroup<>`) both are `Linear` exactly:
//! the same parameters, values, kernels and results, to the bit.
//! Under a `DeferredInit` the parameters are described with their init rules and no storage, as
//! `Linear`'s are; a strategy then materialises the elements its rank owns, of the slice.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "fourway/layers/gelu.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/linear.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/placement.hpp"
#include "fourway/layers/tp_group.hpp"

namespace fourway {

namespace detail {
/// `Linear(in, out)` described but not allocated (its init rules recorded): a tensor-parallel
/// layer places its parameters before they get values.
template <class T, class B>
Linear<T, B> described_linear(const Context<B>& ctx, const std::string& name, std::int64_t in,
                              std::int64_t out, std::uint64_t seed, float init_std, bool bias) {
  const DeferredInit describe_only;
  return Linear<T, B>(ctx, name, in, out, seed, init_std, bias);
}
}  // namespace detail

/// Makes `p` slice `r` of `n` of the unsplit tensor `pl` describes (its name and init rule are
/// `p`'s) and, unless a `DeferredInit` is alive on this thread, gives it storage and its slice's
/// initial values. `p` must have been built deferred (a shape and an init rule, no storage).
template <class T, class B>
void place_slice(const Context<B>& ctx, Parameter<T, B>& p, tp::Placement pl, int n, int r) {
  pl.name = p.name;
  pl.init = tp::InitRule{p.init.kind == InitRule::Kind::normal,
                         p.init.kind == InitRule::Kind::normal ? p.init.std : p.init.value};
  check<ShapeError>(p.numel() == pl.local_numel(n), "fourway: parameter ", p.name, " holds ",
                    p.numel(), " elements; slice ", r, " of ", n, " of its ", pl.rows, " x ",
                    pl.cols, " ", tp::split_name(pl.split), " split holds ", pl.local_numel(n));
  p.placement = std::move(pl);
  p.slice_count = n;
  p.slice_index = r;
  if (!DeferredInit::active()) materialize(ctx, p);
}

/// Y = X·W (+ b) with W's columns split over the group (see the file comment).
template <floating_dtype T, backend B, class Comm = Alone>
class ColumnLinear {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    Tensor<T, B> gathered;                // sequence parallel: the group's rows of x
    typename Linear<T, B>::Stash linear;  // y (rows, out/N)
  };

  /// `name` prefixes the parameter names as Linear's do; `out` is the unsplit width, in `parts`
  /// equal blocks each split over the group (out % (parts·N) == 0). Weight normal(0, init_std)
  /// of the unsplit tensor, bias zero.
  ColumnLinear(const Context<B>& ctx, const std::string& name, std::int64_t in, std::int64_t out,
               std::uint64_t seed, float init_std = 0.02f, bool bias = true,
               TpGroup<Comm> group = {}, int parts = 1)
      : group_(group),
        out_(checked_width(name, out, parts, group.size())),
        linear_(detail::described_linear<T, B>(ctx, name, in, out / group.size(), seed, init_std,
                                               bias)) {
    using tp::Split;
    const int n = group_.size();
    place_slice(ctx, linear_.weight(), tp::Placement::of(Split::column, in, out, true, parts), n,
                group_.rank());
    if (bias) {
      place_slice(ctx, linear_.bias(), tp::Placement::of(Split::column, 1, out, false, parts), n,
                  group_.rank());
    }
  }

  /// x (rows, in), or this rank's chunk of the rows under sequence parallelism -> (rows, out/N).
  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    return linear_.forward(ctx, group_.column_input(ctx, x, s.gathered), s.linear);
  }
  /// gelu(x·W + b) as Linear::forward_gelu (the GELU runs on this rank's columns).
  Tensor<T, B> forward_gelu(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s,
                            typename Gelu<T, B>::Stash& g) const {
    return linear_.forward_gelu(ctx, group_.column_input(ctx, x, s.gathered), s.linear, g);
  }
  /// dx: the group's sum (or this rank's chunk of it under sequence parallelism).
  /// `bias_grad_added` as Linear::backward (the next layer's `backward_gelu` reduced it).
  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s,
                        bool bias_grad_added = false) {
    Tensor<T, B> dx = linear_.backward(ctx, dy, s.linear, bias_grad_added);
    s.gathered.reset();
    return group_.column_input_backward(ctx, std::move(dx));
  }

  template <class F>
  void visit_parameters(F&& f) {
    linear_.visit_parameters(f);
  }

  /// This rank's output width, out/N.
  [[nodiscard]] std::int64_t local_out() const { return linear_.out_features(); }
  [[nodiscard]] std::int64_t out_features() const { return out_; }
  [[nodiscard]] const TpGroup<Comm>& group() const { return group_; }
  /// This rank's slice as a plain Linear (no conjugate operator).
  Linear<T, B>& local() { return linear_; }
  [[nodiscard]] const Linear<T, B>& local() const { return linear_; }
  Parameter<T, B>& weight() { return linear_.weight(); }
  Parameter<T, B>& bias() { return linear_.bias(); }

 private:
  static std::int64_t checked_width(const std::string& name, std::int64_t out, int parts, int n) {
    check<ConfigError>(parts >= 1 && out % (static_cast<std::int64_t>(parts) * n) == 0,
                       "fourway: ", name, " splits its ", out, " output columns in ", parts,
                       " block(s) over tp=", n, " ranks; ", out, " must divide by ", parts, " x ",
                       n, " = ", static_cast<std::int64_t>(parts) * n,
                       " (pick a width or a tp that divides it)");
    return out;
  }

  TpGroup<Comm> group_;
  std::int64_t out_;
  Linear<T, B> linear_;  // (in, out/N)
};

/// Y = X·W + b with W's rows split over the group (see the file comment).
template <floating_dtype T, backend B, class Comm = Alone>
class RowLinear {
 public:
  using value_type = T;
  using backend_type = B;
  using Input = Tensor<T, B>;
  struct Stash {
    typename Linear<T, B>::Stash linear;  // y: the partial product (rows, out), reduced in place
    Tensor<T, B> y;                       // sequence parallel: this rank's chunk of the sum
  };

  /// `in` is the unsplit input width (in % N == 0); the input is this rank's in/N columns of it.
  /// Weight normal(0, init_std) of the unsplit tensor, bias zero.
  RowLinear(const Context<B>& ctx, const std::string& name, std::int64_t in, std::int64_t out,
            std::uint64_t seed, float init_std = 0.02f, bool bias = true, TpGroup<Comm> group = {})
      : group_(group),
        in_(checked_rows(name, in, group.size())),
        linear_(detail::described_linear<T, B>(ctx, name, in / group.size(), out, seed, init_std,
                                               bias)) {
    using tp::Split;
    place_slice(ctx, linear_.weight(), tp::Placement::of(Split::row, in, out, true), group_.size(),
                group_.rank());
    if (bias) {  // replicated, added once after the group's sum
      place_slice(ctx, linear_.bias(), tp::Placement::of(Split::replicated, 1, out, false),
                  group_.size(), group_.rank());
    }
  }

  /// x (rows, in/N) -> the group's sum (rows, out) + b, or under sequence parallelism this rank's
  /// chunk of its rows.
  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    if (group_.size() == 1) return linear_.forward(ctx, x, s.linear);  // Linear, to the bit
    (void)linear_.forward_without_bias(ctx, x, s.linear);
    s.y = group_.row_output(ctx, s.linear.y.view(), MemTag::activations);
    // reduce-scattered: the partial sum is not needed again (the backward reads x only)
    if (group_.sequence_parallel()) s.linear.y.reset();
    add_bias(ctx, s.y);
    return s.y.view();
  }
  /// x (rows, in/N) -> the group's sum (rows, out) + b on every rank, sequence parallel or not:
  /// one decoded token's row, which is never split. Nothing is kept for a backward.
  Tensor<T, B> forward_replicated(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    if (group_.size() == 1) return linear_.forward(ctx, x, s.linear);
    (void)linear_.forward_without_bias(ctx, x, s.linear);
    group_.all_reduce(s.linear.y);
    add_bias(ctx, s.linear.y);
    return s.linear.y.view();
  }
  /// dx (rows, in/N): this rank's columns of the input gradient.
  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    const Tensor<T, B> full = group_.row_output_backward(ctx, dy);
    Tensor<T, B> dx = linear_.backward(ctx, full, s.linear);
    s.y.reset();
    return dx;
  }
  /// The backward when the input is GELU's output (an MLP's second matrix): after g's backward,
  /// Linear::backward_gelu — GELU's input gradient of this rank's in/N columns, with Σ_rows of it
  /// added to `pre_bias_grad` (the column split's bias gradient) when given.
  Tensor<T, B> backward_gelu(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s,
                             const Tensor<T, B>& pre_gelu, T* pre_bias_grad) {
    const Tensor<T, B> full = group_.row_output_backward(ctx, dy);
    Tensor<T, B> dh = linear_.backward_gelu(ctx, full, s.linear, pre_gelu, pre_bias_grad);
    s.y.reset();
    return dh;
  }

  template <class F>
  void visit_parameters(F&& f) {
    linear_.visit_parameters(f);
  }

  /// This rank's input width, in/N.
  [[nodiscard]] std::int64_t local_in() const { return linear_.in_features(); }
  [[nodiscard]] std::int64_t in_features() const { return in_; }
  [[nodiscard]] const TpGroup<Comm>& group() const { return group_; }
  Linear<T, B>& local() { return linear_; }
  Parameter<T, B>& weight() { return linear_.weight(); }
  Parameter<T, B>& bias() { return linear_.bias(); }

 private:
  /// The replicated bias, added once to the group's sum (rows, out).
  void add_bias(const Context<B>& ctx, Tensor<T, B>& y) const {
    if (!linear_.has_bias()) return;
    const std::int64_t out = linear_.out_features();
    Ops<B>::bias_add(ctx, y.data(), linear_.bias().bound_weight().data(), y.numel() / out, out);
  }
  static std::int64_t checked_rows(const std::string& name, std::int64_t in, int n) {
    check<ConfigError>(in % n == 0, "fourway: ", name, " splits its ", in,
                       " input rows over tp=", n, " ranks; ", in, " must divide by ", n,
                       " (pick a width or a tp that divides it)");
    return in;
  }

  TpGroup<Comm> group_;
  std::int64_t in_;
  Linear<T, B> linear_;  // (in/N, out)
};

static_assert(layer<ColumnLinear<float, Host>>);
static_assert(layer<RowLinear<float, Host>>);

}  // namespace fourway
