//! `ShardedStrategy<Stage, Model, Precision, B, Comm>`: data parallelism (Stage 0) and ZeRO /
//! FSDP (Stages 1, 2, 3) as a training strategy (train/strategy.hpp) over one data-parallel group.
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
//!
//!   flat buffer of segment s      | p0 ..... | p1 ........ | pad |
//!   rank                          |   r0     |   r1    |   r2    |   rank r owns [r·S_s, (r+1)·S_s)
//! ```
//! Segments are gradient buckets (stages 0-2, packed in backward order, `bucket_bytes` each) or
//! FSDP units (stage 3, one segment per unit). A parameter belongs to the segment of the *last*
//! unit whose backward touches it (the tied `wte` of the GPT: unit 0), so a segment's gradients
//! are final after that unit's `post_backward`. Overlap: a bucket's collective is issued
//! asynchronously in the `post_backward` that completes it; under stage 3 the next unit's
//! all-gather is issued in `pre_forward`/`pre_backward` of the current one (prefetch). All work is
//! waited on before the optimizer. The gathered set of the last forward unit is kept into the
//! first backward unit (it is needed again at once). Gradients are SUMMED over ranks (the Trainer
//! already weighted each micro-batch by its share of the global batch).
//!
//! fp16: the overflow check is `!isfinite(global Σg²)` after the Σg² all-reduce, so every rank
//! sees the same verdict and skips together. Micro-batches: stages 0 and 1 communicate in the
//! last micro-batch only (gradients accumulate locally before); stages 2 and 3 reduce-scatter
//! every micro-batch (their full gradients do not persist) and accumulate in the shard: the
//! shard so far is copied into the rank's own slice of the full bucket before the next
//! reduce-scatter, so the sum carries it.
//!
//! The strategy keeps pointers to the context, the model and the communicator (which must outlive
//! it) and rebinds every parameter's `weight` and `grad` to views of its own buffers: the layers'
//! storage is freed at construction. The model needs `units()`, `visit_parameters(f)` and
//! `visit_unit_parameters(u, f)` (docs/contracts.md, FSDP units).
//! Initial weights must be identical on every rank (fw::models::Gpt's init depends only on seed
//! and parameter name); they are not broadcast. See docs/parallel.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/dispatch.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/parallel/flat_layout.hpp"
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
};

template <int Stage, class Model, precision_policy P, backend B, class Comm>
class ShardedStrategy {
  static_assert(Stage >= 0 && Stage <= 3,
                "fourway: ShardedStrategy<Stage, ...> needs Stage 0 (DataParallel), 1 (optimizer "
                "state), 2 (+ gradients) or 3 (+ parameters, FSDP)");
  static_assert(communicator<Comm>,
                "fourway: ShardedStrategy needs Comm to model fw::communicator (LocalComm, "
                "MpiComm, NcclComm or Counting<...> of one)");

 public:
  using model_type = Model;
  using precision_type = P;
  using backend_type = B;
  using param_type = typename P::param_type;
  using T = param_type;
  static constexpr int stage = Stage;

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
        layout_(build_layout()),
        owner_rank_(Stage == 0 ? 0 : rank_),
        tiles_(shard_tiles()),
        state_(ctx, state_segments()) {
    place_parameters();
    hooks_.s = this;
  }
  ShardedStrategy(const ShardedStrategy&) = delete;
  ShardedStrategy& operator=(const ShardedStrategy&) = delete;
  ~ShardedStrategy() {
    for (auto& w : works_) {
      try {
        w.work.wait();
      } catch (...) {
      }
    }
  }

  // ---- training_strategy --------------------------------------------------------------------
  [[nodiscard]] int dp_rank() const { return rank_; }
  [[nodiscard]] int dp_size() const { return size_; }
  [[nodiscard]] Model& model() { return *model_; }
  [[nodiscard]] const Context<B>& context() const { return *ctx_; }
  [[nodiscard]] const AdamW& optimizer() const { return optimizer_; }
  [[nodiscard]] Hooks& hooks() { return hooks_; }

