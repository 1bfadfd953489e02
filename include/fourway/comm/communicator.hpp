//! The communicator concept, the types every backend shares, and `fw::launch<World>(n, fn)`.
//!
//! A communicator is one rank's handle on one group. Every collective is called by every rank of
//! the group, in the same order; the k-th collective call of each rank is matched with the k-th
//! of the others (its *sequence number*, 1-based, per group, shown in every error). Point-to-point
//! messages are matched by (peer, tag), FIFO within one (peer, tag) pair, so two transfers in
//! flight between the same pair with different tags can never be swapped.
//!
//! API, the same for `LocalComm`, `MpiComm`, `NcclComm` and `Counting<C>` (T is any
//! `comm_element`: float, fp16, bf16 -- 16-bit sums accumulate in fp32 --, double, int32, int64):
//!
//!   all_reduce(const T* send, T* recv, count, op)    recv[i] = op over ranks of send[i];
//!                                                    in place when send == recv
//!   reduce_scatter(const T* send, T* recv, count, op) send holds count*size elements; rank r
//!                                                    gets block r: recv[i] = op_q
//!                                                    send_q[r*count+i] (recv may alias send +
//!                                                    rank*count)
//!   all_gather(const T* send, T* recv, count)        recv[q*count + i] = send_q[i]
//!                                                    (send may alias recv + rank*count)
//!   broadcast(T* buf, count, root)                   buf = root's buf
//!   send(const T* buf, count, peer, tag) / recv(T* buf, count, peer, tag)
//!   barrier()
//!   split(color, key) -> a communicator of the same kind over the ranks with the same color,
//!                        ranked by (key, old rank); a collective over the parent group
//!   *_async(...) -> Work (wait() rethrows the failure, test() polls); the blocking form is
//!                   the async form followed by wait()
//!   rank(), size(), name() (the group name every error message carries)
//!
//! Counts are per rank and in elements (`std::int64_t`), so reduce_scatter and all_gather are
//! always even. A total that does not divide by the group size is either padded by the caller
//! (`padded_count`) or moved with `all_gather_v` / `reduce_scatter_v` below; `shard_count`
//! rejects it with a ShapeError that names the numbers and both fixes.
//!
//! Every blocking wait has a deadline (`CommOptions::deadline`): a rank that never arrives turns
//! into `CommTimeout` naming group, op, sequence number and the missing rank(s). With
//! `CommOptions::debug` every collective first checks that all ranks agree on op, dtype, count,
//! reduce op and root, and throws `CommMismatch` on every rank naming the ranks and fields that
//! differ (LocalWorld checks this always: there it costs nothing).
//!
//! A communicator object is used by one thread at a time (its rank's). It is movable, not
//! copyable.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"

namespace fourway {

/// Reductions. `avg` is the sum divided by the group size (truncating for integers).
enum class ReduceOp : std::uint8_t { sum, avg, max, min };

constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

/// The operations a communicator performs (for messages, counters and mismatch checks).
enum class CommOp : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  send,
  recv,
  barrier,
  split,
};
inline constexpr int comm_op_count = 8;

constexpr std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::broadcast: return "broadcast";
    case CommOp::send: return "send";
    case CommOp::recv: return "recv";
    case CommOp::barrier: return "barrier";
    case CommOp::split: return "split";
  }
  return "?";
}

/// Element types a communicator moves. 16-bit floats are reduced in fp32.
template <class T>
concept comm_element = floating_dtype<T> || std::is_same_v<T, double> ||
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

/// Options every backend honours.
struct CommOptions {
  /// Longest time any blocking wait may take before it throws CommTimeout. Default: 5 minutes
  /// (a step of a large model can legitimately keep a rank busy for a minute).
  std::chrono::milliseconds deadline{std::chrono::minutes(5)};
  /// Check before each collective that all ranks agree on op, dtype, count, reduce op and root.
  bool debug = false;
};

/// A handle on an asynchronous operation. `wait()` blocks until it finished and rethrows its
/// failure (CommTimeout, CommMismatch, ...); `test()` returns whether it finished (successfully
/// or not) without blocking. A default-constructed Work is already complete.
class Work {
 public:
  struct State {
    virtual ~State() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;
  };
  Work() = default;
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}
  void wait() {
    if (state_) state_->wait();
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
/// Accumulator of a reduction: fp32 for 16-bit floats, int64 (wrapping) for integers.
template <class T>
struct accumulator {
  using type = float;
};
template <>
struct accumulator<double> {
  using type = double;
};
template <>
struct accumulator<std::int32_t> {
  using type = std::int64_t;
};
template <>
struct accumulator<std::int64_t> {
  using type = std::int64_t;
};

template <class A>
FOURWAY_HOST_DEVICE constexpr A acc_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
  } else {
    return a + b;
  }
}

