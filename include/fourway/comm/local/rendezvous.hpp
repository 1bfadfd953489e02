//! LocalWorld's rendezvous: every collective publishes this rank's call, waits for all ranks to
//! arrive (spinning, then yielding, then blocking), checks that the calls agree, and waits again
//! until every rank finished with the buffers. Every wait has this call's deadline, fails fast
//! when the world was aborted or the awaited rank returned, and names what it waited for.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fourway/comm/call_desc.hpp"
#include "fourway/comm/local/state.hpp"
#include "fourway/core/error.hpp"

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
FOURWAY_BEGIN_MODE_NAMESPACE

/// A hint to the core that this thread is polling (x86 `pause`, Arm `yield`).
inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// The rendezvous part of LocalComm (see the file comment).
class LocalRendezvous : protected LocalCommBase {
 protected:
  using LocalCommBase::LocalCommBase;

  /// Waits until `ready()` holds. `ready` may be evaluated without the lock when `spin`;
  /// `missing()` lists the group ranks waited for; `what()` describes the wait for messages.
  /// `timed`: the call's deadline applies (a wait for this rank's own thread has none).
  template <class Ready, class Missing, class What>
  void wait_until(bool spin, Ready ready, Missing missing, What what, bool timed = true) const {
    auto& group = g();
    auto& world = *group.world;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + s_->call.timeout;
    if (spin) {
      // A peer on its own core answers within microseconds: poll with a pause first, then give
      // the core away between polls (ranks may share cores), then block.
      const int polls = world.poll_first ? 128 : 0;
      for (int i = 0; i < polls + 256; ++i) {
        if (ready()) return;
        if ((i & 63) == 0 && world.aborted.load(std::memory_order_relaxed)) break;
        if (i < polls) {
          detail::cpu_pause();
        } else {
          std::this_thread::yield();
        }
      }
    }
    world.sleepers.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    struct Awake {
      std::atomic<int>& n;
      ~Awake() { n.fetch_sub(1, std::memory_order_relaxed); }
    } awake{world.sleepers};
    std::unique_lock lock(world.mu);
    LocalWorldSync::Waiter me(world, lock);  // the strict world's deadlock detection
    struct Waiting {                         // what this rank's report says it waits for
      LocalPendingOps* p;
      ~Waiting() {
        if (p != nullptr) p->waiting.clear();
      }
    } waiting{nullptr};
    for (;;) {
      if (ready()) return;
      if (world.aborted.load()) throw_aborted_locked(what());
      for (int q : missing()) {
        if (world
                .exited[static_cast<std::size_t>(group.world_ranks[static_cast<std::size_t>(q)])]) {
          throw CommError(detail::cat("fourway: ", what(), " cannot complete: ", group.who(q),
                                      " returned from its function without joining it"));
        }
      }
      if (world.strict) {
        if (waiting.p == nullptr && s_->pending) {
          waiting.p = s_->pending.get();
          waiting.p->waiting = what();
        }
        me.enter_locked();
        if (!world.deadlock.empty() || me.stalled_locked()) {
          throw CommDeadlock(world.deadlock_message_locked());
        }
      }
      if (!timed) {
        if (world.strict) {
          world.cv.wait_for(lock, strict_slice);
        } else {
          world.cv.wait(lock);
        }
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
        std::ostringstream os;
        os << "fourway: CommTimeout: " << what() << ": waited " << waited << " ms (deadline "
           << s_->call.timeout.count() << " ms) for ";
        bool first = true;
        for (int q : missing()) {
          os << (first ? "" : ", ") << group.who(q);
          const std::uint64_t a = group.arrived[q].load();
          if (a > 0) {
            os << " [last entered #" << a << " "
               << detail::describe_slot(group.slots[a % 2][static_cast<std::size_t>(q)]) << "]";
          } else {
            os << " [entered no collective yet]";
          }
          first = false;
        }
        os << ". If those ranks are only slow, raise CommOptions::deadline (or this "
              "call's CallOptions::timeout); otherwise find the "
              "rank that skipped, reordered or never reached this call";
        if (world.strict) os << ". Pending operations, rank by rank:" << world.pending_report();
        throw CommTimeout(os.str());
      }
      world.cv.wait_until(lock, world.strict ? std::min(deadline, now + strict_slice) : deadline);
    }
  }

  /// How long a strict waiter sleeps before it looks at the world again (a probe or a finished
  /// Work also wakes it at once).
  static constexpr std::chrono::milliseconds strict_slice{10};

  [[noreturn]] void throw_aborted_locked(const std::string& what) const {
    auto& world = *g().world;
    throw CommError(detail::cat("fourway: ", what, " abandoned: world rank ", world.failed_rank,
                                " failed: ", world.failure));
  }
  [[noreturn]] void throw_aborted(const std::string& what) const {
    std::unique_lock lock(g().world->mu);
    throw_aborted_locked(what);
  }

