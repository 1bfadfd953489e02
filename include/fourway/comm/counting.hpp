//! Counting<C>: a decorator over any communicator that counts calls, payload and *modelled* bytes
//! per op per group.
//!
//! `payload` is recorded: count·s as the caller handed it to each call (the figure MPI and NCCL
//! runs report, since what those libraries move on the wire is not observable here).
//! `modelled_bytes` is a formula, not a measurement: what one rank would *send* under the ring
//! algorithm, the nccl-tests "bus bytes" convention (busbw = bytes / time), for a group of N
//! ranks and a call of `count` elements of `s` bytes each:
//!
//!     all_reduce      count·s · 2(N−1)/N        (reduce-scatter + all-gather rings)
//!     reduce_scatter  count·s · (N−1)           (count is the per-rank output)
//!     all_gather      count·s · (N−1)           (count is the per-rank input)
//!     broadcast       count·s                   (pipelined ring; 0 when N = 1)
//!     send            count·s                   recv: count·s received (its own row)
//!     barrier, split  0
//!
//! So a data-parallel step over Ψ gradient elements models all_reduce bytes 2Ψ(N−1)/N·s, and a
//! ZeRO-3 step (reduce-scatter of Ψ/N per rank, two all-gathers of Ψ/N) 3Ψ(N−1)/N·s. Bytes are
//! kept as double (exact below 2^53). The *measured* figure is LocalWorld's own count of the bytes
//! its copy loops move (`LocalComm::traffic()`; reach it through `inner()`); docs/design.md says
//! which test compares the two with the communication law.
//!
//! Every group split from a Counting communicator shares one `CommCounters`, keyed by group
//! name, so one object reports the whole mesh of a rank. Async calls are counted when issued.
//!
//! How each operation completed is counted too, per op per group, as the algorithm asked for it
//! (what a GPU run would do, observable on the host):
//!
//!     host_waits     the host blocked on it: a blocking form (barrier included), or the first
//!                    `Work::wait()` of its Work
//!     device_orders  the caller's stream was ordered after it without the host: the first
//!                    `Work::wait_device()` of its Work (before any host wait), or a call made
//!                    through `complete_in_stream_order` (comm/work.hpp), which on a host backend
//!                    is the blocking form but on NCCL leaves the host free
//!
//! So a step's host waits are counted on LocalWorld as NCCL would make them; on a host backend
//! `wait_device` is a host wait in fact, and is still counted as the device order it stands for.
//! `Work::test()` counts nothing, and once it found the operation finished, neither do the
//! waits after it (they return at once on every backend: the host learned it by polling).
#pragma once

#include <array>
#include <cstdint>
#include <iomanip>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "fourway/comm/communicator.hpp"

