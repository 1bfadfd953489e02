//! `ShardedStrategy<Stage, Model, Precision, B, Comm>`: data parallelism (Stage 0) and ZeRO /
//! FSDP (Stages 1, 2, 3) as a training strategy (train/strategy.hpp) over one data-parallel group,
//! and `fw::data_parallel_strategy_t<Policy, ...>`, the strategy a policy tag stands for.
//!
//! Who holds what, per rank of a group of N (Ψ' = parameters padded per segment, S = Ψ'/N):
//! ```
//!   stage  weights      grads            fp32 master + Adam m, v    communication per step
//!   0      full Ψ       full Ψ           full Ψ                     all-reduce per bucket
//!   1      full Ψ'      full Ψ'          shard S                    reduce-scatter per bucket,
//!                                                                   all-gather weights after step
//!   2      full Ψ'      shard S          shard S                    the same; each bucket's full
//!                                        (full bucket only while    gradient freed once reduced
//!                                         it is being reduced)
//!   3      shard S      shard S          shard S                    per unit: all-gather before
//!          (+ at most two units gathered)                           forward and before backward,
//!                                                                   reduce-scatter after backward
//! ```
//! The strategy composes the byte movers of `parallel/` — `ParameterLayout` (segments, views),
//! `GradientReducer` (bucket collectives fired from `post_backward`), `UnitGatherer` (stage 3
//! gathers, prefetch, release), all issuing into one `WorkQueue` — with the optimizer: it owns the
//! working weights (full, or the shard under stage 3) and the fp32 masters and moments of the
//! rank's shard. Every collective is waited on before the optimizer. The step's scalars — the
//! loss sum and (stages 1-3) the Σg² of the rank's shard — are summed in one packed all-reduce on
//! the backend's memory (`StepScalars`, parallel/step_scalars.hpp), never through host pointers.
//! fp16: the overflow check is `!isfinite(global Σg²)`, so every rank sees the same verdict and
//! skips together; the global norm (and clipping) comes from the same sum.
//!
//! The strategy keeps pointers to the context, the model and the communicator (which must outlive
//! it) and rebinds every parameter's `weight` and `grad` to views of its own buffers: the layers'
//! storage is freed at construction. The model needs `units()`, `visit_parameters(f)` and
//! `visit_unit_parameters(u, f)` (docs/contracts.md, FSDP units).
//! Initial weights must be identical on every rank (fw::models::Gpt's init depends only on seed,
//! parameter name and element index); they are not broadcast. Built on a deferred model
//! (`Gpt::deferred`), the strategy computes only the elements it places: under stage 3 the
//! rank's shard, so no rank ever holds the whole model. See docs/memory.md.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/parallel/dp/data_parallel.hpp"
#include "fourway/parallel/dp/flat_layout.hpp"
#include "fourway/parallel/dp/gradient_reducer.hpp"
#include "fourway/parallel/dp/parameter_layout.hpp"
#include "fourway/parallel/dp/unit_gatherer.hpp"
#include "fourway/parallel/step_scalars.hpp"
#include "fourway/parallel/work_queue.hpp"
#include "fourway/train/strategy.hpp"

