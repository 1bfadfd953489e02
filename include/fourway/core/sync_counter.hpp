//! SyncCounter: how many times a backend context made the host wait for the work queued on it.
//!
//! A GPU step is fast only when the host keeps queueing kernels ahead of the device; every call
//! that returns a value computed on the device (a copy to the host, a reduction read back) or
//! waits for the stream drains that queue. Both contexts count such calls — `synchronize()`,
//! `to_host`, the reductions that return a host value, and a host-to-device copy that had to
//! wait — so a host test can assert how many a training step makes, and the count holds for the
//! device run because the same algorithm makes the same calls (docs/contracts.md).
#pragma once

#include <atomic>
#include <cstdint>

namespace fourway {

class SyncCounter {
 public:
  SyncCounter() = default;
  SyncCounter(const SyncCounter&) = delete;
  SyncCounter& operator=(const SyncCounter&) = delete;

  /// Records one synchronising call (contexts are const where kernels are issued).
  void note_sync() const noexcept { syncs_.fetch_add(1, std::memory_order_relaxed); }
  /// Synchronising calls so far.
  [[nodiscard]] std::uint64_t syncs() const noexcept {
    return syncs_.load(std::memory_order_relaxed);
  }

 private:
  mutable std::atomic<std::uint64_t> syncs_{0};
};

}  // namespace fourway