namespace fourway {

struct OpCount {
  std::uint64_t calls = 0;
  std::uint64_t payload = 0;     // bytes passed by the caller (count · sizeof(T)), recorded
  double modelled_bytes = 0;     // bytes this rank would send under the ring algorithm (a formula)
  std::uint64_t host_waits = 0;  // operations the host blocked on (see the file comment)
  std::uint64_t device_orders = 0;  // operations the caller's stream was ordered after instead
};

/// How an operation was completed (see the file comment).
enum class Completion { host_wait, device_order };

/// Ring bytes one rank sends for a call of `payload` bytes of `op` in a group of `n` ranks.
constexpr double ring_bytes(CommOp op, double payload, int n) {
  switch (op) {
    case CommOp::all_reduce: return payload * 2.0 * (n - 1) / n;
    case CommOp::reduce_scatter:
    case CommOp::all_gather: return payload * (n - 1);
    case CommOp::broadcast: return n > 1 ? payload : 0.0;
    case CommOp::send:
    case CommOp::recv: return payload;
    case CommOp::barrier:
    case CommOp::split: return 0;
  }
  return 0;
}

/// Counters of one rank, per group name and op. Thread-safe.
class CommCounters {
 public:
  void add(const std::string& group, CommOp op, std::uint64_t payload, int n) {
    std::lock_guard lock(mu_);
    auto& c = by_group_[group][static_cast<std::size_t>(op)];
    ++c.calls;
    c.payload += payload;
    c.modelled_bytes += ring_bytes(op, static_cast<double>(payload), n);
  }
  /// One operation of `op` in `group` completed as `how`.
  void complete(const std::string& group, CommOp op, Completion how) {
    std::lock_guard lock(mu_);
    auto& c = by_group_[group][static_cast<std::size_t>(op)];
    ++(how == Completion::host_wait ? c.host_waits : c.device_orders);
  }
  [[nodiscard]] OpCount get(const std::string& group, CommOp op) const {
    std::lock_guard lock(mu_);
    auto it = by_group_.find(group);
    return it == by_group_.end() ? OpCount{} : it->second[static_cast<std::size_t>(op)];
  }
  /// Modelled ring bytes sent by this rank in `group` (all ops but recv), or in all groups when
  /// empty.
  [[nodiscard]] double modelled_bytes_sent(const std::string& group = {}) const {
    std::lock_guard lock(mu_);
    double b = 0;
    for (const auto& [name, ops] : by_group_) {
      if (!group.empty() && name != group) continue;
      for (int i = 0; i < comm_op_count; ++i) {
        if (static_cast<CommOp>(i) != CommOp::recv)
          b += ops[static_cast<std::size_t>(i)].modelled_bytes;
      }
    }
    return b;
  }
  /// Payload handed to calls in `group` (all ops but recv), or in all groups when empty.
  [[nodiscard]] std::uint64_t payload_sent(const std::string& group = {}) const {
    std::lock_guard lock(mu_);
    std::uint64_t b = 0;
    for (const auto& [name, ops] : by_group_) {
      if (!group.empty() && name != group) continue;
      for (int i = 0; i < comm_op_count; ++i) {
        if (static_cast<CommOp>(i) != CommOp::recv) b += ops[static_cast<std::size_t>(i)].payload;
      }
    }
    return b;
  }
  /// Operations of every op in `group` completed as `how` (all groups when empty).
  [[nodiscard]] std::uint64_t completed(const std::string& group, Completion how) const {
    std::lock_guard lock(mu_);
    std::uint64_t n = 0;
    for (const auto& [name, ops] : by_group_) {
      if (!group.empty() && name != group) continue;
      for (const auto& c : ops) n += how == Completion::host_wait ? c.host_waits : c.device_orders;
    }
    return n;
  }
  void reset() {
    std::lock_guard lock(mu_);
    by_group_.clear();
  }
  /// One line per (group, op) with calls, payload, modelled ring bytes and how the operations
  /// completed.
  [[nodiscard]] std::string table() const {
    std::lock_guard lock(mu_);
    std::ostringstream os;
    os << std::left << std::setw(24) << "group" << std::setw(16) << "op" << std::right
       << std::setw(10) << "calls" << std::setw(16) << "payload B" << std::setw(18)
       << "modelled ring B" << std::setw(12) << "host waits" << std::setw(15) << "device orders"
       << "\n";
    for (const auto& [name, ops] : by_group_) {
      for (int i = 0; i < comm_op_count; ++i) {
        const auto& c = ops[static_cast<std::size_t>(i)];
        if (c.calls == 0) continue;
        os << std::left << std::setw(24) << name << std::setw(16)
           << comm_op_name(static_cast<CommOp>(i)) << std::right << std::setw(10) << c.calls
           << std::setw(16) << c.payload << std::setw(18) << std::fixed << std::setprecision(0)
           << c.modelled_bytes << std::setw(12) << c.host_waits << std::setw(15) << c.device_orders
           << "\n";
      }
    }
    return os.str();
  }
  /// `{"<group>":{"<op>":{"calls":..,"payload":..,"modelled_bytes":..,"host_waits":..,
  /// "device_orders":..},...},...}`
  [[nodiscard]] std::string json() const {
    std::lock_guard lock(mu_);
    std::ostringstream os;
    os << "{";
    bool first_group = true;
    for (const auto& [name, ops] : by_group_) {
      os << (first_group ? "" : ",") << "\"" << name << "\":{";
      first_group = false;
      bool first_op = true;
      for (int i = 0; i < comm_op_count; ++i) {
        const auto& c = ops[static_cast<std::size_t>(i)];
        if (c.calls == 0) continue;
        os << (first_op ? "" : ",") << "\"" << comm_op_name(static_cast<CommOp>(i))
           << "\":{\"calls\":" << c.calls << ",\"payload\":" << c.payload
           << ",\"modelled_bytes\":" << std::fixed << std::setprecision(0) << c.modelled_bytes
           << ",\"host_waits\":" << c.host_waits << ",\"device_orders\":" << c.device_orders << "}";
        first_op = false;
      }
      os << "}";
    }
    os << "}";
    return os.str();
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::array<OpCount, comm_op_count>> by_group_;
};

namespace detail {
/// A Work that records in `CommCounters` how its operation was completed: the first host
/// `wait()`, or the first `wait_device()` before any host wait; nothing once a `test()` found it
/// finished, since later waits then return at once (see the file comment).
class CountedWork final : public Work::State {
 public:
  CountedWork(Work inner, std::shared_ptr<CommCounters> counters, std::string group, CommOp op)
      : inner_(std::move(inner)),
        counters_(std::move(counters)),
        group_(std::move(group)),
        op_(op) {}
  void wait() override {
    inner_.wait();
    if (!host_ && !polled_) counters_->complete(group_, op_, Completion::host_wait);
    host_ = true;
  }
  void wait_on_device() override {
    inner_.wait_device();
    if (!host_ && !device_ && !polled_) counters_->complete(group_, op_, Completion::device_order);
    device_ = true;
  }
  bool test() override {
    const bool done = inner_.test();
    if (done && !host_ && !device_) polled_ = true;
    return done;
  }