namespace fourway {

/// Run-time knobs of the data-parallel strategies.
struct ShardedOptions {
  /// Gradient bucket size (stages 0-2); <= 0 puts every gradient in one bucket. PyTorch DDP's
  /// default is 25 MiB.
  std::int64_t bucket_bytes = 25ll << 20;
  /// Issue collectives during backward (and prefetch the next unit under stage 3). Off: every
  /// collective is issued and waited where its result is needed (for benchmarks).
  bool overlap = true;
  /// Stages 1-2: one segment per unit instead of buckets (stage 3 always has them), for a caller
  /// that drives the units itself (`gather_unit` ... `reduce_unit_gradients`: a pipeline).
  bool unit_segments = false;
};

/// A model split over a model-parallel group as well (models::Gpt over a tp group, layers/gpt.hpp):
/// it says which of its parameters this rank counts in the global gradient norm (a replicated one
/// on one rank of the group only) and sums the norm over that group; the strategy's communicator is
/// then the data-parallel group.
template <class M>
concept model_parallel_model = requires(M& m, const M& cm, StepScalars<Host>& s, int i) {
  { cm.counts_in_norm(i) } -> std::convertible_to<bool>;
  m.sum_over_model_parallel(s, std::int64_t{1});  // slot 1 summed over its groups, in place
};

template <int Stage, class Model, precision_policy P, backend B, class Comm>
class ShardedStrategy {
  static_assert(Stage >= 0 && Stage <= 3,
                "fourway: ShardedStrategy<Stage, ...> needs Stage 0 (DataParallel), 1 (optimizer "
                "state), 2 (+ gradients) or 3 (+ parameters, FSDP)");
  static_assert(communicator<Comm>,
                "fourway: ShardedStrategy needs Comm to model fw::communicator (LocalComm, "
                "MpiComm, NcclComm or Counting<...> of one)");
  static_assert(
      requires(Model & m) {
        { m.units() } -> std::convertible_to<int>;
      },
      "fourway: ShardedStrategy (DataParallel, Sharded<1|2|3>) needs the model's "
      "units(): how many FSDP units (its layers, in forward order) it has, the ones "
      "visit_unit_parameters(u, f) visits and the hooks bracket (docs/contracts.md)");
  static_assert(
      requires(Model & m, detail::ParameterVisitorArchetype<typename P::param_type, B> f) {
        m.visit_parameters(f);
        m.visit_unit_parameters(0, f);
      },
      "fourway: ShardedStrategy (DataParallel, Sharded<1|2|3>) needs the model's "
      "visit_parameters(f) and visit_unit_parameters(u, f), calling f with each Parameter<T, B> "
      "(of the precision's T) of the model and of unit u (docs/contracts.md)");

 public:
  using model_type = Model;
  using precision_type = P;
  using backend_type = B;
  using param_type = typename P::param_type;
  using T = param_type;
  static constexpr int stage = Stage;
  /// The policy tag of the stage: the code below asks it what is sharded.
  using policy = data_parallel_policy_t<Stage>;

  /// The model hooks: FSDP gathers and releases, bucket collectives as gradients complete.
  struct Hooks {
    ShardedStrategy* s;
    void pre_forward(int u) { s->pre_forward(u); }
    void post_forward(int u) { s->post_forward(u); }
    void pre_backward(int u) { s->pre_backward(u); }
    void post_backward(int u) { s->post_backward(u); }
  };

  ShardedStrategy(const Context<B>& ctx, Model& model, Comm& comm, AdamW optimizer = AdamW{},
                  ShardedOptions options = {})
      : ctx_(&ctx),
        model_(&model),
        comm_(&comm),
        optimizer_(optimizer),
        options_(options),
        rank_(comm.rank()),
        size_(comm.size()),
        params_(model, Stage, size_, options.bucket_bytes, options.unit_segments),
        model_grads_released_(release_model_grads()),
        owner_rank_(policy::shards_optimizer_state ? rank_ : 0),
        tiles_(shard_tiles()),
        state_(ctx, state_segments()),
        weights_(place_weights()),
        reducer_(ctx, comm, params_, queue_, options.overlap),
        gatherer_(ctx, comm, params_, queue_, policy::shards_params ? weights_.data() : nullptr),
        scalars_(ctx) {
    for (int s = 0; s < params_.segment_count(); ++s) {
      params_.bind_weights(
          s, !policy::shards_params ? weights_.data() + layout().segment(s).offset : nullptr);
    }
    hooks_.s = this;
  }
  ShardedStrategy(const ShardedStrategy&) = delete;
  ShardedStrategy& operator=(const ShardedStrategy&) = delete;
  ~ShardedStrategy() { queue_.drain(); }