  void begin_step() {
    if constexpr (Stage <= 1) {
      ops::fill(*ctx_, full_g_.data(), full_g_.numel(), zero());
    } else {
      ops::fill(*ctx_, shard_g_.data(), shard_g_.numel(), zero());
    }
  }
  void begin_micro_batch(int i, int n) {
    micro_ = i;
    micro_count_ = n;
  }
  void end_micro_batch(int /*i*/, int /*n*/) {
    if constexpr (Stage >= 2) {
      if (!options_.overlap) {
        for (int s = 0; s < layout_.segment_count(); ++s) launch_reduce(s);
      }
      if constexpr (Stage == 3) release_all_gathered();
    }
  }
  [[nodiscard]] double sum_over_data_parallel(double x) {
    comm_->all_reduce(&x, &x, 1, ReduceOp::sum);
    return x;
  }

  StepReport finish_step(const StepControl& c) {
    if constexpr (Stage <= 1) {
      if (!options_.overlap) {
        for (int s = 0; s < layout_.segment_count(); ++s) launch_reduce(s);
      }
    }
    wait_all();
    double ss = 0.0;
    if constexpr (Stage == 0) {
      ss = ops::sum_squares(*ctx_, full_g_.data(), full_g_.numel());
    } else {
      if constexpr (Stage == 1) {
        for (const auto& seg : layout_.segments()) {
          ss += ops::sum_squares(*ctx_, full_g_.data() + layout_.owned_begin(seg_index(seg), rank_),
                                 seg.shard);
        }
      } else {
        ss = ops::sum_squares(*ctx_, shard_g_.data(), shard_g_.numel());
      }
      comm_->all_reduce(&ss, &ss, 1, ReduceOp::sum);
    }
    StepReport r;
    r.found_inf = c.check_finite && !std::isfinite(ss);
    std::vector<SegmentBinding<T>> bindings;
    bindings.reserve(tiles_.size());
    for (const auto& t : tiles_) bindings.push_back({weight_at(t), grad_at(t)});
    r = apply_optimizer_step(*ctx_, optimizer_, state_, c, r, ss, bindings);
    if constexpr (Stage == 1 || Stage == 2) {
      if (!r.skipped) {
        for (int s = 0; s < layout_.segment_count(); ++s) {
          const auto& seg = layout_.segment(s);
          works_.push_back({comm_->all_gather_async(full_w_.data() + layout_.owned_begin(s, rank_),
                                                    full_w_.data() + seg.offset, seg.shard),
                            -1, Pending::none});
        }
        wait_all();
      }
    }
    return r;
  }

  // ---- inspection -----------------------------------------------------------------------------
  [[nodiscard]] const FlatLayout& layout() const { return layout_; }
  [[nodiscard]] const MasterState<T, B>& state() const { return state_; }
  [[nodiscard]] const ShardedOptions& options() const { return options_; }
  /// The segments unit `u` needs gathered (stage 3) / whose gradients it adds to (stages 2, 3).
  [[nodiscard]] const std::vector<int>& unit_segments(int u) const {
    return touch_.at(static_cast<std::size_t>(u));
  }
  /// Peak bytes of gathered (full) parameter segments held at once since the last reset (stage 3).
  [[nodiscard]] std::int64_t gathered_peak_bytes() const { return gathered_peak_; }
  void reset_gathered_peak() { gathered_peak_ = gathered_now_; }