 private:
  Work inner_;
  std::shared_ptr<CommCounters> counters_;
  std::string group_;
  CommOp op_;
  bool host_ = false;    // a host wait was counted
  bool device_ = false;  // a device order was counted
  bool polled_ = false;  // a test() found it finished first: its waits cost nothing
};
}  // namespace detail

template <communicator C>
class Counting {
 public:
  explicit Counting(C inner,
                    std::shared_ptr<CommCounters> counters = std::make_shared<CommCounters>())
      : inner_(std::move(inner)), counters_(std::move(counters)) {}

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  [[nodiscard]] std::string_view name() const { return inner_.name(); }
  [[nodiscard]] C& inner() { return inner_; }
  [[nodiscard]] CommCounters& counters() { return *counters_; }
  [[nodiscard]] const std::shared_ptr<CommCounters>& shared_counters() const { return counters_; }
  /// This group's count of `op`.
  [[nodiscard]] OpCount count(CommOp op) const { return counters_->get(std::string(name()), op); }
  /// The inner communicator's answer (comm/work.hpp).
  [[nodiscard]] bool orders_on_device() const { return ::fourway::orders_on_device(inner_); }

  /// `fw::complete_in_stream_order` through this decorator: the inner communicator's choice
  /// (`issue(*this).wait_device()` where it orders on the device, else `call(*this)`), counted
  /// as a device order either way: the blocking call a host backend makes here stands for the
  /// stream order NCCL would keep.
  template <class Issue, class Call>
  void complete_in_stream_order(Issue&& issue, Call&& call) {
    if (orders_on_device()) {
      issue(*this).wait_device();
      return;
    }
    struct Ordered {
      bool& flag;
      explicit Ordered(bool& f) : flag(f) { flag = true; }
      ~Ordered() { flag = false; }
      Ordered(const Ordered&) = delete;
      Ordered& operator=(const Ordered&) = delete;
    } scope(in_stream_order_);
    call(*this);
  }

  template <comm_element T>
  void all_reduce(const T* s, T* r, std::int64_t n, ReduceOp op, CallOptions o = {}) {
    note<T>(CommOp::all_reduce, n);
    pass(
        o, [&](auto& c) { return c.all_reduce(s, r, n, op, o); },
        [&](auto& c) { return c.all_reduce(s, r, n, op); });
    completed(CommOp::all_reduce);
  }
  template <comm_element T>
  void reduce_scatter(const T* s, T* r, std::int64_t n, ReduceOp op, CallOptions o = {}) {
    note<T>(CommOp::reduce_scatter, n);
    pass(
        o, [&](auto& c) { return c.reduce_scatter(s, r, n, op, o); },
        [&](auto& c) { return c.reduce_scatter(s, r, n, op); });
    completed(CommOp::reduce_scatter);
  }
  template <comm_element T>
  void all_gather(const T* s, T* r, std::int64_t n, CallOptions o = {}) {
    note<T>(CommOp::all_gather, n);
    pass(
        o, [&](auto& c) { return c.all_gather(s, r, n, o); },
        [&](auto& c) { return c.all_gather(s, r, n); });
    completed(CommOp::all_gather);
  }
  template <comm_element T>
  void broadcast(T* b, std::int64_t n, int root, CallOptions o = {}) {
    note<T>(CommOp::broadcast, n);
    pass(
        o, [&](auto& c) { return c.broadcast(b, n, root, o); },
        [&](auto& c) { return c.broadcast(b, n, root); });
    completed(CommOp::broadcast);
  }
  template <comm_element T>
  void send(const T* b, std::int64_t n, int peer, int tag, CallOptions o = {}) {
    note<T>(CommOp::send, n);
    pass(
        o, [&](auto& c) { return c.send(b, n, peer, tag, o); },
        [&](auto& c) { return c.send(b, n, peer, tag); });
    completed(CommOp::send);
  }
  template <comm_element T>
  void recv(T* b, std::int64_t n, int peer, int tag, CallOptions o = {}) {
    note<T>(CommOp::recv, n);
    pass(
        o, [&](auto& c) { return c.recv(b, n, peer, tag, o); },
        [&](auto& c) { return c.recv(b, n, peer, tag); });
    completed(CommOp::recv);
  }
  void barrier(CallOptions o = {}) {
    note<std::uint8_t>(CommOp::barrier, 0);
    pass(
        o, [&](auto& c) { c.barrier(o); }, [&](auto& c) { c.barrier(); });
    completed(CommOp::barrier);
  }
  /// A group of point-to-point operations (comm/local/comm.hpp `group_start`): forwarded.
  void group_start() requires requires(C& c) { c.group_start(); }
  { inner_.group_start(); }
  template <class... Extra>
  requires requires(C& c, Extra&&... e) { c.group_end(std::forward<Extra>(e)...); }
  void group_end(Extra&&... extra) { inner_.group_end(std::forward<Extra>(extra)...); }
  /// Splits the inner communicator; extra arguments (a group name, CallOptions) are passed
  /// through.
  template <class... Extra>
  Counting split(int color, int key, Extra&&... extra) {
    note<std::uint8_t>(CommOp::split, 0);
    return Counting(inner_.split(color, key, std::forward<Extra>(extra)...), counters_);
  }