  // ---- training_strategy --------------------------------------------------------------------
  [[nodiscard]] int dp_rank() const { return rank_; }
  [[nodiscard]] int dp_size() const { return size_; }
  [[nodiscard]] Model& model() { return *model_; }
  [[nodiscard]] const Context<B>& context() const { return *ctx_; }
  [[nodiscard]] const AdamW& optimizer() const { return optimizer_; }
  [[nodiscard]] Hooks& hooks() { return hooks_; }

  /// Slot 0 of the step's device scalars: a model adds its loss here (StepScalars).
  [[nodiscard]] double* device_loss_sum() { return scalars_.slot(0); }

  void begin_step() {
    reducer_.begin_step();
    scalars_.clear(2);
  }
  void begin_micro_batch(int i, int n) { reducer_.begin_micro_batch(i, n); }
  void end_micro_batch(int /*i*/, int /*n*/) {
    reducer_.end_micro_batch();
    if constexpr (policy::shards_params) gatherer_.release_all();
  }
  /// After a forward that no backward follows (`Trainer::evaluate`): stage 3 frees the units the
  /// hooks kept gathered for the backward.
  void end_forward_only() {
    if constexpr (policy::shards_params) gatherer_.release_all();
  }
  /// `local`, this rank's Σ loss·rows of an evaluation, summed over the data-parallel group (a
  /// collective; a model-parallel model's loss is already whole on each of its ranks).
  double sum_loss(double local) { return scalars_.sum(*comm_, std::array<double, 1>{local})[0]; }
  /// Without a model-parallel model, Σg² of what this rank holds (the reduced replica, or its
  /// shards) goes by one multi-tensor reduction into the device scalars beside the loss sum; one
  /// all-reduce sums them over the group (Σg² only where the ranks hold different shards) and one
  /// read-back brings both: the step's one synchronising call.
  StepReport finish_step(const StepControl& c) {
    reducer_.before_step();
    // on the device: the scalars' all-reduce below, host-waited on the same communicator and
    // ordered after these, bounds them with its deadline (parallel/work_queue.hpp)
    queue_.order_all();
    double ss = 0.0;
    StepReport r;
    if constexpr (model_parallel_model<Model>) {
      // Σg² of this rank's counted tiles beside the loss, summed over the replicas (Σg² only
      // where they hold different shards) and over the model's groups in place: one read-back
      if (!c.loss_on_device) scalars_.set(0, c.loss_sum);
      scalars_.zero(1);
      ops::sum_squares_into(*ctx_, scalars_.slot(1), counted_gradients());
      scalars_.reduce(*comm_, 0, policy::shards_optimizer_state ? 2 : 1);
      model_->sum_over_model_parallel(scalars_, 1);
      const auto sums = scalars_.template read<2>();
      r.loss_sum = sums[0];
      ss = sums[1];
    } else {
      if (!c.loss_on_device) scalars_.set(0, c.loss_sum);
      std::vector<std::span<const T>> held;
      if constexpr (!policy::shards_optimizer_state) {
        // every rank holds the same reduced gradients: Σg² is local
        held.emplace_back(reducer_.full(), static_cast<std::size_t>(layout().padded()));
      } else if constexpr (!policy::shards_grads) {
        for (int s = 0; s < layout().segment_count(); ++s) {
          held.emplace_back(reducer_.full() + layout().owned_begin(s, rank_),
                            static_cast<std::size_t>(layout().segment(s).shard));
        }
      } else {
        held.emplace_back(reducer_.shard(), static_cast<std::size_t>(layout().shard()));
      }
      scalars_.zero(1);  // Σg² is this call's alone, whether or not begin_step ran
      ops::sum_squares_into(*ctx_, scalars_.slot(1), held);
      const auto sums =
          scalars_.template read_summed<2>(*comm_, policy::shards_optimizer_state ? 2 : 1);
      r.loss_sum = sums[0];
      ss = sums[1];
    }
    r.found_inf = c.check_finite && !std::isfinite(ss);
    std::vector<SegmentBinding<T>> bindings;
    bindings.reserve(tiles_.size());
    for (const auto& t : tiles_) bindings.push_back({weight_at(t), grad_at(t)});
    r = apply_optimizer_step(*ctx_, optimizer_, state_, c, r, ss, bindings);
    if constexpr (policy::shards_optimizer_state && !policy::shards_params) {
      if (!r.skipped) gather_working_weights();
    }
    return r;
  }

