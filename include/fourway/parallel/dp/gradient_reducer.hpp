//! `GradientReducer<Stage, T, B, Comm>`: the gradient side of DataParallel and ZeRO-1/2/3 — it
//! owns the gradient buffers and reduces each bucket over the group as backward completes it.
//!
//! ```
//!   stage  gradient buffers held                       collective per segment s
//!   0      full Ψ (views in the model)                 all-reduce in place            (once/step)
//!   1      full Ψ'                                     reduce-scatter into own slice  (once/step)
//!   2, 3   shard S; the full segment only from the     reduce-scatter into the shard  (per micro-
//!          pre_backward of its first unit until its                                   batch)
//!          reduce-scatter completes
//! ```
//! With `overlap`, segment s's collective is issued from the `post_backward` of
//! `layout.ready_unit(s)` (stages 0-1: of the last micro-batch only; gradients accumulate locally
//! before); without, all are issued at the end (`end_micro_batch` for stages 2-3, `before_step`
//! for 0-1). Stages 2-3 accumulate micro-batches in the shard: once a segment has been reduced in
//! the step, the shard so far is copied into the rank's own slice of its fresh full buffer before
//! the next reduce-scatter, so the sum carries it. A pipeline drives stages 2-3 unit by unit
//! instead (`open_unit`, `reduce_unit`: its schedule, not the model, says when a unit's
//! gradients are complete). Gradients are SUMMED over ranks. Every collective goes into the
//! strategy's `WorkQueue`, which must be waited on (`wait_all`) before the gradients are read.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/parallel/dp/data_parallel.hpp"
#include "fourway/parallel/dp/parameter_layout.hpp"
#include "fourway/parallel/work_queue.hpp"

namespace fourway {

template <int Stage, class T, class B, class Comm>
class GradientReducer {
  using policy = data_parallel_policy_t<Stage>;