  std::string op_context(const detail::LocalSlot& me) const {
    return detail::cat(g().header(), ", ", detail::describe_slot(me), " #", me.seq, " on ",
                       g().who(s_->rank));
  }

  /// Publishes this rank's call and waits for every rank to publish theirs; then checks that
  /// all calls agree. Returns the published slot, its sequence number filled in.
  detail::LocalSlot enter(detail::LocalSlot me) {
    auto& group = g();
    me.seq = ++s_->seq;
    if (group.world->aborted.load()) throw_aborted(op_context(me));
    // No lock: a peer reads this slot only after it sees `arrived` (release / acquire), and this
    // slot parity is rewritten two collectives later, after every peer has left this one. The
    // same holds for the parity's chunk counter, which rank 0 resets.
    group.slots[me.seq % 2][static_cast<std::size_t>(s_->rank)] = me;
    if (s_->rank == 0) group.next_chunk[me.seq % 2].store(0, std::memory_order_relaxed);
    group.arrived[s_->rank].store(me.seq, std::memory_order_release);
    group.world->notify();
    wait_for_all(group.arrived.get(), me, " (arrival)");
    verify(me);
    return me;
  }

  /// Runs the `total` chunks of collective `me` (`chunk(c)` for c in [0, total)) shared with its
  /// peers, then leaves it. Each chunk is claimed once, by whichever rank gets it first; this
  /// rank claims only while its gate is open (comm/local/gate.hpp), else it sleeps until the
  /// gate opens or its peers have claimed every chunk, and offers the chunks to its own thread
  /// meanwhile. A chunk's result never depends on who ran it, so results stay bitwise fixed.
  template <class Chunk>
  void share_chunks(const detail::LocalSlot& me, std::int64_t total, Chunk chunk) {
    auto& group = g();
    auto& next = group.next_chunk[me.seq % 2];
    auto& gate = *s_->gate;
    auto claim_one = [&] {
      // a failed world stops here: leave() below throws its failure
      if (group.world->aborted.load(std::memory_order_relaxed)) return false;
      const std::int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= total) return false;
      if (c == total - 1) group.world->notify();  // sleeping ranks wait for the last claim
      chunk(c);
      return true;
    };
    auto claimed = [&] { return next.load(std::memory_order_relaxed) >= total; };
    {
      const LocalGate::Offer offer(gate, claim_one);
      for (;;) {
        if (gate.open()) {
          if (!claim_one()) break;
          continue;
        }
        if (claimed()) break;
        wait_until(
            false, [&] { return gate.open() || claimed(); }, [] { return std::vector<int>{}; },
            [&] { return op_context(me) + " (waiting for this rank's thread)"; }, false);
      }
    }
    leave(me);
  }

  /// Marks this rank's part of collective `seq` finished and waits for every rank's.
  void leave(const detail::LocalSlot& me) {
    auto& group = g();
    group.done[s_->rank].store(me.seq, std::memory_order_release);
    group.world->notify();
    wait_for_all(group.done.get(), me, " (completion)");
  }

  /// Waits until every rank's `counter` reached `me.seq`.
  void wait_for_all(const std::atomic<std::uint64_t>* counter, const detail::LocalSlot& me,
                    const char* phase) {
    const int n = g().size;
    const auto seq = me.seq;
    auto ready = [&] {
      for (int q = 0; q < n; ++q) {
        if (counter[q].load(std::memory_order_acquire) < seq) return false;
      }
      return true;
    };
    auto missing = [&] {
      std::vector<int> m;
      for (int q = 0; q < n; ++q) {
        if (counter[q].load() < seq) m.push_back(q);
      }
      return m;
    };
    wait_until(true, ready, missing, [&] { return op_context(me) + phase; });
  }

  /// Every rank compares every slot with rank 0's and throws the same CommMismatch.
  void verify(const detail::LocalSlot& me) const {
    auto& group = g();
    const auto& slots = group.slots[me.seq % 2];
    const detail::CallDesc ref = detail::call_of(slots[0]);
    bool agree = true;
    for (std::size_t q = 1; q < slots.size() && agree; ++q) {
      agree = detail::differing_fields(detail::call_of(slots[q]), ref).empty();
    }
    if (agree) return;
    std::vector<detail::CallDesc> calls;
    for (const auto& s : group.slots[me.seq % 2]) calls.push_back(detail::call_of(s));
    const std::string report = detail::mismatch_report(calls, [&](int q) { return group.who(q); });
    if (!report.empty()) {
      throw CommMismatch(detail::cat("fourway: CommMismatch in ", group.header(),
                                     " at collective #", me.seq, ": ", report));
    }
  }
};

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