  // ---- driven unit by unit (a pipeline's schedule, train/pipeline_strategy.hpp) -----------------
  // Instead of the hooks, whose order is the model's forward and backward, a caller that runs the
  // units in its own order (pp::Executor: micro-batches interleaved, backward split into B and W)
  // brackets each unit with these; with `unit_segments` every segment is one unit's. Every rank
  // of the group must make the same calls in the same order (the collectives are issued here).

  /// Stage 3: unit u's weights all-gathered and bound (waits); a no-op under stages 0-2.
  void gather_unit(int u) {
    if constexpr (policy::shards_params) gatherer_.acquire(u);
  }
  /// Stage 3: unit u's gathered weights freed.
  void release_unit(int u) {
    if constexpr (policy::shards_params) gatherer_.release(u, -1);
  }
  /// Stages 2-3: unit u's gradients bound to full buffers that carry the step's shard so far.
  void open_unit_gradients(int u) { reducer_.open_unit(u); }
  /// Stages 2-3: the segments unit u completes reduce-scattered into the shard (waited), their
  /// full buffers freed.
  void reduce_unit_gradients(int u) { reducer_.reduce_unit(u); }
  /// Stages 2-3: this rank's reduced gradient shard of parameter `p`, which must be a segment of
  /// its own (the model's `own_segment`): elements [r·shard, (r+1)·shard) of it, padding
  /// included, so that two such parameters of the same shape hold the same elements on a rank.
  [[nodiscard]] std::span<T> gradient_shard_of(const Parameter<T, B>& p) {
    static_assert(policy::shards_grads,
                  "fourway: gradient_shard_of needs sharded gradients (ZeRO-2 or 3)");
    const int i = params_.index_of(p);
    check<ConfigError>(i >= 0, "fourway: gradient_shard_of: '", p.name,
                       "' is not a parameter of the model");
    const int s = params_.segment_of(i);
    const auto& seg = layout().segment(s);
    check<ConfigError>(layout().slots_of(s).size() == 1, "fourway: gradient_shard_of: '", p.name,
                       "' shares its segment with other parameters; the model must mark it "
                       "own_segment");
    return {reducer_.shard() + seg.shard_offset, static_cast<std::size_t>(seg.shard)};
  }

  // ---- loading and saving: each rank touches only what it owns --------------------------------

  /// Overwrites the weights with values from `read(p, first, count, host)` (elements [first,
  /// first + count) of parameter `p` into the host buffer `host`, at most 2^16 at a time) and
  /// restarts the fp32 masters from them. Each rank asks only for the elements it owns (stage 0:
  /// every element; it is a replica); stages 1-2 then all-gather the working weights, so it is a
  /// collective there. Call it before the first step (the Adam moments are left as they are).
  template <class Source>
  void load_weights(Source&& read) {
    queue_.wait_all();
    std::vector<T> host;
    for_each_owned_run(false, [&](const FlatSlot& slot, std::int64_t first, T* at, std::int64_t n) {
      host.resize(static_cast<std::size_t>(n));
      read(params_.parameter(slot.param), first, n, host.data());
      ops::from_host(*ctx_, at, host.data(), n);
    });
    for (std::size_t i = 0; i < tiles_.size(); ++i) {
      state_.init_master(*ctx_, i, weight_at(tiles_[i]));
    }
    if constexpr (policy::shards_optimizer_state && !policy::shards_params) {
      gather_working_weights();
    }
  }