 public:
  GradientReducer(const Context<B>& ctx, Comm& comm, const ParameterLayout<T, B>& layout,
                  WorkQueue& queue, bool overlap)
      : ctx_(&ctx),
        comm_(&comm),
        layout_(&layout),
        queue_(&queue),
        overlap_(overlap),
        rank_(comm.rank()) {
    const FlatLayout& flat = layout.flat();
    const int segments = flat.segment_count();
    if constexpr (!policy::shards_grads) {
      full_g_ = Tensor<T, B>(Shape{flat.padded()}, MemTag::grads, ctx.memory());
      ops::fill(ctx, full_g_.data(), full_g_.numel(), zero());
    } else {
      shard_g_ = Tensor<T, B>(Shape{flat.shard()}, MemTag::grads, ctx.memory());
      ops::fill(ctx, shard_g_.data(), shard_g_.numel(), zero());
      bucket_g_.resize(static_cast<std::size_t>(segments));
      grad_pending_.assign(static_cast<std::size_t>(segments), 0);
      carried_.assign(static_cast<std::size_t>(segments), 0);
    }
    for (int s = 0; s < segments; ++s) {
      layout.bind_grads(s,
                        !policy::shards_grads ? full_g_.data() + flat.segment(s).offset : nullptr);
    }
    reduced_.assign(static_cast<std::size_t>(segments), 0);
  }
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Stages 0-1: (Ψ') every gradient, reduced in place after the step's collectives.
  [[nodiscard]] T* full() const { return full_g_.data(); }
  /// Stages 2-3: (Ψ'/N) this rank's reduced gradients.
  [[nodiscard]] T* shard() const { return shard_g_.data(); }

  void begin_step() {
    if constexpr (!policy::shards_grads) {
      ops::fill(*ctx_, full_g_.data(), full_g_.numel(), zero());
    } else {
      ops::fill(*ctx_, shard_g_.data(), shard_g_.numel(), zero());
      std::fill(carried_.begin(), carried_.end(), 0);
    }
  }
  void begin_micro_batch(int i, int n) {
    micro_ = i;
    micro_count_ = n;
    if (i == 0) std::fill(carried_.begin(), carried_.end(), 0);  // a new accumulation window
  }
  void end_micro_batch() {
    if constexpr (policy::shards_grads) {
      if (!overlap_) launch_all();
    }
  }
  /// From `pre_forward(0)`: every segment may be reduced again in this micro-batch.
  void begin_forward() { std::fill(reduced_.begin(), reduced_.end(), 0); }
  void pre_backward(int u) {
    if constexpr (policy::shards_grads) {
      for (int s : layout_->unit_segments(u)) bind_bucket_grad(s);
    }
  }
  void post_backward(int u) {
    if (overlap_ && (policy::shards_grads || micro_ == micro_count_ - 1)) {
      for (int s = 0; s < layout_->segment_count(); ++s) {
        if (layout_->ready_unit(s) == u) launch(s);
      }
    }
  }
  /// Stages 2-3, driven by a schedule: unit u's segments get full gradient buffers (each carrying
  /// the shard reduced so far in the step), kept until `reduce_unit` of their ready unit.
  void open_unit(int u) {
    if constexpr (policy::shards_grads) {
      for (int s : layout_->unit_segments(u)) bind_bucket_grad(s);
    }
  }
  /// Stages 2-3, driven by a schedule: the segments unit u completes are reduce-scattered into
  /// the shard now, and their full buffers freed once that is done (waited here).
  void reduce_unit(int u) {
    if constexpr (policy::shards_grads) {
      for (int s : layout_->unit_segments(u)) {  // a segment's ready unit touches it
        if (layout_->ready_unit(s) != u) continue;
        issue(s);
        queue_->wait_for(s, WorkKind::gradient);
      }
    }
  }
  /// From `finish_step`, before the queue is waited on.
  void before_step() {
    if constexpr (!policy::shards_grads) {
      if (!overlap_) launch_all();
    }
  }

 private:
  using ops = Ops<B>;
  static T zero() { return convert<T>(0.0f); }

  void launch_all() {
    for (int s = 0; s < layout_->segment_count(); ++s) launch(s);
  }

  /// Issues segment s's collective (once per micro-batch for stages 2-3, once per step for 0-1).
  void launch(int s) {
    auto& done = reduced_[static_cast<std::size_t>(s)];
    if (done) return;
    done = 1;
    issue(s);
  }
  void issue(int s) {
    const FlatLayout& flat = layout_->flat();
    const auto& seg = flat.segment(s);
    if constexpr (!policy::shards_optimizer_state) {
      queue_->push(comm_->all_reduce_async(full_g_.data() + seg.offset, full_g_.data() + seg.offset,
                                           seg.numel, ReduceOp::sum),
                   s);
    } else if constexpr (!policy::shards_grads) {
      queue_->push(comm_->reduce_scatter_async(full_g_.data() + seg.offset,
                                               full_g_.data() + flat.owned_begin(s, rank_),
                                               seg.shard, ReduceOp::sum),
                   s);
    } else {
      auto& full = bucket_g_[static_cast<std::size_t>(s)];
      if (full.empty() && seg.padded > 0) bind_bucket_grad(s);
      grad_pending_[static_cast<std::size_t>(s)] = 1;
      carried_[static_cast<std::size_t>(s)] = 1;
      queue_->push(comm_->reduce_scatter_async(full.data(), shard_g_.data() + seg.shard_offset,
                                               seg.shard, ReduceOp::sum),
                   s, WorkKind::gradient, [this, s] {
                     grad_pending_[static_cast<std::size_t>(s)] = 0;
                     free_bucket_grad(s);
                   });
    }
  }

  /// Stages 2-3: the full gradient buffer of segment s, zeroed except for the rank's own slice,
  /// which carries the shard accumulated by earlier micro-batches.
  void bind_bucket_grad(int s) {
    if (grad_pending_[static_cast<std::size_t>(s)]) queue_->wait_for(s, WorkKind::gradient);
    auto& full = bucket_g_[static_cast<std::size_t>(s)];
    if (!full.empty()) return;
    const auto& seg = layout_->flat().segment(s);
    if (seg.padded == 0) return;
    full = Tensor<T, B>(Shape{seg.padded}, MemTag::grads, ctx_->memory());
    ops::fill(*ctx_, full.data(), seg.padded, zero());
    if (carried_[static_cast<std::size_t>(s)]) {
      ops::copy(*ctx_, full.data() + static_cast<std::int64_t>(rank_) * seg.shard,
                shard_g_.data() + seg.shard_offset, seg.shard);
    }
    layout_->bind_grads(s, full.data());
  }
  void free_bucket_grad(int s) {
    bucket_g_[static_cast<std::size_t>(s)].reset();
    layout_->bind_grads(s, nullptr);
  }

  const Context<B>* ctx_;
  Comm* comm_;
  const ParameterLayout<T, B>* layout_;
  WorkQueue* queue_;
  bool overlap_;
  int rank_;
  Tensor<T, B> full_g_;                 // stages 0-1
  Tensor<T, B> shard_g_;                // stages 2-3
  std::vector<Tensor<T, B>> bucket_g_;  // stages 2-3: full gradient of a segment, transient
  std::vector<char> grad_pending_;
  std::vector<char> carried_;  // stages 2-3: the segment was reduced earlier in the step
  std::vector<char> reduced_;
  int micro_ = 0;
  int micro_count_ = 1;
};

}  // namespace fourway