  /// Every parameter's full value in fp32, in `visit_parameters` order. A collective under
  /// stage 3 (segments are all-gathered): every rank of the group must call it.
  std::vector<std::vector<float>> gather_full_parameters() {
    std::vector<std::vector<float>> out(params_.size());
    for (int s = 0; s < layout_.segment_count(); ++s) {
      const auto& seg = layout_.segment(s);
      const T* base = nullptr;
      Tensor<T, B> tmp;
      if constexpr (Stage == 3) {
        tmp = Tensor<T, B>(Shape{seg.padded}, MemTag::workspace, ctx_->memory());
        comm_->all_gather(shard_w_.data() + seg.shard_offset, tmp.data(), seg.shard);
        base = tmp.data() - seg.offset;
      } else {
        base = full_w_.data();
      }
      for (const auto& slot : layout_.slots_of(s)) {
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
    if constexpr (Stage == 3) {
      wait_all();
      for (int u = 0; u < units(); ++u) start_gathers(u);
      for (int u = 0; u < units(); ++u) acquire(u);
      try {
        f();
      } catch (...) {
        release_all_gathered();
        throw;
      }
      release_all_gathered();
    } else {
      f();
    }
  }

  /// What this rank holds: segments, shard elements, padding (for fourway-train's start-up print).
  [[nodiscard]] std::string describe() const {
    std::ostringstream os;
    os << "rank " << rank_ << "/" << size_ << " stage " << Stage << ": "
       << layout_.segment_count() << (Stage == 3 ? " units" : " buckets") << ", "
       << layout_.numel() << " parameters";
    if constexpr (Stage == 0) {
      os << ", holds all of them";
    } else {
      os << " padded to " << layout_.padded() << " (+" << layout_.padding()
         << "), owns a shard of " << layout_.shard() << " elements = [";
      for (int s = 0; s < layout_.segment_count(); ++s) {
        const auto& seg = layout_.segment(s);
        os << (s ? " " : "") << layout_.owned_begin(s, rank_) - seg.offset << "+" << seg.shard;
      }
      os << "] of each segment";
    }
    return os.str();
  }

 private:
  using ops = detail::optim_ops<B>;
  static T zero() { return convert<T>(0.0f); }

  enum class Pending : std::uint8_t { none, free_grad, gathered };
  struct InFlight {
    Work work;
    int segment;
    Pending then;
  };
  /// A run of the rank's shard: a parameter piece (slot >= 0) or padding (slot = -1).
  struct Tile {
    int slot = -1;
    std::int64_t shard_offset = 0;  // in the shard buffer (stages 2, 3)
    std::int64_t flat_offset = 0;   // in the full flat buffer (stages 0, 1, 2)
    std::int64_t count = 0;
    bool decay = false;
  };

  int seg_index(const FlatSegment& seg) const {
    return static_cast<int>(&seg - layout_.segments().data());
  }

  // ---- construction ---------------------------------------------------------------------------
  FlatLayout build_layout() {
    check<ConfigError>(size_ >= 1, "fourway: data-parallel group of ", size_, " ranks");
    model_->visit_parameters([&](Parameter<T, B>& p) {
      index_[&p] = static_cast<int>(params_.size());
      params_.push_back(&p);
      shapes_.push_back(p.weight.shape());
    });
    const int U = model_->units();
    std::vector<int> last_unit(params_.size(), -1);
    unit_params_.assign(static_cast<std::size_t>(U), {});
    for (int u = 0; u < U; ++u) {
      model_->visit_unit_parameters(u, [&](Parameter<T, B>& p) {
        const int i = index_.at(&p);
        unit_params_[static_cast<std::size_t>(u)].push_back(i);
        auto& l = last_unit[static_cast<std::size_t>(i)];
        l = l < 0 ? u : std::min(l, u);
      });
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      check<ConfigError>(last_unit[i] >= 0, "fourway: parameter '", params_[i]->name,
                         "' belongs to no unit of the model; every parameter must be visited by "
                         "visit_unit_parameters");
    }
    std::vector<std::vector<std::pair<int, std::int64_t>>> segs;
    if constexpr (Stage == 3) {
      segs.resize(static_cast<std::size_t>(U));
      for (std::size_t i = 0; i < params_.size(); ++i) {
        segs[static_cast<std::size_t>(last_unit[i])].emplace_back(static_cast<int>(i),
                                                                   shapes_[i].numel());
      }
      for (int u = 0; u < U; ++u) ready_unit_.push_back(u);
    } else {
      std::vector<int> order;  // backward order: by last unit descending, then reverse visit
      for (int u = U - 1; u >= 0; --u) {
        for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
          if (last_unit[static_cast<std::size_t>(i)] == u) order.push_back(i);
        }
      }
      std::vector<std::int64_t> numels;
      for (int i : order) numels.push_back(shapes_[static_cast<std::size_t>(i)].numel());
      for (const auto& bucket : plan_buckets(numels, options_.bucket_bytes, sizeof(T))) {
        auto& seg = segs.emplace_back();
        int ready = U;
        for (int k : bucket) {
          const int i = order[static_cast<std::size_t>(k)];
          seg.emplace_back(i, numels[static_cast<std::size_t>(k)]);
          ready = std::min(ready, last_unit[static_cast<std::size_t>(i)]);
        }
        ready_unit_.push_back(ready);
      }
    }
    FlatLayout layout(segs, Stage == 0 ? 1 : size_);
    segment_of_.assign(params_.size(), 0);
    for (const auto& slot : layout.slots()) {
      segment_of_[static_cast<std::size_t>(slot.param)] = slot.segment;
    }
    touch_.assign(static_cast<std::size_t>(U), {});
    for (int u = 0; u < U; ++u) {
      auto& t = touch_[static_cast<std::size_t>(u)];
      for (int i : unit_params_[static_cast<std::size_t>(u)]) {
        t.push_back(segment_of_[static_cast<std::size_t>(i)]);
      }
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end()), t.end());
    }
    return layout;
  }

  std::vector<Tile> shard_tiles() const {
    std::vector<Tile> tiles;
    const auto pieces = layout_.owned_pieces(owner_rank_);
    std::size_t k = 0;
    for (int s = 0; s < layout_.segment_count(); ++s) {
      const auto& seg = layout_.segment(s);
      const std::int64_t lo = layout_.owned_begin(s, owner_rank_);
      std::int64_t at = 0;  // elements of this segment's part covered so far
      for (; k < pieces.size() && layout_.slots()[pieces[k].slot].segment == s; ++k) {
        const auto& pc = pieces[k];
        const auto& slot = layout_.slots()[pc.slot];
        tiles.push_back(Tile{pc.slot, pc.shard_offset, slot.offset + pc.param_offset, pc.count,
                             params_[static_cast<std::size_t>(slot.param)]->decay});
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

  /// Moves the model's weights into the strategy's buffers and rebinds every parameter to views.
  void place_parameters() {
    auto& mem = ctx_->memory();
    if constexpr (Stage <= 2) {
      full_w_ = Tensor<T, B>(Shape{layout_.padded()}, MemTag::weights, mem);
      ops::fill(*ctx_, full_w_.data(), full_w_.numel(), zero());
      for (const auto& slot : layout_.slots()) {
        auto& p = *params_[static_cast<std::size_t>(slot.param)];
        ops::copy(*ctx_, full_w_.data() + slot.offset, p.weight.data(), slot.numel);
      }
    } else {
      shard_w_ = Tensor<T, B>(Shape{layout_.shard()}, MemTag::weights, mem);
      ops::fill(*ctx_, shard_w_.data(), shard_w_.numel(), zero());
      for (const auto& t : tiles_) {
        if (t.slot < 0) continue;
        const auto& slot = layout_.slots()[t.slot];
        ops::copy(*ctx_, shard_w_.data() + t.shard_offset,
                  params_[static_cast<std::size_t>(slot.param)]->weight.data() +
                      (t.flat_offset - slot.offset),
                  t.count);
      }
    }
    for (std::size_t i = 0; i < tiles_.size(); ++i) state_.init_master(*ctx_, i, weight_at(tiles_[i]));
    if constexpr (Stage <= 1) {
      full_g_ = Tensor<T, B>(Shape{layout_.padded()}, MemTag::grads, mem);
      ops::fill(*ctx_, full_g_.data(), full_g_.numel(), zero());
    } else {
      shard_g_ = Tensor<T, B>(Shape{layout_.shard()}, MemTag::grads, mem);
      ops::fill(*ctx_, shard_g_.data(), shard_g_.numel(), zero());
      bucket_g_.resize(static_cast<std::size_t>(layout_.segment_count()));
      grad_pending_.assign(static_cast<std::size_t>(layout_.segment_count()), 0);
    }
    if constexpr (Stage == 3) {
      gathered_.resize(static_cast<std::size_t>(layout_.segment_count()));
      gathering_.assign(static_cast<std::size_t>(layout_.segment_count()), 0);
    }
    for (const auto& slot : layout_.slots()) {
      auto& p = *params_[static_cast<std::size_t>(slot.param)];
      const Shape shape = shapes_[static_cast<std::size_t>(slot.param)];
      if constexpr (Stage <= 2) {
        p.weight = Tensor<T, B>::view_of(full_w_.data() + slot.offset, shape);
      } else {
        p.weight = Tensor<T, B>::view_of(nullptr, shape);
      }
      if constexpr (Stage <= 1) {
        p.grad = Tensor<T, B>::view_of(full_g_.data() + slot.offset, shape);
      } else {
        p.grad = Tensor<T, B>::view_of(nullptr, shape);
      }
    }
    reduced_.assign(static_cast<std::size_t>(layout_.segment_count()), 0);
  }

  T* weight_at(const Tile& t) const {
    if constexpr (Stage <= 2) {
      return full_w_.data() + t.flat_offset;
    } else {
      return shard_w_.data() + t.shard_offset;
    }
  }
  const T* grad_at(const Tile& t) const {
    if constexpr (Stage <= 1) {
      return full_g_.data() + t.flat_offset;
    } else {
      return shard_g_.data() + t.shard_offset;
    }
  }

  // ---- hooks ----------------------------------------------------------------------------------
  [[nodiscard]] int units() const { return static_cast<int>(touch_.size()); }
  [[nodiscard]] bool last_micro_batch() const { return micro_ == micro_count_ - 1; }

  void pre_forward(int u) {
    if (u == 0) std::fill(reduced_.begin(), reduced_.end(), 0);
    if constexpr (Stage == 3) {
      acquire(u);
      if (options_.overlap) start_gathers(u + 1 < units() ? u + 1 : units() - 1);
    }
  }
  void post_forward(int u) {
    if constexpr (Stage == 3) release(u, u + 1 < units() ? u + 1 : units() - 1);
  }
  void pre_backward(int u) {
    poll();
    if constexpr (Stage == 3) {
      acquire(u);
      if (options_.overlap && u > 0) start_gathers(u - 1);
    }
    if constexpr (Stage >= 2) {
      for (int s : touch_[static_cast<std::size_t>(u)]) bind_bucket_grad(s);
    }
  }
  void post_backward(int u) {
    if (options_.overlap && (Stage >= 2 || last_micro_batch())) {
      for (int s = 0; s < layout_.segment_count(); ++s) {
        if (ready_unit_[static_cast<std::size_t>(s)] == u) launch_reduce(s);
      }
    }
    if constexpr (Stage == 3) release(u, u > 0 ? u - 1 : -1);
    poll();
  }

  /// Issues segment s's gradient collective (once per micro-batch for stages 2-3, once per step
  /// for stages 0-1).
  void launch_reduce(int s) {
    auto& done = reduced_[static_cast<std::size_t>(s)];
    if (done) return;
    done = 1;
    const auto& seg = layout_.segment(s);
    if constexpr (Stage == 0) {
      works_.push_back({comm_->all_reduce_async(full_g_.data() + seg.offset,
                                                full_g_.data() + seg.offset, seg.numel,
                                                ReduceOp::sum),
                        s, Pending::none});
    } else if constexpr (Stage == 1) {
      works_.push_back({comm_->reduce_scatter_async(full_g_.data() + seg.offset,
                                                    full_g_.data() + layout_.owned_begin(s, rank_),
                                                    seg.shard, ReduceOp::sum),
                        s, Pending::none});
    } else {
      auto& full = bucket_g_[static_cast<std::size_t>(s)];
      if (full.empty() && seg.padded > 0) bind_bucket_grad(s);
      grad_pending_[static_cast<std::size_t>(s)] = 1;
      works_.push_back({comm_->reduce_scatter_async(full.data(),
                                                    shard_g_.data() + seg.shard_offset, seg.shard,
                                                    ReduceOp::sum),
                        s, Pending::free_grad});
    }
  }

  /// Stages 2-3: the full gradient buffer of segment s, zeroed except for the rank's own slice,
  /// which carries the shard accumulated by earlier micro-batches.
  void bind_bucket_grad(int s) {
    if (grad_pending_[static_cast<std::size_t>(s)]) wait_for(s, Pending::free_grad);
    auto& full = bucket_g_[static_cast<std::size_t>(s)];
    if (!full.empty()) return;
    const auto& seg = layout_.segment(s);
    if (seg.padded == 0) return;
    full = Tensor<T, B>(Shape{seg.padded}, MemTag::grads, ctx_->memory());
    ops::fill(*ctx_, full.data(), seg.padded, zero());
    if (micro_ > 0) {
      ops::copy(*ctx_, full.data() + static_cast<std::int64_t>(rank_) * seg.shard,
                shard_g_.data() + seg.shard_offset, seg.shard);
    }
    for (const auto& slot : layout_.slots_of(s)) {
      params_[static_cast<std::size_t>(slot.param)]->grad = Tensor<T, B>::view_of(
          full.data() + (slot.offset - seg.offset), shapes_[static_cast<std::size_t>(slot.param)]);
    }
  }
  void free_bucket_grad(int s) {
    bucket_g_[static_cast<std::size_t>(s)].reset();
    for (const auto& slot : layout_.slots_of(s)) {
      params_[static_cast<std::size_t>(slot.param)]->grad =
          Tensor<T, B>::view_of(nullptr, shapes_[static_cast<std::size_t>(slot.param)]);
    }
  }

  // ---- stage 3: gathered segments -------------------------------------------------------------
  void start_gathers(int u) {
    for (int s : touch_[static_cast<std::size_t>(u)]) {
      const auto i = static_cast<std::size_t>(s);
      if (!gathered_[i].empty() || gathering_[i]) continue;
      const auto& seg = layout_.segment(s);
      if (seg.padded == 0) continue;
      gathered_[i] = Tensor<T, B>(Shape{seg.padded}, MemTag::weights, ctx_->memory());
      gathered_now_ += static_cast<std::int64_t>(seg.padded * sizeof(T));
      gathered_peak_ = std::max(gathered_peak_, gathered_now_);
      gathering_[i] = 1;
      works_.push_back({comm_->all_gather_async(shard_w_.data() + seg.shard_offset,
                                                gathered_[i].data(), seg.shard),
                        s, Pending::gathered});
    }
  }
  void acquire(int u) {
    start_gathers(u);
    for (int s : touch_[static_cast<std::size_t>(u)]) {
      const auto i = static_cast<std::size_t>(s);
      if (gathering_[i]) wait_for(s, Pending::gathered);
      const auto& seg = layout_.segment(s);
      if (seg.padded == 0) continue;
      for (const auto& slot : layout_.slots_of(s)) {
        params_[static_cast<std::size_t>(slot.param)]->weight = Tensor<T, B>::view_of(
            gathered_[i].data() + (slot.offset - seg.offset),
            shapes_[static_cast<std::size_t>(slot.param)]);
      }
    }
  }
  /// Frees the segments of unit u that unit `next` (-1: none) does not need.
  void release(int u, int next) {
    for (int s : touch_[static_cast<std::size_t>(u)]) {
      if (next >= 0) {
        const auto& keep = touch_[static_cast<std::size_t>(next)];
        if (std::find(keep.begin(), keep.end(), s) != keep.end()) continue;
      }
      drop_gathered(s);
    }
  }
  void drop_gathered(int s) {
    const auto i = static_cast<std::size_t>(s);
    if (gathering_[i]) wait_for(s, Pending::gathered);
    if (gathered_[i].empty()) return;
    gathered_now_ -= static_cast<std::int64_t>(gathered_[i].bytes());
    gathered_[i].reset();
    for (const auto& slot : layout_.slots_of(s)) {
      params_[static_cast<std::size_t>(slot.param)]->weight =
          Tensor<T, B>::view_of(nullptr, shapes_[static_cast<std::size_t>(slot.param)]);
    }
  }
  void release_all_gathered() {
    if constexpr (Stage == 3) {
      for (int s = 0; s < layout_.segment_count(); ++s) drop_gathered(s);
    }
  }

  // ---- completion -----------------------------------------------------------------------------
  void complete(InFlight& w) {
    w.work.wait();
    if (w.then == Pending::free_grad) {
      grad_pending_[static_cast<std::size_t>(w.segment)] = 0;
      free_bucket_grad(w.segment);
    }
    if (w.then == Pending::gathered) gathering_[static_cast<std::size_t>(w.segment)] = 0;
  }
  /// Completes, in issue order, what has finished; frees reduced gradient buckets early.
  void poll() {
    while (!works_.empty() && works_.front().work.test()) {
      InFlight w = std::move(works_.front());
      works_.erase(works_.begin());
      complete(w);
    }
  }
  void wait_for(int s, Pending what) {
    while (!works_.empty()) {
      InFlight w = std::move(works_.front());
      works_.erase(works_.begin());
      complete(w);
      if (w.segment == s && w.then == what) return;
    }
  }
  void wait_all() {
    while (!works_.empty()) {
      InFlight w = std::move(works_.front());
      works_.erase(works_.begin());
      complete(w);
    }
  }

  const Context<B>* ctx_;
  Model* model_;
  Comm* comm_;
  AdamW optimizer_;
  ShardedOptions options_;
  int rank_;
  int size_;
  std::vector<Parameter<T, B>*> params_;
  std::vector<Shape> shapes_;
  std::unordered_map<const void*, int> index_;
  std::vector<std::vector<int>> unit_params_;
  std::vector<int> ready_unit_;   // per segment: the unit whose post_backward completes it
  std::vector<int> segment_of_;   // per parameter
  std::vector<std::vector<int>> touch_;  // per unit: segments it reads / adds gradients to
  FlatLayout layout_;
  int owner_rank_;
  std::vector<Tile> tiles_;
  MasterState<T, B> state_;
  Tensor<T, B> full_w_;   // stages 0-2: (Ψ') every weight, views of it in the model
  Tensor<T, B> full_g_;   // stages 0-1: (Ψ') every gradient
  Tensor<T, B> shard_w_;  // stage 3: (Ψ'/N) this rank's weights at rest
  Tensor<T, B> shard_g_;  // stages 2-3: (Ψ'/N) this rank's reduced gradients
  std::vector<Tensor<T, B>> bucket_g_;   // stages 2-3: full gradient of a segment, transient
  std::vector<Tensor<T, B>> gathered_;   // stage 3: full weights of a segment, transient
  std::vector<char> gathering_;
  std::vector<char> grad_pending_;
  std::vector<char> reduced_;
  std::vector<InFlight> works_;
  std::int64_t gathered_now_ = 0;
  std::int64_t gathered_peak_ = 0;
  int micro_ = 0;
  int micro_count_ = 1;
  Hooks hooks_{};
};

}  // namespace fourway