  /// Waits for every operation the strategy queued (the working weights' all-gather of ZeRO-1/2
  /// after a step): what `checkpoint_runs` points at is then final (train/weights_save.hpp).
  void wait_idle() { queue_.wait_all(); }

  /// Checkpoints (state_runs.hpp): hands this rank's optimizer state to `put(tensor, first,
  /// values)` — its shard under stages 1-3, its 1/N of every parameter under stage 0, so over
  /// the group every element once. Nothing is gathered.
  [[nodiscard]] std::vector<OwnedRun<T, B>> saved_state_runs() const { return owned_runs(true); }
  /// The ranks a checkpoint is written by: the group, times the model's tensor-parallel group.
  [[nodiscard]] int checkpoint_ranks() const {
    if constexpr (requires { model_->tp_size(); }) {
      return size_ * model_->tp_size();
    } else {
      return size_;
    }
  }
  /// The global runs this rank writes (`saving`: its shard, or its 1/N; the model's view says
  /// where its parameters lie in the global tensors) or loads (everything it owns).
  [[nodiscard]] std::vector<StateRun<T, B>> checkpoint_runs(bool saving) const {
    const auto owned = owned_runs(saving);
    return state_runs(*model_, owned, saving);
  }
  template <class Put>
  void save_state(Put&& put) {
    queue_.wait_all();
    const auto runs = checkpoint_runs(true);
    save_state_runs(*ctx_, state_, runs, put);
  }
  /// Fills the masters, moments and working weights this rank owns (stage 0: all of them) from
  /// `read(tensor, first, n, host)`, whatever mesh wrote them. No communication: after every
  /// rank loaded (and agreed it did), `sync_loaded_state()` all-gathers the working weights
  /// under stages 1-2 (a collective there, a no-op otherwise).
  template <class Read>
  void load_state(int adam_step, Read&& read) {
    queue_.wait_all();
    const auto runs = checkpoint_runs(false);
    load_state_runs(*ctx_, state_, runs, read);
    state_.restore_step(adam_step);
  }
  void sync_loaded_state() {
    if constexpr (policy::shards_optimizer_state && !policy::shards_params) {
      gather_working_weights();
      queue_.wait_all();
    }
  }

  // ---- inspection -----------------------------------------------------------------------------
  [[nodiscard]] const FlatLayout& layout() const { return params_.flat(); }
  [[nodiscard]] const MasterState<T, B>& state() const { return state_; }
  [[nodiscard]] const ShardedOptions& options() const { return options_; }
  /// The segments unit `u` needs gathered (stage 3) / whose gradients it adds to (stages 2, 3).
  [[nodiscard]] const std::vector<int>& unit_segments(int u) const {
    return params_.unit_segments(u);
  }
  /// Peak bytes of gathered (full) parameter segments held at once since the last reset (stage 3).
  [[nodiscard]] std::int64_t gathered_peak_bytes() const { return gatherer_.peak_bytes(); }
  /// The packed buffer the step's scalars are all-reduced in (backend memory).
  [[nodiscard]] const StepScalars<B>& step_scalars() const { return scalars_; }
  void reset_gathered_peak() { gatherer_.reset_peak(); }

  /// Every parameter's full value in fp32, in `visit_parameters` order. A collective under
  /// stage 3 (segments are all-gathered): every rank of the group must call it.
  std::vector<std::vector<float>> gather_full_parameters() {
    std::vector<std::vector<float>> out(params_.parameter_count());
    for (int s = 0; s < layout().segment_count(); ++s) {
      const auto& seg = layout().segment(s);
      const T* base = nullptr;
      Tensor<T, B> tmp;
      if constexpr (policy::shards_params) {
        tmp = Tensor<T, B>(Shape{seg.padded}, MemTag::workspace, ctx_->memory());
        comm_->all_gather(weights_.data() + seg.shard_offset, tmp.data(), seg.shard);
        base = tmp.data() - seg.offset;
      } else {
        base = weights_.data();
      }
      for (const auto& slot : layout().slots_of(s)) {
        std::vector<T> host(static_cast<std::size_t>(slot.numel));
        ops::to_host(*ctx_, host.data(), base + slot.offset, slot.numel);
        auto& dst = out[static_cast<std::size_t>(slot.param)];
        dst.resize(host.size());
        for (std::size_t i = 0; i < host.size(); ++i) dst[i] = convert<float>(host[i]);
      }
    }
    return out;
  }

