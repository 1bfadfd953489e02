//! LocalWorld's synchronisation core: the one mutex and condition variable every wait of a world
//! blocks on, the wake-up protocol, and, in the strict world (`CommOptions::strict`), the
//! activity count that tells a deadlock from a slow rank.
//!
//! A strict world declares a deadlock only when it is certain, never on a timer: no thread of the
//! world is running (`busy == 0`: every rank's own thread and every communicator worker is blocked
//! in a communicator wait, idle, or its rank has returned), and every blocked waiter has looked at
//! its condition again after the world last changed and found it false. The second half is a
//! *probe*: the first waiter to see `busy == 0` starts one (wakes every waiter, remembers the
//! world's change counter `epoch`); each waiter acknowledges it once it has re-checked its
//! condition; when every current waiter has acknowledged and `epoch` has not moved, nothing can
//! ever change again. Anything that changes shared state (a rank arriving, a message posted or
//! taken, a chunk finished, a Work completed, a rank failing or returning) bumps `epoch` through
//! `notify()` or `notify_changed()`, which invalidates the probe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "fourway/config.hpp"

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
FOURWAY_BEGIN_MODE_NAMESPACE

/// See the file comment.
struct LocalWorldSync {
  LocalWorldSync(int ranks, bool strict_world) : strict(strict_world), busy(ranks) {}
  LocalWorldSync(const LocalWorldSync&) = delete;
  LocalWorldSync& operator=(const LocalWorldSync&) = delete;

  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> sleepers{0};  // threads inside the blocking part of a wait (see notify)
  const bool strict;             // CommOptions::strict of the world

  // ---- the strict world's activity ------------------------------------------------------------
  std::atomic<std::uint64_t> epoch{0};  // changes of shared state
  std::atomic<int> busy;                // threads running (each rank's own thread starts busy)
  // guarded by mu:
  int waiters = 0;                // threads blocked in a strict wait
  std::uint64_t probe = 0;        // the current probe (0: none yet)
  std::uint64_t probe_epoch = 0;  // `epoch` when it began
  int acks = 0;                   // waiters that re-checked their condition during it
  std::string deadlock;           // the report, once a deadlock is certain
  /// Builds the report of every rank's pending operations (set by the world; lock held).
  std::function<std::string()> pending_report;

  /// Wakes the blocked waiters after a change of an atomic they wait on. A waiter counts itself
  /// in `sleepers` (then a fence) before it takes the lock and checks; the change is made (then a
  /// fence) before `sleepers` is read here. So either the waiter sees the change, or this sees
  /// the waiter and takes the lock, which orders the notify after the waiter's check. With no
  /// waiter (the common case of a collective whose peers are polling) it costs one load and one
  /// increment.
  void notify() {
    epoch.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_relaxed) == 0) return;
    { std::lock_guard lock(mu); }
    cv.notify_all();
  }
  /// A change made under `mu` (or one every waiter must see at once): bump and wake all.
  void notify_changed() {
    epoch.fetch_add(1, std::memory_order_relaxed);
    cv.notify_all();
  }

  /// The CommDeadlock message, made once by the first thread to be certain (lock held).
  const std::string& deadlock_message_locked() {
    if (deadlock.empty()) {
      deadlock =
          "fourway: CommDeadlock in the strict world (LocalWorld held to NCCL's contract, "
          "docs/comm.md): no rank can make progress, so on NCCL these ranks would hang. Pending "
          "operations, rank by rank:" +
          (pending_report ? pending_report() : std::string(" (unknown)")) +
          "\nA send completes only when its recv is posted: post the sends and recvs that must "
          "pass each other as one group (comm.group_start() ... comm.group_end()), or let one "
          "side receive first; every rank must call the collectives of all its groups in one "
          "order";
      cv.notify_all();
    }
    return deadlock;
  }

  /// One thread's part in the strict world's deadlock detection while it waits (see the file
  /// comment): `enter` when it blocks, `stalled` each time its condition was found false (lock
  /// held), `leave` when it stops waiting.
  class Waiter {
   public:
    /// `lock` holds (or will hold) the world's mutex whenever this waiter changes the counts.
    Waiter(LocalWorldSync& w, std::unique_lock<std::mutex>& lock) : w_(w), lock_(lock) {}
    Waiter(const Waiter&) = delete;
    Waiter& operator=(const Waiter&) = delete;
    ~Waiter() {
      if (!in_) return;
      if (lock_.owns_lock()) {
        leave_locked();
      } else {
        std::lock_guard relock(w_.mu);
        leave_locked();
      }
    }
    /// Counts this thread as blocked (lock held).
    void enter_locked() {
      if (in_) return;
      in_ = true;
      ++w_.waiters;
      w_.busy.fetch_sub(1, std::memory_order_acq_rel);
    }
    /// Counts it as running again (lock held).
    void leave_locked() {
      if (!in_) return;
      in_ = false;
      if (acked_ == w_.probe && w_.probe != 0) --w_.acks;
      --w_.waiters;
      w_.busy.fetch_add(1, std::memory_order_acq_rel);
      // a thread that runs again may change what the others wait for
      w_.epoch.fetch_add(1, std::memory_order_relaxed);
    }
    /// Called with the lock held after the condition was found false: acknowledges the probe,
    /// starts one when nothing runs, and returns true once a deadlock is certain.
    bool stalled_locked() {
      if (acked_ != w_.probe) {
        acked_ = w_.probe;
        ++w_.acks;
      }
      if (w_.busy.load(std::memory_order_acquire) != 0) return false;
      const std::uint64_t now = w_.epoch.load(std::memory_order_relaxed);
      if (w_.probe == 0 || w_.probe_epoch != now) {
        ++w_.probe;  // a new probe: every waiter must look again
        w_.probe_epoch = now;
        w_.acks = 1;
        acked_ = w_.probe;
        w_.cv.notify_all();
        return false;
      }
      return w_.acks >= w_.waiters;
    }

   private:
    LocalWorldSync& w_;
    std::unique_lock<std::mutex>& lock_;
    bool in_ = false;
    std::uint64_t acked_ = 0;
  };
};

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
