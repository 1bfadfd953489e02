//! The handle on an asynchronous communicator operation (`Work`), the state another thread
//! completes (`detail::CompletionState`), the blocking forms of a backend whose operations
//! are async at heart (`detail::BlockingForms`: each is the `*_async` form followed by `wait()`),
//! and `complete_in_stream_order`: one operation completed before what the caller's stream does
//! next, with no host wait where the backend orders on the device (`orders_on_device`).
#pragma once

#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>

#include "fourway/comm/types.hpp"

namespace fourway {

/// A handle on an asynchronous operation. `wait()` blocks until it finished and rethrows its
/// failure (CommTimeout, CommMismatch, ...); `test()` returns whether it finished (successfully
/// or not) without blocking. A default-constructed Work is already complete.
///
/// `wait_device()` orders what the caller's stream does next after the operation without
/// blocking the host, where the backend can: NcclComm on its communication stream makes the
/// stream its buffers are ordered on wait for the operation's event (cudaStreamWaitEvent) and
/// returns. Kernels, frees and copies enqueued on that stream afterwards see the result; the
/// host does not, until it synchronises that stream. A failure already known is thrown; one that
/// happens later (a peer that never arrives) is thrown by the next host `wait()` on the same
/// communicator, whose deadline bounds it. The host backends (LocalComm, MpiComm) complete on
/// the host, so there `wait_device()` is `wait()`; Counting passes it to its inner Work.
class Work {
 public:
  struct State {
    virtual ~State() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;
    /// Orders the caller's stream after the operation (see `Work::wait_device`); by default the
    /// host waits.
    virtual void wait_on_device() { wait(); }
  };
  Work() = default;
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}
  void wait() {
    if (state_) state_->wait();
  }
  void wait_device() {
    if (state_) state_->wait_on_device();
  }
  [[nodiscard]] bool test() { return !state_ || state_->test(); }

 private:
  std::shared_ptr<State> state_;
};

namespace detail {
/// A Work state completed by another thread: `finish(error)` once, `wait()` any number of times.
class CompletionState final : public Work::State {
 public:
  void finish(std::exception_ptr error) {
    {
      std::lock_guard lock(mu_);
      error_ = std::move(error);
      done_ = true;
    }
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    std::lock_guard lock(mu_);
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};
}  // namespace detail

namespace detail {
/// The blocking forms of a communicator whose operations are async at heart (MPI, NCCL): each
/// is its `*_async` form followed by `wait()`.
template <class Derived>
class BlockingForms {
 public:
  template <comm_element T>
  void all_reduce(const T* send, T* recv, std::int64_t count, ReduceOp op, CallOptions o = {}) {
    self().all_reduce_async(send, recv, count, op, o).wait();
  }
  template <comm_element T>
  void reduce_scatter(const T* send, T* recv, std::int64_t count, ReduceOp op, CallOptions o = {}) {
    self().reduce_scatter_async(send, recv, count, op, o).wait();
  }
  template <comm_element T>
  void all_gather(const T* send, T* recv, std::int64_t count, CallOptions o = {}) {
    self().all_gather_async(send, recv, count, o).wait();
  }
  template <comm_element T>
  void broadcast(T* buf, std::int64_t count, int root, CallOptions o = {}) {
    self().broadcast_async(buf, count, root, o).wait();
  }
  template <comm_element T>
  void send(const T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    self().send_async(buf, count, peer, tag, o).wait();
  }
  template <comm_element T>
  void recv(T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    self().recv_async(buf, count, peer, tag, o).wait();
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};
}  // namespace detail

/// Whether `c`'s `Work::wait_device()` orders the caller's stream without a host wait: a
/// communicator says so with a member `orders_on_device()` (NcclComm: true; Counting: its inner
/// one's). The host backends have none: their wait_device is `wait()`.
template <class C>
[[nodiscard]] constexpr bool orders_on_device(const C& c) {
  if constexpr (requires {
                  { c.orders_on_device() } -> std::convertible_to<bool>;
                }) {
    return c.orders_on_device();
  } else {
    return false;
  }
}

/// Completes one operation in stream order: what the caller's stream runs next sees its result.
/// `issue(c)` issues the `*_async` form and returns its Work, `call(c)` makes the blocking call.
/// Where the backend orders on the device (NcclComm) it is `issue(c).wait_device()`: the stream
/// waits for the operation's event and the host goes on. Elsewhere the host is the stream, and
/// the blocking form is that order at its cheapest: LocalComm runs it on the caller's thread when
/// its worker is idle, where `*_async` + wait hops to the worker and back (measured on 2 cores:
/// the tensor-parallel meshes of the equivalence matrix take 1.5x the wall time with the hop;
/// docs/parallel-tp.md). A communicator with a member of this name makes the choice itself
/// (Counting does, to count it as ordered on the device).
template <class C, class Issue, class Call>
void complete_in_stream_order(C& c, Issue&& issue, Call&& call) {
  if constexpr (requires { c.complete_in_stream_order(issue, call); }) {
    c.complete_in_stream_order(issue, call);
  } else if (orders_on_device(c)) {
    issue(c).wait_device();
  } else {
    call(c);
  }
}

}  // namespace fourway
