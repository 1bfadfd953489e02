//! When LocalWorld's async work may use a core: the gate of one rank's communicator, and the
//! `Work` its async forms hand out.
//!
//! A collective's data movement (reductions, gathers) is cut into chunks that any participating
//! rank may claim (comm/local/rendezvous.hpp, `share_chunks`). The executor's worker thread
//! claims chunks only while its gate is open, i.e. while the rank's own thread is blocked on this
//! communicator: in `Work::wait()`, in a blocking call, or in the communicator's destructor. While
//! the rank computes, its worker publishes the call, waits for its peers to arrive and then sleeps;
//! a peer that is blocked does the chunks instead. So with as many cores as ranks, communication
//! runs on cores that would otherwise wait, never beside the rank's own compute.
//!
//! `Work::test()` that finds the operation unfinished does one chunk on the caller's thread (a
//! rank that only polls still makes progress; a poll between layers costs one chunk).
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "fourway/comm/local/activity.hpp"
#include "fourway/comm/work.hpp"
#include "fourway/config.hpp"
#include "fourway/core/error.hpp"

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
FOURWAY_BEGIN_MODE_NAMESPACE

/// The gate of one rank's communicator (see the file comment). Shared by the rank's state and
/// the Work it handed out, which may outlive it.
class LocalGate {
 public:
  /// `wake` wakes the world's sleeping waiters (LocalWorldState::notify).
  explicit LocalGate(std::function<void()> wake) : wake_(std::move(wake)) {}

  /// True while the rank's own thread is blocked on this communicator.
  [[nodiscard]] bool open() const { return blocked_.load(std::memory_order_acquire) > 0; }

  /// Opens the gate for its lifetime (nests).
  class Blocked {
   public:
    explicit Blocked(LocalGate& g) : g_(g) {
      g_.blocked_.fetch_add(1, std::memory_order_seq_cst);
      g_.wake_();
    }
    ~Blocked() { g_.blocked_.fetch_sub(1, std::memory_order_release); }
    Blocked(const Blocked&) = delete;
    Blocked& operator=(const Blocked&) = delete;

   private:
    LocalGate& g_;
  };
  /// Opens the gate for good: the communicator is being destroyed and its worker must drain.
  void open_forever() {
    blocked_.fetch_add(1, std::memory_order_seq_cst);
    wake_();
  }

  /// The chunks of the operation the worker is in, offered to the rank's own thread (`help`)
  /// for its lifetime. `claim_one()` claims and runs one chunk; false when none is left. (Held by
  /// reference, not in a std::function: offering allocates nothing.)
  class Offer {
   public:
    template <class ClaimOne>
    Offer(LocalGate& g, ClaimOne& claim_one) : g_(g) {
      std::lock_guard lock(g_.offer_mu_);
      g_.offer_ = &claim_one;
      g_.run_offer_ = [](void* f) { return (*static_cast<ClaimOne*>(f))(); };
    }
    ~Offer() {
      std::lock_guard lock(g_.offer_mu_);  // waits for a chunk the rank's thread is running
      g_.offer_ = nullptr;
    }
    Offer(const Offer&) = delete;
    Offer& operator=(const Offer&) = delete;

   private:
    LocalGate& g_;
  };
  /// Runs one offered chunk, if any, on the calling thread.
  void help() {
    std::lock_guard lock(offer_mu_);
    if (offer_ != nullptr) (void)run_offer_(offer_);
  }

 private:
  std::function<void()> wake_;
  std::atomic<int> blocked_{0};
  std::mutex offer_mu_;
  void* offer_ = nullptr;               // guarded by offer_mu_
  bool (*run_offer_)(void*) = nullptr;  // guarded by offer_mu_
};

/// The state behind a LocalWorld `Work`: completed by the worker; `wait()` opens the gate while
/// it blocks, `test()` helps with one chunk when the operation is unfinished. In the strict world
/// (`world` set) a wait takes part in the deadlock detection (comm/local/activity.hpp) and
/// `finish` wakes the world's waiters.
class LocalWorkState final : public Work::State {
 public:
  explicit LocalWorkState(std::shared_ptr<LocalGate> gate,
                          std::shared_ptr<LocalWorldSync> world = nullptr)
      : gate_(std::move(gate)), world_(std::move(world)) {}
  void finish(std::exception_ptr error) {
    done_.finish(std::move(error));
    if (world_) {
      std::lock_guard lock(world_->mu);
      world_->notify_changed();
    }
  }
  void wait() override {
    if (!done_.test()) {
      LocalGate::Blocked blocked(*gate_);
      if (world_) strict_wait();
      done_.wait();
      return;
    }
    done_.wait();  // rethrows the failure
  }
  bool test() override {
    if (done_.test()) return true;
    gate_->help();
    return done_.test();
  }

 private:
  /// Blocks until the operation finished, as one of the world's strict waiters.
  void strict_wait() {
    std::unique_lock lock(world_->mu);
    LocalWorldSync::Waiter me(*world_, lock);
    me.enter_locked();
    while (!done_.test()) {
      if (!world_->deadlock.empty() || me.stalled_locked()) {
        throw CommDeadlock(world_->deadlock_message_locked());
      }
      world_->cv.wait_for(lock, std::chrono::milliseconds(10));
    }
    me.leave_locked();
  }

  std::shared_ptr<LocalGate> gate_;
  std::shared_ptr<LocalWorldSync> world_;
  CompletionState done_;
};

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