/// The blocking forms of a communicator whose operations are async at heart (MPI, NCCL): each
/// is its `*_async` form followed by `wait()`.
template <class Derived>
class BlockingForms {
 public:
  template <comm_element T>
  void all_reduce(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    self().all_reduce_async(send, recv, count, op).wait();
  }
  template <comm_element T>
  void reduce_scatter(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    self().reduce_scatter_async(send, recv, count, op).wait();
  }
  template <comm_element T>
  void all_gather(const T* send, T* recv, std::int64_t count) {
    self().all_gather_async(send, recv, count).wait();
  }
  template <comm_element T>
  void broadcast(T* buf, std::int64_t count, int root) {
    self().broadcast_async(buf, count, root).wait();
  }
  template <comm_element T>
  void send(const T* buf, std::int64_t count, int peer, int tag) {
    self().send_async(buf, count, peer, tag).wait();
  }
  template <comm_element T>
  void recv(T* buf, std::int64_t count, int peer, int tag) {
    self().recv_async(buf, count, peer, tag).wait();
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

/// One rank's view of a collective call, as compared across ranks and shown in messages.
struct CallDesc {
  CommOp op = CommOp::barrier;
  Dtype dtype = Dtype::u8;
  std::int64_t count = 0;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  bool device = false;  // device memory (LocalWorld on a GPU)
};

/// "all_reduce(fp32, count 12, sum)", the way messages show a call.
inline std::string describe_call(const CallDesc& c) {
  std::ostringstream os;
  os << comm_op_name(c.op);
  if (c.op == CommOp::barrier || c.op == CommOp::split) return os.str();
  os << "(" << dtype_name(c.dtype) << ", count " << c.count;
  if (c.op == CommOp::all_reduce || c.op == CommOp::reduce_scatter)
    os << ", " << reduce_op_name(c.reduce);
  if (c.op == CommOp::broadcast) os << ", root " << c.root;
  if (c.device) os << ", device memory";
  os << ")";
  return os.str();
}

/// The fields in which call `s` differs from `ref` ("op", "count", ...); empty when they agree
/// (no allocation then: the collectives' fast path checks every call with it).
inline std::vector<std::string> differing_fields(const CallDesc& s, const CallDesc& ref) {
  std::vector<std::string> fields;
  if (s.op != ref.op) fields.emplace_back("op");
  if (s.op == ref.op && s.op != CommOp::barrier && s.op != CommOp::split) {
    if (s.dtype != ref.dtype) fields.emplace_back("dtype");
    if (s.count != ref.count) fields.emplace_back("count");
    if ((s.op == CommOp::all_reduce || s.op == CommOp::reduce_scatter) && s.reduce != ref.reduce) {
      fields.emplace_back("reduce op");
    }
    if (s.op == CommOp::broadcast && s.root != ref.root) fields.emplace_back("root");
    if (s.device != ref.device && s.count > 0 && ref.count > 0) fields.emplace_back("memory kind");
  }
  return fields;
}

/// Compares every rank's call with rank 0's; empty when all agree, else "rank 0 called ...;
/// rank 2 called ... (count differ)". `who(q)` names rank q.
template <class Who>
std::string mismatch_report(const std::vector<CallDesc>& calls, Who who) {
  const auto& ref = calls.at(0);
  std::ostringstream diff;
  bool bad = false;
  for (std::size_t q = 1; q < calls.size(); ++q) {
    const auto& s = calls[q];
    const std::vector<std::string> fields = differing_fields(s, ref);
    if (fields.empty()) continue;
    bad = true;
    diff << "; " << who(static_cast<int>(q)) << " called " << describe_call(s) << " (";
    for (std::size_t i = 0; i < fields.size(); ++i) diff << (i ? ", " : "") << fields[i];
    diff << " differ)";
  }
  if (!bad) return {};
  return cat(who(0), " called ", describe_call(ref), diff.str(),
             ". Every rank of a group must make the same collective calls in the same order");
}
}  // namespace detail

/// The communicator concept (checked with float; each model is templated on the element type).
template <class C>
concept communicator = std::movable<C> &&
    requires(C& c, const float* s, float* r, std::int64_t n, int i) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.name() } -> std::convertible_to<std::string_view>;
  c.all_reduce(s, r, n, ReduceOp::sum);
  c.reduce_scatter(s, r, n, ReduceOp::sum);
  c.all_gather(s, r, n);
  c.broadcast(r, n, i);
  c.send(s, n, i, i);
  c.recv(r, n, i, i);
  c.barrier();
  { c.split(i, i) } -> std::same_as<C>;
  { c.all_reduce_async(s, r, n, ReduceOp::sum) } -> std::same_as<Work>;
  { c.reduce_scatter_async(s, r, n, ReduceOp::sum) } -> std::same_as<Work>;
  { c.all_gather_async(s, r, n) } -> std::same_as<Work>;
  { c.broadcast_async(r, n, i) } -> std::same_as<Work>;
  { c.send_async(s, n, i, i) } -> std::same_as<Work>;
  { c.recv_async(r, n, i, i) } -> std::same_as<Work>;
};

// ---- uneven counts ------------------------------------------------------------------------------

/// `total / size`, or a ShapeError naming the numbers and the fixes when it does not divide.
inline std::int64_t shard_count(std::int64_t total, int size, std::string_view what = "count") {
  check<ShapeError>(size > 0 && total >= 0, "fourway: cannot shard ", what, " ", total, " over ",
                    size, " ranks");
  check<ShapeError>(total % size == 0, "fourway: ", what, " ", total,
                    " does not divide by the group size ", size, " (remainder ", total % size,
                    "); pad it to ", (total + size - 1) / size * size,
                    " with fw::padded_count, or use fw::all_gather_v / fw::reduce_scatter_v");
  return total / size;
}

