//! `WorkQueue`: the in-flight collectives of one data-parallel strategy, completed in issue order.
//!
//! Every asynchronous collective a strategy issues (bucket reductions, FSDP gathers, the weight
//! all-gather after a sharded step) goes into one FIFO. Completing an entry orders the rank's
//! stream after its `Work` and then runs its `on_done` (free a reduced bucket, mark a segment
//! gathered). `wait_for(key, kind)` completes entries in order up to and including the first one
//! with that key and kind, so a later collective is never completed before an earlier one;
//! `poll()` completes only the finished prefix.
//!
//! Two ways to complete, because on a GPU the difference is the overlap:
//!   - `wait_for` and `order_all` complete with `Work::wait_device()`: on NcclComm's
//!     communication stream the compute stream waits for the collective's event and the host goes
//!     on launching the backward; `on_done` then runs at once, and what it frees is freed in the
//!     compute stream's order, after the collective. On every host backend this is a host wait.
//!   - `wait_all` waits on the host, also for the entries completed on the device since the last
//!     host wait, so that the host may read what the collectives wrote and so that a collective
//!     that never finishes surfaces as the backend's CommTimeout, not as a hang in a later copy.
//!     Checkpointing and loading use it; a step's end uses `order_all`, because its next call is
//!     a host-waited collective on the same communicator (the step scalars' all-reduce, ordered
//!     after them on the communication stream), which bounds them with its deadline.
//!
//! Whatever owns the queue must drain it (`wait_all` or the destructor) before the buffers the
//! collectives write into are freed other than in the stream's order.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <utility>

#include "fourway/comm/communicator.hpp"

namespace fourway {

/// What an in-flight collective is waited on for (`WorkQueue::wait_for`).
enum class WorkKind : std::uint8_t { other, gradient, gather };

class WorkQueue {
 public:
  WorkQueue() = default;
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;
  /// Waits on what is still in flight without running completions; errors are dropped.
  ~WorkQueue() { drain(); }

  void push(Work work, int key = -1, WorkKind kind = WorkKind::other,
            std::function<void()> on_done = {}) {
    items_.push_back(Item{std::move(work), key, kind, std::move(on_done)});
  }
  [[nodiscard]] bool empty() const { return items_.empty(); }

  /// Entries completed on the device and not yet waited on by the host (`wait_all`).
  [[nodiscard]] std::size_t ordered() const { return ordered_.size(); }

  /// Completes, in issue order, the entries that have finished.
  void poll() {
    while (!items_.empty() && items_.front().work.test()) complete_front(false);
    prune();
  }
  /// Completes entries in issue order up to the first one issued for (key, kind), on the device.
  void wait_for(int key, WorkKind kind) {
    while (!items_.empty()) {
      const bool match = items_.front().key == key && items_.front().kind == kind;
      complete_front(true);
      if (match) return;
    }
  }
  /// Completes every entry on the device: the rank's stream is ordered after all of them.
  void order_all() {
    while (!items_.empty()) complete_front(true);
    prune();
  }
  /// Completes every entry, and waits on the host for them and for every entry completed on the
  /// device before.
  void wait_all() {
    while (!items_.empty()) complete_front(false);
    wait_ordered(false);
  }
  /// Waits on every entry, running no completion and swallowing errors (for destructors).
  void drain() noexcept {
    for (auto& w : ordered_) swallow(w);
    for (auto& item : items_) swallow(item.work);
    ordered_.clear();
    items_.clear();
  }

 private:
  struct Item {
    Work work;
    int key;
    WorkKind kind;
    std::function<void()> on_done;
  };
  void complete_front(bool on_device) {
    Item item = std::move(items_.front());
    items_.pop_front();
    if (on_device) {
      item.work.wait_device();
      if (!item.work.test()) ordered_.push_back(item.work);
    } else {
      item.work.wait();
    }
    if (item.on_done) item.on_done();
  }
  /// Forgets the device-completed entries that have finished (keeps the list short).
  void prune() { wait_ordered(true); }
  /// Host-waits the device-completed entries in order: all, or the finished prefix (those return
  /// at once, or rethrow their failure).
  void wait_ordered(bool finished_only) {
    while (!ordered_.empty() && (!finished_only || ordered_.front().test())) {
      Work w = std::move(ordered_.front());
      ordered_.pop_front();
      w.wait();
    }
  }
  static void swallow(Work& w) noexcept {
    try {
      w.wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
  }

  std::deque<Item> items_;
  std::deque<Work> ordered_;  // completed on the device, not yet waited on by the host
};

}  // namespace fourway