  /// Runs `f()` with every parameter of the model bound to its full value (to save a checkpoint
  /// or evaluate). A collective under stage 3, where every segment is gathered for the call.
  template <class F>
  void with_gathered_parameters(F&& f) {
    if constexpr (policy::shards_params) {
      queue_.wait_all();
      for (int u = 0; u < params_.units(); ++u) gatherer_.start(u);
      for (int u = 0; u < params_.units(); ++u) gatherer_.acquire(u);
      try {
        f();
      } catch (...) {
        gatherer_.release_all();
        throw;
      }
      gatherer_.release_all();
    } else {
      f();
    }
  }

  /// What this rank holds: segments, shard elements, padding (for fourway-train's start-up print).
  [[nodiscard]] std::string describe() const {
    const FlatLayout& l = layout();
    std::ostringstream os;
    os << l.segment_count() << (policy::shards_params ? " units" : " buckets") << ", " << l.numel()
       << " parameters";
    if constexpr (!policy::shards_optimizer_state) {
      os << ", holds all of them";
    } else {
      os << " padded to " << l.padded() << " (+" << l.padding() << "), owns a shard of "
         << l.shard() << " elements = [";
      for (int s = 0; s < l.segment_count(); ++s) {
        os << (s ? " " : "") << l.owned_begin(s, rank_) - l.segment(s).offset << "+"
           << l.segment(s).shard;
      }
      os << "] of each segment";
    }
    return os.str();
  }

 private:
  using ops = Ops<B>;
  static T zero() { return convert<T>(0.0f); }

  /// A run of the rank's shard: a parameter piece (slot >= 0) or padding (slot = -1).
  struct Tile {
    int slot = -1;
    std::int64_t shard_offset = 0;  // in the shard buffer (stages 2, 3)
    std::int64_t flat_offset = 0;   // in the full flat buffer (stages 0, 1, 2)
    std::int64_t count = 0;
    bool decay = false;
  };

  std::vector<Tile> shard_tiles() const {
    const FlatLayout& l = layout();
    std::vector<Tile> tiles;
    const auto pieces = l.owned_pieces(owner_rank_);
    std::size_t k = 0;
    for (int s = 0; s < l.segment_count(); ++s) {
      const auto& seg = l.segment(s);
      const std::int64_t lo = l.owned_begin(s, owner_rank_);
      std::int64_t at = 0;  // elements of this segment's part covered so far
      for (; k < pieces.size() && l.slots()[pieces[k].slot].segment == s; ++k) {
        const auto& pc = pieces[k];
        const auto& slot = l.slots()[pc.slot];
        tiles.push_back(Tile{pc.slot, pc.shard_offset, slot.offset + pc.param_offset, pc.count,
                             params_.parameter(slot.param).decay});
        at += pc.count;
      }
      if (at < seg.shard) {  // padding (or an empty part): kept at zero, never decayed
        tiles.push_back(Tile{-1, seg.shard_offset + at, lo + at, seg.shard - at, false});
      }
    }
    return tiles;
  }

  std::vector<StateSegment> state_segments() const {
    std::vector<StateSegment> out;
    std::int64_t off = 0;
    for (const auto& t : tiles_) {
      out.push_back(StateSegment{off, t.count, t.decay});
      off += t.count;
    }
    return out;
  }

  /// A materialised model's own gradients (zeros; the reducer binds its buffers in their place)
  /// are freed before the strategy allocates anything, so construction never holds both.
  bool release_model_grads() {
    for (int s = 0; s < params_.segment_count(); ++s) params_.bind_grads(s, nullptr);
    return true;
  }