  template <comm_element T>
  Work all_reduce_async(const T* s, T* r, std::int64_t n, ReduceOp op, CallOptions o = {}) {
    note<T>(CommOp::all_reduce, n);
    Work w = pass(
        o, [&](auto& c) { return c.all_reduce_async(s, r, n, op, o); },
        [&](auto& c) { return c.all_reduce_async(s, r, n, op); });
    return counted(CommOp::all_reduce, std::move(w));
  }
  template <comm_element T>
  Work reduce_scatter_async(const T* s, T* r, std::int64_t n, ReduceOp op, CallOptions o = {}) {
    note<T>(CommOp::reduce_scatter, n);
    Work w = pass(
        o, [&](auto& c) { return c.reduce_scatter_async(s, r, n, op, o); },
        [&](auto& c) { return c.reduce_scatter_async(s, r, n, op); });
    return counted(CommOp::reduce_scatter, std::move(w));
  }
  template <comm_element T>
  Work all_gather_async(const T* s, T* r, std::int64_t n, CallOptions o = {}) {
    note<T>(CommOp::all_gather, n);
    Work w = pass(
        o, [&](auto& c) { return c.all_gather_async(s, r, n, o); },
        [&](auto& c) { return c.all_gather_async(s, r, n); });
    return counted(CommOp::all_gather, std::move(w));
  }
  template <comm_element T>
  Work broadcast_async(T* b, std::int64_t n, int root, CallOptions o = {}) {
    note<T>(CommOp::broadcast, n);
    Work w = pass(
        o, [&](auto& c) { return c.broadcast_async(b, n, root, o); },
        [&](auto& c) { return c.broadcast_async(b, n, root); });
    return counted(CommOp::broadcast, std::move(w));
  }
  template <comm_element T>
  Work send_async(const T* b, std::int64_t n, int peer, int tag, CallOptions o = {}) {
    note<T>(CommOp::send, n);
    Work w = pass(
        o, [&](auto& c) { return c.send_async(b, n, peer, tag, o); },
        [&](auto& c) { return c.send_async(b, n, peer, tag); });
    return counted(CommOp::send, std::move(w));
  }
  template <comm_element T>
  Work recv_async(T* b, std::int64_t n, int peer, int tag, CallOptions o = {}) {
    note<T>(CommOp::recv, n);
    Work w = pass(
        o, [&](auto& c) { return c.recv_async(b, n, peer, tag, o); },
        [&](auto& c) { return c.recv_async(b, n, peer, tag); });
    return counted(CommOp::recv, std::move(w));
  }

 private:
  /// Runs `with(inner_)` (the call with its CallOptions) when the inner communicator takes them,
  /// else `without(inner_)`, refusing with ConfigError options it could not pass on.
  template <class With, class Without>
  decltype(auto) pass(const CallOptions& o, With with, Without without) {
    if constexpr (call_options_communicator<C>) {
      return with(inner_);
    } else {
      check<ConfigError>(o.timeout.count() == 0 && o.stream == nullptr, "fourway: Counting over ",
                         "group '", inner_.name(),
                         "' got CallOptions, but its inner communicator "
                         "takes none; model fw::call_options_communicator in it or pass none");
      return without(inner_);
    }
  }

  template <class T>
  void note(CommOp op, std::int64_t n) {
    const auto payload = n > 0 ? static_cast<std::uint64_t>(n) * sizeof(T) : 0u;
    counters_->add(std::string(inner_.name()), op, payload, inner_.size());
  }
  /// A blocking call of `op` returned: a host wait, or a device order inside
  /// `complete_in_stream_order`.
  void completed(CommOp op) {
    counters_->complete(std::string(inner_.name()), op,
                        in_stream_order_ ? Completion::device_order : Completion::host_wait);
  }
  /// `w`, counting how it is completed.
  Work counted(CommOp op, Work w) {
    return Work(std::make_shared<detail::CountedWork>(std::move(w), counters_,
                                                      std::string(inner_.name()), op));
  }
  C inner_;
  std::shared_ptr<CommCounters> counters_;
  bool in_stream_order_ = false;  // a blocking call made by complete_in_stream_order
};

}  // namespace fourway
