//! The training strategy: what a `Trainer` delegates to, and `SingleRank`, the reference one.
//!
//! The Trainer is small: it splits the *global* batch into this rank's data-parallel share and
//! into micro-batches, runs forward and backward on each, and asks the strategy for everything
//! that depends on how the model is spread over ranks:
//!
//!   Trainer::step(global batch)                     strategy
//!   ─────────────────────────────────────────────   ─────────────────────────────────────────
//!                                                   begin_step()          grads = 0 (or alloc)
//!   for each micro-batch i of n:                    begin_micro_batch(i, n)
//!     loss_i = model.forward(..., hooks())            hooks(): pre/post_forward(unit), ...
//!     model.backward(..., dloss, hooks())             (FSDP gathers, DP bucket all-reduce)
//!                                                   end_micro_batch(i, n)
//!   report = finish_step(StepControl{lr, loss_scale, check_finite, Σ loss_i·rows_i})
//!                                                     reduce grads; sum the loss and Σg² over
//!                                                     the ranks (one packed all-reduce); agree
//!                                                     on inf/NaN; global norm = sqrt(Σg²)
//!                                                     / loss_scale; skip, or clip + AdamW on the
//!                                                     fp32 masters it owns; refresh the working
//!                                                     weights (all-gather under ZeRO)
//!   loss = report.loss_sum / global rows;  loss_scaler.update(report.found_inf)
//!
//! Gradient weighting (the invariant that makes the mathematics independent of the mesh): the
//! trainer gives every micro-batch's backward the factor `loss_scale * rows_mb / rows_global`, so
//! the gradients summed over micro-batches *and over ranks* are `loss_scale` times the gradient
//! of the global-batch mean loss. A strategy therefore reduces gradients with a SUM, never an
//! average, and divides by `loss_scale` only through `StepControl::loss_scale`.
//!
//! `training_strategy` is the concept; `SingleRank<Model, Precision, B>` is the model of it with
//! no communication (DataParallel and Sharded<1|2|3> are `ShardedStrategy`,
//! train/sharded_strategy.hpp).
//! A strategy is not movable once a Trainer holds it (hooks may point into it): the Trainer
//! constructs it in place.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/clip.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/parallel/cp/balanced_split.hpp"
#include "fourway/parallel/step_scalars.hpp"
#include "fourway/train/state_runs.hpp"

