//! `WorkQueue`: the in-flight collectives of one data-parallel strategy, completed in issue order.
//!
//! Every asynchronous collective a strategy issues (bucket reductions, FSDP gathers, the weight
//! all-gather after a sharded step) goes into one FIFO. Completing an entry waits on its `Work`
//! and then runs its `on_done` (free a reduced bucket, mark a segment gathered). `wait_for(key,
//! kind)` completes entries in order up to and including the first one with that key and kind, so
//! a later collective is never completed before an earlier one; `poll()` completes only the
//! finished prefix. Whatever owns the queue must drain it (`wait_all` or the destructor) before
//! the buffers the collectives write into are freed.
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

  /// Completes, in issue order, the entries that have finished.
  void poll() {
    while (!items_.empty() && items_.front().work.test()) complete_front();
  }
  /// Completes entries in issue order up to the first one issued for (key, kind).
  void wait_for(int key, WorkKind kind) {
    while (!items_.empty()) {
      const bool match = items_.front().key == key && items_.front().kind == kind;
      complete_front();
      if (match) return;
    }
  }
  void wait_all() {
    while (!items_.empty()) complete_front();
  }
  /// Waits on every entry, running no completion and swallowing errors (for destructors).
  void drain() noexcept {
    for (auto& item : items_) {
      try {
        item.work.wait();
      } catch (...) {
      }
    }
    items_.clear();
  }

 private:
  struct Item {
    Work work;
    int key;
    WorkKind kind;
    std::function<void()> on_done;
  };
  void complete_front() {
    Item item = std::move(items_.front());
    items_.pop_front();
    item.work.wait();
    if (item.on_done) item.on_done();
  }

  std::deque<Item> items_;
};

}  // namespace fourway