/// The smallest multiple of `size` that is >= `total`.
constexpr std::int64_t padded_count(std::int64_t total, int size) {
  return (total + size - 1) / size * size;
}

/// all_gather with a different count per rank (host memory): `recv` receives the ranks' blocks
/// back to back, `counts[q]` elements from rank q. Runs as one padded all_gather.
template <communicator C, comm_element T>
void all_gather_v(C& comm, const T* send, T* recv, const std::vector<std::int64_t>& counts) {
  const int n = comm.size();
  check<ShapeError>(static_cast<int>(counts.size()) == n, "fourway: all_gather_v in group '",
                    comm.name(), "' got ", counts.size(), " counts for ", n, " ranks");
  std::int64_t max_count = 0;
  for (auto c : counts) {
    check<ShapeError>(c >= 0, "fourway: all_gather_v count ", c, " is negative");
    max_count = std::max(max_count, c);
  }
  std::vector<T> padded_send(static_cast<std::size_t>(max_count));
  std::vector<T> gathered(static_cast<std::size_t>(max_count * n));
  const auto mine = counts[static_cast<std::size_t>(comm.rank())];
  if (mine > 0) std::memcpy(padded_send.data(), send, static_cast<std::size_t>(mine) * sizeof(T));
  comm.all_gather(padded_send.data(), gathered.data(), max_count);
  std::int64_t at = 0;
  for (int q = 0; q < n; ++q) {
    const auto c = counts[static_cast<std::size_t>(q)];
    if (c > 0) {
      std::memcpy(recv + at, gathered.data() + q * max_count,
                  static_cast<std::size_t>(c) * sizeof(T));
    }
    at += c;
  }
}

/// reduce_scatter with a different count per rank (host memory): `send` holds sum(counts)
/// elements, rank r receives the reduction of its block of `counts[r]` elements.
template <communicator C, comm_element T>
void reduce_scatter_v(C& comm, const T* send, T* recv, const std::vector<std::int64_t>& counts,
                      ReduceOp op) {
  const int n = comm.size();
  check<ShapeError>(static_cast<int>(counts.size()) == n, "fourway: reduce_scatter_v in group '",
                    comm.name(), "' got ", counts.size(), " counts for ", n, " ranks");
  std::int64_t max_count = 0;
  for (auto c : counts) {
    check<ShapeError>(c >= 0, "fourway: reduce_scatter_v count ", c, " is negative");
    max_count = std::max(max_count, c);
  }
  std::vector<T> padded(static_cast<std::size_t>(max_count * n), T{});
  std::int64_t at = 0;
  for (int q = 0; q < n; ++q) {
    const auto c = counts[static_cast<std::size_t>(q)];
    if (c > 0) {
      std::memcpy(padded.data() + q * max_count, send + at,
                  static_cast<std::size_t>(c) * sizeof(T));
    }
    at += c;
  }
  std::vector<T> mine(static_cast<std::size_t>(max_count));
  comm.reduce_scatter(padded.data(), mine.data(), max_count, op);
  const auto c = counts[static_cast<std::size_t>(comm.rank())];
  if (c > 0) std::memcpy(recv, mine.data(), static_cast<std::size_t>(c) * sizeof(T));
}

// ---- launching ranks ----------------------------------------------------------------------------

/// What `launch` hands each rank: the world communicator, the rank's own memory accountant and
/// a host context on it. `W` is the world kind (LocalWorld, MpiWorld); `W::comm_type` its
/// communicator. A device context is made by the caller: `fw::Context<fw::Cuda> d(w.memory(),
/// dev)`.
template <class W>
class World {
 public:
  using world_type = W;
  using comm_type = typename W::comm_type;

  explicit World(comm_type comm)
      : rank_(comm.rank()),
        size_(comm.size()),
        comm_(std::move(comm)),
        memory_(rank_),
        ctx_(memory_) {}
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  [[nodiscard]] comm_type& comm() { return comm_; }
  [[nodiscard]] MemoryAccountant& memory() { return memory_; }
  [[nodiscard]] Context<Host>& ctx() { return ctx_; }
  /// This rank and the world size (kept even if the caller moves the communicator out).
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }

 private:
  int rank_;
  int size_;
  comm_type comm_;
  MemoryAccountant memory_;
  Context<Host> ctx_;
};

/// Runs `fn(World<W>&)` on `n` ranks of the world kind `W` and returns when all finished. If a
/// rank throws, the others fail fast (their pending waits throw CommError) and `launch` rethrows
/// the first failure. For LocalWorld, `n` ranks are threads; for MpiWorld, `n` must equal the
/// number of processes mpirun started (or 0 for "all").
template <class W, class Fn>
void launch(int n, Fn&& fn, CommOptions options = {}) {
  W::launch(n, std::forward<Fn>(fn), options);
}

}  // namespace fourway