namespace fourway {

/// What the Trainer tells the strategy at the end of a step.
struct StepControl {
  float lr = 0.0f;              // learning rate of this iteration (from the schedule)
  float loss_scale = 1.0f;      // the factor the loss was multiplied by (1 unless fp16)
  bool check_finite = false;    // look for inf/NaN gradients and skip the step if any (fp16)
  double loss_sum = 0.0;        // this rank's Σ loss_i·rows_i over its micro-batches
  bool loss_on_device = false;  // loss_sum is instead in the strategy's device_loss_sum()
};

/// What the strategy tells the Trainer after a step; identical on every rank.
struct StepReport {
  bool found_inf = false;  // some gradient element on some rank was inf or NaN
  bool skipped = false;    // no update was applied: optimizer state and weights unchanged
  double grad_norm = 0.0;  // global L2 norm of the (unscaled) gradients, before clipping
  float clip_coef = 1.0f;  // the factor clipping applied (1 when not clipping)
  double loss_sum = 0.0;   // StepControl::loss_sum summed over the data-parallel group
};

/// How a strategy's ranks split every sequence (context parallelism): over `ranks` ranks, this
/// one holding part `rank` of each (parallel/cp/balanced_split.hpp). A strategy
/// without `sequence_split()` holds whole sequences.
struct SequenceSplit {
  int ranks = 1;
  int rank = 0;
};
/// The tokens of a sequence of `T` this rank holds under `s`: T, or T/c (a sequence that does not
/// cut into 2c chunks is the split's ShapeError).
inline std::int64_t local_length(const SequenceSplit& s, std::int64_t T) {
  return s.ranks == 1 ? T : cp::balanced_split(T, s.ranks, s.rank).local();
}
/// Inputs and targets of some rows of a batch, row-major.
struct TokenRows {
  std::span<const std::int32_t> inputs;
  std::span<const std::int32_t> targets;
};
/// This rank's part of `rows` whole sequences of `T` tokens under `s`: `whole` itself without a
/// split, else each sequence's local rows (`cp::take_local_rows`) gathered into `out` (inputs,
/// then targets), which the result views.
inline TokenRows local_rows(const SequenceSplit& s, TokenRows whole, std::int64_t rows,
                            std::int64_t T, std::vector<std::int32_t>& out) {
  if (s.ranks == 1) return whole;
  const cp::BalancedSplit split = cp::balanced_split(T, s.ranks, s.rank);
  const auto n = static_cast<std::size_t>(rows * split.local());
  out.resize(2 * n);
  cp::take_local_rows(out.data(), whole.inputs.data(), rows, 1, split);
  cp::take_local_rows(out.data() + n, whole.targets.data(), rows, 1, split);
  const std::span<const std::int32_t> local(out);
  return {local.first(n), local.subspan(n)};
}
template <class S>
SequenceSplit sequence_split_of(const S& s) {
  if constexpr (requires {
                  { s.sequence_split() } -> std::same_as<SequenceSplit>;
                }) {
    return s.sequence_split();
  } else {
    return {};
  }
}

/// What a Trainer needs from a strategy (see the picture at the top of this file).
template <class S>
concept training_strategy = requires(S& s, const S& cs, const StepControl& c, int i) {
  typename S::model_type;
  typename S::precision_type;
  typename S::backend_type;
  requires precision_policy<typename S::precision_type>;
  { cs.dp_rank() } -> std::convertible_to<int>;
  { cs.dp_size() } -> std::convertible_to<int>;
  { s.model() } -> std::same_as<typename S::model_type&>;
  { cs.context() } -> std::same_as<const Context<typename S::backend_type>&>;
  { cs.optimizer() } -> std::convertible_to<const AdamW&>;
  s.hooks();
  s.begin_step();
  s.begin_micro_batch(i, i);
  s.end_micro_batch(i, i);
  { s.finish_step(c) } -> std::same_as<StepReport>;
};

/// The end of every strategy's `finish_step`, once the reductions are done: given the found_inf
/// flag agreed by all ranks (in `r`) and the global sum of squares of the loss-scaled gradients,
/// skip the step (nothing is touched, so optimizer state and weights stay bitwise unchanged) or
/// clip on the global norm and apply AdamW to the segments of `state` this rank owns.
template <class T, class B>
StepReport apply_optimizer_step(const Context<B>& ctx, const AdamW& optimizer,
                                MasterState<T, B>& state, const StepControl& c, StepReport r,
                                double sum_squares,
                                std::type_identity_t<std::span<const SegmentBinding<T>>> bindings) {
  if (r.found_inf) {
    r.skipped = true;
    r.grad_norm = std::numeric_limits<double>::infinity();
    r.clip_coef = 1.0f;
    return r;
  }
  r.grad_norm = std::sqrt(sum_squares) / static_cast<double>(c.loss_scale);
  r.clip_coef = clip_coefficient(r.grad_norm, optimizer.config().max_grad_norm);
  optimizer.update(ctx, state, bindings, c.lr, r.clip_coef / c.loss_scale);
  return r;
}

/// One rank, no communication: the reference every other strategy must reproduce.
///
/// Owns the optimizer and a `MasterState` with one segment per parameter, in
/// `model.visit_parameters` order. Working weights and gradients stay in the model.
template <class Model, precision_policy P, backend B>
class SingleRank {
 public:
  using model_type = Model;
  using precision_type = P;
  using backend_type = B;
  using param_type = typename P::param_type;

  SingleRank(const Context<B>& ctx, Model& model, AdamW optimizer = AdamW{})
      : ctx_(&ctx),
        model_(&model),
        optimizer_(optimizer),
        state_(ctx, segments_of(model)),
        scalars_(ctx) {
    std::size_t i = 0;
    model.visit_parameters([&](auto& p) {
      static_assert(
          std::is_same_v<typename std::remove_cvref_t<decltype(p.weight)>::value_type, param_type>,
          "fourway: the model's parameters are not in Precision<T>::param_type; "
          "build the model with the element type of the precision policy");
      if constexpr (requires { materialize(ctx, p); }) {
        materialize(ctx, p);  // a deferred fw::Parameter gets its storage here
      }
      state_.init_master(ctx, i++, p.weight.data());
    });
  }
  SingleRank(const SingleRank&) = delete;
  SingleRank& operator=(const SingleRank&) = delete;