  /// The working weights (stages 0-2: every weight, Ψ'; stage 3: the rank's shard, Ψ'/N),
  /// copied from the model's own storage or, for a deferred model, computed from the init rules
  /// (only the rank's own elements under stage 3), and the fp32 masters initialised from them.
  /// The model's own weight storage is freed once copied (the constructor binds the parameters).
  Tensor<T, B> place_weights() {
    const FlatLayout& l = layout();
    Tensor<T, B> w(Shape{policy::shards_params ? l.shard() : l.padded()}, MemTag::weights,
                   ctx_->memory());
    ops::fill(*ctx_, w.data(), w.numel(), zero());
    if constexpr (!policy::shards_params) {
      for (const auto& slot : l.slots()) {
        write_initial_values(*ctx_, params_.parameter(slot.param), w.data() + slot.offset, 0,
                             slot.numel);
      }
    } else {
      for (const auto& t : tiles_) {
        if (t.slot < 0) continue;
        const auto& slot = l.slots()[t.slot];
        write_initial_values(*ctx_, params_.parameter(slot.param), w.data() + t.shard_offset,
                             t.flat_offset - slot.offset, t.count);
      }
    }
    for (int s = 0; s < params_.segment_count(); ++s) params_.bind_weights(s, nullptr);
    for (std::size_t i = 0; i < tiles_.size(); ++i) {
      state_.init_master(
          *ctx_, i,
          w.data() + (policy::shards_params ? tiles_[i].shard_offset : tiles_[i].flat_offset));
    }
    return w;
  }

  /// Stages 1-2: every rank's updated shard of the working weights to every rank.
  void gather_working_weights() {
    for (int s = 0; s < layout().segment_count(); ++s) {
      const auto& seg = layout().segment(s);
      queue_.push(comm_->all_gather_async(weights_.data() + layout().owned_begin(s, rank_),
                                          weights_.data() + seg.offset, seg.shard));
    }
    queue_.order_all();  // the next forward reads them in the stream's order
  }

  /// `f(slot, first, at, n)` for runs of at most 2^16 of the rank's parameter elements: element
  /// `first` of parameter `slot.param` lives at `at` in the working weights. With `split`,
  /// stage 0 (where every rank holds everything) visits only the rank's 1/N of each parameter.
  template <class F>
  void for_each_owned_run(bool split, F&& f) {
    const FlatLayout& l = layout();
    constexpr std::int64_t chunk = 1 << 16;
    for (const auto& t : tiles_) {
      if (t.slot < 0) continue;
      const auto& slot = l.slots()[t.slot];
      const auto [lo, hi] = owned_range(t, split);
      for (std::int64_t at = lo; at < hi; at += chunk) {
        const std::int64_t n = std::min(chunk, hi - at);
        f(slot, t.flat_offset - slot.offset + at, weight_at(t) + at, n);
      }
    }
  }

  /// The elements [lo, hi) of tile `t` this rank visits: all of them, or with `split` when the
  /// optimizer state is not sharded (every rank holds everything) the rank's 1/N.
  std::pair<std::int64_t, std::int64_t> owned_range(const Tile& t, bool split) const {
    if (!split || policy::shards_optimizer_state) return {0, t.count};
    const std::int64_t part = shard_numel(t.count, size_);
    const std::int64_t lo = std::min(t.count, rank_ * part);
    return {lo, std::min(t.count, lo + part)};
  }

  /// The rank's state as runs of parameter elements; with `split`, stage 0 keeps only the
  /// rank's 1/N of each parameter (the part it writes).
  std::vector<OwnedRun<T, B>> owned_runs(bool split) const {
    std::vector<OwnedRun<T, B>> runs;
    for (std::size_t i = 0; i < tiles_.size(); ++i) {
      const Tile& t = tiles_[i];
      if (t.slot < 0) continue;
      const auto& slot = layout().slots()[t.slot];
      const auto [lo, hi] = owned_range(t, split);
      if (hi > lo) {
        runs.push_back({&params_.parameter(slot.param), t.flat_offset - slot.offset + lo, hi - lo,
                        i, lo, weight_at(t) + lo, slot.param});
      }
    }
    return runs;
  }

