//! `ReplicatedNorm<Norm, Comm>`: a norm (LayerNorm, RMSNorm) replicated over a tensor-parallel
//! group, ready for sequence parallelism (Korthikanti et al. 2022, §4.2.2). Without it every
//! rank normalises the same rows and computes the same gradients: the norm itself. Under it each
//! rank normalises only its chunk of the rows, so its gain (and bias) gradients are partial sums
//! over the chunk: the backward takes them in a scratch, sums the scratch over the group (one
//! all-reduce of the norm's 1 or 2 × C values) and adds it to the gradients. The parameters are
//! replicated (`Parameter::placement` says so): counted in the gradient norm by rank 0 only.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fourway/layers/layer.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/tp_group.hpp"

namespace fourway {

namespace detail {
/// The backward of `norm` on this rank's chunk of the rows, its parameters' gradients summed
/// over the group by `reduce(T* p, count)` before they are added (see the file comment).
/// `extra` goes to the norm's backward after the stash (LayerNorm's residual gradient).
template <class Norm, class Reduce, class... Extra>
auto norm_backward_over_rows(
    const Context<typename Norm::backend_type>& ctx, Norm& norm,
    const Tensor<typename Norm::value_type, typename Norm::backend_type>& dy,
    typename Norm::Stash& s, Reduce&& reduce, Extra&&... extra) {
  using T = typename Norm::value_type;
  using B = typename Norm::backend_type;
  std::vector<Parameter<T, B>*> params;
  norm.visit_parameters([&](Parameter<T, B>& p) { params.push_back(&p); });
  std::int64_t total = 0;
  for (auto* p : params) total += p->numel();
  Tensor<T, B> part(Shape{total}, MemTag::workspace, ctx.memory());
  Ops<B>::fill(ctx, part.data(), total, convert<T>(0.0f));
  std::vector<Tensor<T, B>> kept;
  std::int64_t at = 0;
  for (auto* p : params) {  // the backward adds into zeroed scratch slices
    kept.push_back(std::move(p->grad));
    p->grad = part.slice(at, Shape{p->numel()});
    at += p->numel();
  }
  Tensor<T, B> dx = norm.backward(ctx, dy, s, std::forward<Extra>(extra)...);
  reduce(part.data(), total);
  at = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    Parameter<T, B>& p = *params[i];
    p.grad = std::move(kept[i]);
    Ops<B>::residual_forward(ctx, p.bound_grad().data(), p.grad.data(), part.data() + at,
                             p.numel());
    at += p.numel();
  }
  return dx;
}
}  // namespace detail

template <class Norm, class Comm = Alone>
class ReplicatedNorm {
 public:
  using value_type = typename Norm::value_type;
  using backend_type = typename Norm::backend_type;
  using Input = typename Norm::Input;
  using Stash = typename Norm::Stash;
  using T = value_type;
  using B = backend_type;

  /// The norm (`Norm(ctx, name, C, eps)`) over `group`.
  ReplicatedNorm(const Context<B>& ctx, const std::string& name, std::int64_t C, float eps = 1e-5f,
                 TpGroup<Comm> group = {})
      : group_(group), norm_(ctx, name, C, eps) {
    norm_.visit_parameters([&](Parameter<T, B>& p) {  // the whole tensor on every rank
      p.placement = tp::Placement::of(tp::Split::replicated, 1, p.numel(), false);
      p.placement.name = p.name;
      p.slice_count = group_.size();
      p.slice_index = group_.rank();
    });
  }

  Tensor<T, B> forward(const Context<B>& ctx, const Tensor<T, B>& x, Stash& s) const {
    return norm_.forward(ctx, x, s);
  }
  /// r = a + b (into `r`, which the caller keeps), then forward(r), in one pass: the norm's
  /// `forward_residual` (LayerNorm's), row by row, so this rank's chunk of the rows under
  /// sequence parallelism works the same.
  Tensor<T, B> forward_residual(const Context<B>& ctx, const Tensor<T, B>& a, const Tensor<T, B>& b,
                                const Tensor<T, B>& r, Stash& s) const {
    return norm_.forward_residual(ctx, a, b, r, s);
  }
  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s) {
    if (!group_.sequence_parallel()) return norm_.backward(ctx, dy, s);
    return detail::norm_backward_over_rows(ctx, norm_, dy, s, reduce_over_group());
  }
  /// The backward with the residual path's gradient added to dx (LayerNorm's
  /// `backward(ctx, dy, s, residual_grad)`; dy's shape).
  Tensor<T, B> backward(const Context<B>& ctx, const Tensor<T, B>& dy, Stash& s,
                        const Tensor<T, B>* residual_grad) {
    if (!group_.sequence_parallel()) return norm_.backward(ctx, dy, s, residual_grad);
    return detail::norm_backward_over_rows(ctx, norm_, dy, s, reduce_over_group(), residual_grad);
  }

  template <class F>
  void visit_parameters(F&& f) {
    norm_.visit_parameters(f);
  }

  Norm& norm() { return norm_; }
  [[nodiscard]] const TpGroup<Comm>& group() const { return group_; }

 private:
  /// Sums a chunk's partial gain and bias gradients over the group.
  auto reduce_over_group() const {
    return [this](T* p, std::int64_t n) { group_.all_reduce(p, n, ReduceOp::sum); };
  }

  TpGroup<Comm> group_;
  Norm norm_;
};

}  // namespace fourway