  [[nodiscard]] int dp_rank() const { return 0; }
  [[nodiscard]] int dp_size() const { return 1; }
  [[nodiscard]] Model& model() { return *model_; }
  [[nodiscard]] const Context<B>& context() const { return *ctx_; }
  [[nodiscard]] const AdamW& optimizer() const { return optimizer_; }
  [[nodiscard]] const MasterState<param_type, B>& state() const { return state_; }
  [[nodiscard]] NoHooks& hooks() { return hooks_; }

  /// Checkpoints (state_runs.hpp): the one rank holds every parameter as one run.
  [[nodiscard]] std::vector<OwnedRun<param_type, B>> saved_state_runs() const {
    return owned_runs();
  }
  /// The global runs this rank writes (`saving`) or loads.
  [[nodiscard]] std::vector<StateRun<param_type, B>> checkpoint_runs(bool saving) const {
    const auto owned = owned_runs();
    return state_runs(*model_, owned, saving);
  }
  template <class Put>
  void save_state(Put&& put) const {
    const auto runs = checkpoint_runs(true);
    save_state_runs(*ctx_, state_, runs, put);
  }
  template <class Read>
  void load_state(int adam_step, Read&& read) {
    const auto runs = checkpoint_runs(false);
    load_state_runs(*ctx_, state_, runs, read);
    state_.restore_step(adam_step);
  }
  void sync_loaded_state() {}

  /// Slot 0 of the step's device scalars: a model adds its loss here (StepScalars).
  [[nodiscard]] double* device_loss_sum() { return scalars_.slot(0); }

  void begin_step() {
    zero_grad(*ctx_, *model_);
    scalars_.clear(2);
  }
  void begin_micro_batch(int /*i*/, int /*n*/) {}
  void end_micro_batch(int /*i*/, int /*n*/) {}
  /// Σg² of every gradient by one multi-tensor reduction into the device scalars beside the loss
  /// sum, both read back together: the step's one synchronising call. An inf or NaN gradient
  /// makes Σg² non-finite, which is the fp16 overflow test.
  StepReport finish_step(const StepControl& c) {
    reduce_step(c);
    return complete_step(c);
  }
  /// The device half of `finish_step`, which a CUDA graph may hold (train/trainer.hpp,
  /// `StepCapture`): Σg² into the scalars beside the loss sum; nothing read back or uploaded when
  /// the loss is on the device.
  void reduce_step(const StepControl& c) {
    if (!c.loss_on_device) scalars_.set(0, c.loss_sum);
    std::vector<std::span<const param_type>> grads;
    model_->visit_parameters([&](auto& p) {
      grads.emplace_back(p.grad.data(), static_cast<std::size_t>(p.grad.numel()));
    });
    scalars_.zero(1);  // Σg² is this call's alone, whether or not begin_step ran
    Ops<B>::sum_squares_into(*ctx_, scalars_.slot(1), grads);
  }
  /// The host half: the scalars read back, then the step skipped (fp16 overflow) or clipped and
  /// applied with the learning rate and loss scale of `c`.
  StepReport complete_step(const StepControl& c) {
    std::vector<SegmentBinding<param_type>> bindings;
    model_->visit_parameters([&](auto& p) {
      bindings.push_back({p.weight.data(), p.grad.data()});
    });
    const auto [loss_sum, ss] = scalars_.template read<2>();
    StepReport r;
    r.loss_sum = loss_sum;
    r.found_inf = c.check_finite && !std::isfinite(ss);
    return apply_optimizer_step(*ctx_, optimizer_, state_, c, r, ss, bindings);
  }

 private:
  std::vector<OwnedRun<param_type, B>> owned_runs() const {
    std::vector<OwnedRun<param_type, B>> runs;
    model_->visit_parameters([&](auto& p) {
      const int i = static_cast<int>(runs.size());
      runs.push_back({&p, 0, p.weight.numel(), runs.size(), 0, p.weight.data(), i});
    });
    return runs;
  }

  static std::vector<StateSegment> segments_of(Model& model) {
    std::vector<StateSegment> segs;
    std::int64_t off = 0;
    model.visit_parameters([&](auto& p) {
      segs.push_back(StateSegment{off, p.weight.numel(), p.decay});
      off += p.weight.numel();
    });
    return segs;
  }

  const Context<B>* ctx_;
  Model* model_;
  AdamW optimizer_;
  MasterState<param_type, B> state_;
  StepScalars<B> scalars_;  // [loss sum, Σg²] of the step, in backend memory
  NoHooks hooks_;
};

}  // namespace fourway