  T* weight_at(const Tile& t) const {
    return weights_.data() + (policy::shards_params ? t.shard_offset : t.flat_offset);
  }
  const T* grad_at(const Tile& t) const {
    if constexpr (!policy::shards_grads) {
      return reducer_.full() + t.flat_offset;
    } else {
      return reducer_.shard() + t.shard_offset;
    }
  }

  /// Σg² over the tiles of the parameters this rank counts (model_parallel_model: a replicated
  /// parameter on one tensor-parallel rank only); finish_step sums it over the data-parallel
  /// shards (stages 1-3, with the loss in one packed all-reduce) and the model-parallel group.
  /// The gradients of this rank's tiles that count in the global norm (a model-parallel model
  /// counts a replicated parameter on one rank of its group).
  std::vector<std::span<const T>> counted_gradients() {
    std::vector<std::span<const T>> held;
    for (const auto& t : tiles_) {
      if (t.slot < 0 || !model_->counts_in_norm(layout().slots()[t.slot].param)) continue;
      held.emplace_back(grad_at(t), static_cast<std::size_t>(t.count));
    }
    return held;
  }

  // ---- hooks ----------------------------------------------------------------------------------
  [[nodiscard]] int units() const { return params_.units(); }

  void pre_forward(int u) {
    if (u == 0) reducer_.begin_forward();
    if constexpr (policy::shards_params) {
      gatherer_.acquire(u);
      if (options_.overlap) gatherer_.start(u + 1 < units() ? u + 1 : units() - 1);
    }
  }
  void post_forward(int u) {
    if constexpr (policy::shards_params) {
      gatherer_.release(u, u + 1 < units() ? u + 1 : units() - 1);
    }
  }
  void pre_backward(int u) {
    queue_.poll();
    if constexpr (policy::shards_params) {
      gatherer_.acquire(u);
      if (options_.overlap && u > 0) gatherer_.start(u - 1);
    }
    reducer_.pre_backward(u);
  }
  void post_backward(int u) {
    reducer_.post_backward(u);
    if constexpr (policy::shards_params) gatherer_.release(u, u > 0 ? u - 1 : -1);
    queue_.poll();
  }

  const Context<B>* ctx_;
  Model* model_;
  Comm* comm_;
  AdamW optimizer_;
  ShardedOptions options_;
  int rank_;
  int size_;
  ParameterLayout<T, B> params_;
  bool model_grads_released_;  // before anything below is allocated (release_model_grads)
  int owner_rank_;
  std::vector<Tile> tiles_;
  MasterState<T, B> state_;
  Tensor<T, B> weights_;  // stages 0-2: (Ψ') every weight; stage 3: (Ψ'/N) this rank's shard
  WorkQueue queue_;
  GradientReducer<Stage, T, B, Comm> reducer_;
  UnitGatherer<T, B, Comm> gatherer_;
  StepScalars<B> scalars_;
  Hooks hooks_{};
};

/// Maps a data-parallel policy tag to its strategy (`data_parallel_stage_v`, parallel/).
template <class Policy, class Model, class P, class B, class Comm>
struct data_parallel_strategy {
  using type = ShardedStrategy<data_parallel_stage_v<Policy>, Model, P, B, Comm>;
};

template <class Policy, class Model, class P, class B, class Comm>
using data_parallel_strategy_t = typename data_parallel_strategy<Policy, Model, P, B, Comm>::type;

/// Full replicas with bucketed, overlapped gradient all-reduce (ZeRO stage 0).
template <class Model, class P, class B, class Comm>
using DataParallelStrategy = ShardedStrategy<0, Model, P, B, Comm>;

}  // namespace fourway
