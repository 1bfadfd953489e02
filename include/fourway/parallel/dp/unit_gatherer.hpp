//! `UnitGatherer<T, B, Comm>`: FSDP (ZeRO-3) parameters — each rank keeps only its shard of every
//! unit's weights; a unit's full weights are all-gathered just before it runs and released after.
//!
//! ```
//!   forward   pre_forward(u): acquire(u), prefetch u+1 | post_forward(u): release(u, keep u+1)
//!   backward  pre_backward(u): acquire(u), prefetch u-1 | post_backward(u): release(u, keep u-1)
//! ```
//! A segment is gathered into a fresh `MemTag::weights` buffer by an asynchronous all-gather (in
//! the strategy's `WorkQueue`), and `acquire` waits for it and points the unit's parameters'
//! weight views into it; `release(u, next)` frees the segments of u that `next` does not need and
//! points their weights at nothing. With prefetch, at most two units' segments are held at once;
//! the last forward unit is kept into the first backward unit (it is needed again at once).
//! `shard` (this rank's weights at rest, Ψ'/N) belongs to the caller and must outlive the gatherer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/parallel/dp/parameter_layout.hpp"
#include "fourway/parallel/work_queue.hpp"

namespace fourway {

template <class T, class B, class Comm>
class UnitGatherer {
 public:
  UnitGatherer(const Context<B>& ctx, Comm& comm, const ParameterLayout<T, B>& layout,
               WorkQueue& queue, const T* shard)
      : ctx_(&ctx),
        comm_(&comm),
        layout_(&layout),
        queue_(&queue),
        shard_(shard),
        gathered_(static_cast<std::size_t>(layout.segment_count())),
        gathering_(static_cast<std::size_t>(layout.segment_count()), 0) {}
  UnitGatherer(const UnitGatherer&) = delete;
  UnitGatherer& operator=(const UnitGatherer&) = delete;

  /// Issues the all-gathers of unit u's segments that are neither held nor in flight.
  void start(int u) {
    for (int s : layout_->unit_segments(u)) {
      const auto i = static_cast<std::size_t>(s);
      if (!gathered_[i].empty() || gathering_[i]) continue;
      const auto& seg = layout_->flat().segment(s);
      if (seg.padded == 0) continue;
      gathered_[i] = Tensor<T, B>(Shape{seg.padded}, MemTag::weights, ctx_->memory());
      now_ += static_cast<std::int64_t>(seg.padded * sizeof(T));
      peak_ = std::max(peak_, now_);
      gathering_[i] = 1;
      queue_->push(
          comm_->all_gather_async(shard_ + seg.shard_offset, gathered_[i].data(), seg.shard), s,
          WorkKind::gather, [this, i] { gathering_[i] = 0; });
    }
  }
  /// Unit u's weights gathered and bound (waits for its all-gathers).
  void acquire(int u) {
    start(u);
    for (int s : layout_->unit_segments(u)) {
      const auto i = static_cast<std::size_t>(s);
      if (gathering_[i]) queue_->wait_for(s, WorkKind::gather);
      if (layout_->flat().segment(s).padded == 0) continue;
      layout_->bind_weights(s, gathered_[i].data());
    }
  }
  /// Frees the segments of unit u that unit `next` (-1: none) does not need.
  void release(int u, int next) {
    for (int s : layout_->unit_segments(u)) {
      if (next >= 0) {
        const auto& keep = layout_->unit_segments(next);
        if (std::find(keep.begin(), keep.end(), s) != keep.end()) continue;
      }
      drop(s);
    }
  }
  void release_all() {
    for (int s = 0; s < layout_->segment_count(); ++s) drop(s);
  }

  /// Peak bytes of gathered segments held at once since the last reset.
  [[nodiscard]] std::int64_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = now_; }

 private:
  void drop(int s) {
    const auto i = static_cast<std::size_t>(s);
    if (gathering_[i]) queue_->wait_for(s, WorkKind::gather);
    if (gathered_[i].empty()) return;
    now_ -= static_cast<std::int64_t>(gathered_[i].bytes());
    gathered_[i].reset();
    layout_->bind_weights(s, nullptr);
  }

  const Context<B>* ctx_;
  Comm* comm_;
  const ParameterLayout<T, B>* layout_;
  WorkQueue* queue_;
  const T* shard_;
  std::vector<Tensor<T, B>> gathered_;
  std::vector<char> gathering_;
  std::int64_t now_ = 0;
  std::int64_t peak_ = 0;
};

}  // namespace fourway
