//! LocalWorld: N ranks as threads of one process, and `LocalComm`, its communicator.
//!
//! Collectives are shared-memory and bandwidth-optimal: at entry every rank publishes its buffer
//! pointers; then rank r alone owns slice r of the result. For all_reduce it reads slice r of
//! every rank's send buffer, reduces in the fixed order rank 0, 1, ..., N-1 (fp32 accumulation for
//! 16-bit types) and writes the result into slice r of *every* rank's recv buffer; each rank thus
//! reads N·count/N and writes N·count/N elements, as a ring would, but in one pass. A second
//! rendezvous ("done") keeps every buffer alive until all readers finished. The reduction order
//! never depends on timing or slicing, so results are bitwise identical run to run (and equal to
//! the one-rank reduction of the same inputs in the same order).
//!
//!     rank:        0            1            2
//!     send:   [a0|a1|a2]   [b0|b1|b2]   [c0|c1|c2]
//!     owner:   r0 r1 r2     r0 r1 r2     r0 r1 r2      slice s is reduced by rank s:
//!     recv:   [S0|S1|S2]   [S0|S1|S2]   [S0|S1|S2]     Ss = (as + bs) + cs, written to all
//!
//! Point-to-point is eager: `send` copies the message into the (src, dst, tag) mailbox of the
//! group and returns; `recv` takes the oldest message of that mailbox. Every wait has the group's
//! deadline, fails fast when the world was aborted (a rank threw) or when the awaited rank already
//! returned from its function, and names group, op, sequence number and missing ranks. The op,
//! dtype, count, reduce op and root of every collective are checked across ranks at entry (always:
//! the descriptors are already in shared memory), so mismatched calls throw CommMismatch on every
//! rank instead of reading out of bounds.
//!
//! Async forms run on one worker thread per communicator, in call order; a blocking call runs on
//! the caller's thread when that worker is idle, else after the queued work.
//!
//! Traffic is *measured*: each rank counts, per op, the bytes its copy loops read out of peers'
//! buffers (`in`) and write into peers' buffers (`out`), as they do it (`LocalComm::traffic()`).
//! An all_reduce of P bytes on N ranks moves about (N−1)/N·P in and (N−1)/N·P out per rank (the
//! same total as a ring); reduce_scatter and all_gather move (N−1)·P_rank in; a broadcast moves P
//! into each non-root rank; send/recv count the message out of the sender and into the receiver.
//! Copies within a rank's own buffers are not traffic.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "fourway/comm/communicator.hpp"

#if defined(FOURWAY_CUDA_COMPILATION)
#include "fourway/comm/device_reduce.cuh"
#include "fourway/comm/peer_access.hpp"
#endif

namespace fourway {
// Device memory changes the bodies below in a CUDA translation unit: every name of this file lives
// in the mode's inline namespace (config.hpp), so host and CUDA units of one program link two
// distinct sets of symbols, never two bodies under one name.
FOURWAY_BEGIN_MODE_NAMESPACE

class LocalComm;

/// The world kind "ranks as threads": `fw::launch<fw::LocalWorld>(n, fn)`.
struct LocalWorld {
  using comm_type = LocalComm;
  template <class Fn>
  static void launch(int n, Fn&& fn, CommOptions options = {});
};

FOURWAY_END_MODE_NAMESPACE

namespace detail {
FOURWAY_BEGIN_MODE_NAMESPACE

/// State shared by every group of one LocalWorld launch.
struct LocalWorldState {
  explicit LocalWorldState(int n)
      : exited(static_cast<std::size_t>(n), 0),
        poll_first(static_cast<unsigned>(n) <= std::thread::hardware_concurrency()) {}
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> aborted{false};
  std::atomic<int> sleepers{0};  // threads inside the blocking part of a wait (see notify)
  int failed_rank = -1;          // world rank whose function threw first (guarded by mu)
  std::string failure;           // its message (guarded by mu)
  std::vector<char> exited;      // world rank returned from its function (guarded by mu)
  // Every rank has a core of its own: a waiter polls with a pause before it yields its core.
  const bool poll_first;

  /// Wakes the blocked waiters after a change of an atomic they wait on. A waiter counts itself
  /// in `sleepers` (then a fence) before it takes the lock and checks; the change is made (then a
  /// fence) before `sleepers` is read here. So either the waiter sees the change, or this sees
  /// the waiter and takes the lock, which orders the notify after the waiter's check. With no
  /// waiter (the common case of a collective whose peers are polling) it costs one load.
  void notify() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleepers.load(std::memory_order_relaxed) == 0) return;
    { std::lock_guard lock(mu); }
    cv.notify_all();
  }
  void abort(int world_rank, const std::string& what) {
    {
      std::lock_guard lock(mu);
      if (!aborted.load()) {
        failed_rank = world_rank;
        failure = what;
        aborted.store(true);
      }
    }
    cv.notify_all();
  }
  void mark_exited(int world_rank) {
    {
      std::lock_guard lock(mu);
      exited[static_cast<std::size_t>(world_rank)] = 1;
    }
    cv.notify_all();
  }
};

struct LocalGroup;

/// What one rank published for its current collective.
struct LocalSlot {
  std::uint64_t seq = 0;
  CommOp op = CommOp::barrier;
  Dtype dtype = Dtype::u8;
  std::int64_t count = 0;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  int color = 0;
  int key = 0;
  std::shared_ptr<LocalGroup> split_result;
  bool device = false;
  void* ready_event = nullptr;  // cudaEvent_t of a device collective: the inputs are ready
  void* done_event = nullptr;   // cudaEvent_t: this rank's part is written
};

struct LocalMessage {
  Dtype dtype;
  std::int64_t count;
  std::uint64_t number;               // the sender's send sequence number in this group
  std::unique_ptr<std::byte[]> data;  // host messages (a buffer of the group's pool)
  std::size_t capacity = 0;           // bytes allocated at `data`
  void* device_data = nullptr;        // device messages: a staging buffer ...
  void* event = nullptr;              // ... ready once this cudaEvent_t completes
};

/// One group: its members, their published slots (double-buffered by sequence parity: a rank
/// can be at most one collective ahead of a peer that still reads its slot), arrival counters
/// and the point-to-point mailboxes. Guarded by the world's mutex, except the atomic counters.
struct LocalGroup {
  LocalGroup(std::shared_ptr<LocalWorldState> w, std::string n, std::vector<int> ranks,
             CommOptions o)
      : world(std::move(w)),
        name(std::move(n)),
        world_ranks(std::move(ranks)),
        options(o),
        size(static_cast<int>(world_ranks.size())),
        arrived(new std::atomic<std::uint64_t>[world_ranks.size()]),
        done(new std::atomic<std::uint64_t>[world_ranks.size()]) {
    for (auto& s : slots) s.resize(world_ranks.size());
    for (int q = 0; q < size; ++q) {
      arrived[q].store(0);
      done[q].store(0);
    }
  }
  std::shared_ptr<LocalWorldState> world;
  std::string name;
  std::vector<int> world_ranks;
  CommOptions options;
  int size;
  std::vector<LocalSlot> slots[2];
  std::unique_ptr<std::atomic<std::uint64_t>[]> arrived;
  std::unique_ptr<std::atomic<std::uint64_t>[]> done;
  std::map<std::tuple<int, int, int>, std::deque<LocalMessage>> mail;  // (src, dst, tag)
  // Host message buffers handed back by receivers, reused by senders: a steady stream of large
  // messages then costs two memcpys, not fresh pages every time. At most `pool_max` are kept.
  static constexpr std::size_t pool_max = 16;
  std::vector<std::pair<std::unique_ptr<std::byte[]>, std::size_t>> pool;

  [[nodiscard]] std::string who(int q) const {
    if (world_ranks[static_cast<std::size_t>(q)] == q) return detail::cat("rank ", q);
    return detail::cat("rank ", q, " (world rank ", world_ranks[static_cast<std::size_t>(q)], ")");
  }
  [[nodiscard]] std::string header() const {
    return detail::cat("group '", name, "' (", size, " ranks)");
  }
};

inline CallDesc call_of(const LocalSlot& s) {
  return {s.op, s.dtype, s.count, s.reduce, s.root, s.device};
}
inline std::string describe_slot(const LocalSlot& s) { return describe_call(call_of(s)); }

template <class T, class A>
inline A acc_load(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<A>(v);
  } else {
    return convert<A>(v);
  }
}
template <class T, class A>
inline T acc_store(A v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return convert<T>(static_cast<float>(v));
  }
}

/// dst[0, bytes) = src[0, bytes) with non-temporal stores where the CPU has them (SSE2); the
/// caller issues `stream_fence()` before another thread may read dst.
inline void stream_copy(void* dst, const void* src, std::int64_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
#if defined(__SSE2__)
  const auto head = static_cast<std::int64_t>((16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  if (head >= bytes) {
    std::memcpy(d, s, static_cast<std::size_t>(bytes));
    return;
  }
  std::memcpy(d, s, static_cast<std::size_t>(head));
  std::int64_t i = head;
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  }
  std::memcpy(d + i, s + i, static_cast<std::size_t>(bytes - i));
#else
  std::memcpy(d, s, static_cast<std::size_t>(bytes));
#endif
}
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/// dst[d][i] = op over q = 0..n-1 (in this order) of src[q][i], for i in [lo, hi), d < ndst.
template <class T>
void reduce_range(const T* const* src, int n, T* const* dst, int ndst, std::int64_t lo,
                  std::int64_t hi, ReduceOp op) {
  using A = typename accumulator<T>::type;
  constexpr std::int64_t chunk = 2048;
  A acc[chunk];
  alignas(64) T staged[chunk];
  // Above this size the result is written with non-temporal stores: no read-for-ownership of the
  // destination lines, which is a third of the memory traffic of a large all_reduce.
  const bool streaming =
      (hi - lo) * static_cast<std::int64_t>(sizeof(T)) * ndst >= (std::int64_t{1} << 21);
  for (std::int64_t base = lo; base < hi; base += chunk) {
    const std::int64_t len = std::min(chunk, hi - base);
    const T* s0 = src[0] + base;
    for (std::int64_t j = 0; j < len; ++j) acc[j] = acc_load<T, A>(s0[j]);
    for (int q = 1; q < n; ++q) {
      const T* s = src[q] + base;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          for (std::int64_t j = 0; j < len; ++j) acc[j] = acc_add(acc[j], acc_load<T, A>(s[j]));
          break;
        case ReduceOp::max:
          for (std::int64_t j = 0; j < len; ++j) {
            const A v = acc_load<T, A>(s[j]);
            acc[j] = acc[j] < v ? v : acc[j];
          }
          break;
        case ReduceOp::min:
          for (std::int64_t j = 0; j < len; ++j) {
            const A v = acc_load<T, A>(s[j]);
            acc[j] = v < acc[j] ? v : acc[j];
          }
          break;
      }
    }
    if (op == ReduceOp::avg) {
      const A div = static_cast<A>(n);
      for (std::int64_t j = 0; j < len; ++j) acc[j] = acc[j] / div;
    }
    if (!streaming) {
      for (int d = 0; d < ndst; ++d) {
        T* out = dst[d] + base;
        for (std::int64_t j = 0; j < len; ++j) out[j] = acc_store<T, A>(acc[j]);
      }
      continue;
    }
    for (std::int64_t j = 0; j < len; ++j) staged[j] = acc_store<T, A>(acc[j]);
    for (int d = 0; d < ndst; ++d)
      stream_copy(dst[d] + base, staged, len * static_cast<std::int64_t>(sizeof(T)));
  }
  if (streaming) stream_fence();
}

/// One pointer per rank of a group, on the stack up to 16 ranks (a collective allocates nothing
/// then), on the heap above.
template <class P>
class RankPointers {
 public:
  explicit RankPointers(int n) : heap_(n > 16 ? static_cast<std::size_t>(n) : 0) {}
  P* data() { return heap_.empty() ? local_.data() : heap_.data(); }
  P& operator[](int q) { return data()[q]; }

 private:
  std::array<P, 16> local_{};
  std::vector<P> heap_;
};

/// A hint to the core that this thread is polling (x86 `pause`, Arm `yield`).
inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// [lo, hi) of slice `r` when `count` elements are split over `n` owners as evenly as possible.
inline std::pair<std::int64_t, std::int64_t> balanced_slice(std::int64_t count, int n, int r) {
  const std::int64_t base = count / n;
  const std::int64_t extra = count % n;
  const std::int64_t lo = r * base + std::min<std::int64_t>(r, extra);
  return {lo, lo + base + (r < extra ? 1 : 0)};
}

/// The CUDA events of one rank's device collectives (`cudaEvent_t`, created on first use), by
/// sequence parity: a peer can be one collective behind and still wait on the previous pair.
struct LocalEvents {
  void* ready[2] = {nullptr, nullptr};
  void* done[2] = {nullptr, nullptr};
  LocalEvents() = default;
  LocalEvents(const LocalEvents&) = delete;
  LocalEvents& operator=(const LocalEvents&) = delete;
#if defined(FOURWAY_CUDA_COMPILATION)
  ~LocalEvents() {
    for (void* e : {ready[0], ready[1], done[0], done[1]}) {
      if (e != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
    }
  }
#endif
};

/// One worker thread running a communicator's async operations in order.
class LocalExecutor {
 public:
  LocalExecutor() = default;
  LocalExecutor(const LocalExecutor&) = delete;
  LocalExecutor& operator=(const LocalExecutor&) = delete;
  ~LocalExecutor() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  /// True when nothing is queued or running (only the owner posts, so this stays true).
  bool idle() {
    std::lock_guard lock(mu_);
    return queue_.empty() && !running_;
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(task));
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      auto task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      lock.unlock();
      task();  // never throws: tasks catch into their Work
      lock.lock();
      running_ = false;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
};

inline std::string exception_message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

FOURWAY_END_MODE_NAMESPACE
}  // namespace detail

FOURWAY_BEGIN_MODE_NAMESPACE

/// Bytes one rank moved between ranks on one group, per op (see the file comment): `in` read
/// from peers' buffers, `out` written into peers' buffers. A snapshot of `LocalComm::traffic()`.
struct CommTraffic {
  std::array<std::uint64_t, comm_op_count> in{};
  std::array<std::uint64_t, comm_op_count> out{};
  [[nodiscard]] std::uint64_t moved(CommOp op) const {
    return in[static_cast<std::size_t>(op)] + out[static_cast<std::size_t>(op)];
  }
  /// in + out over every op.
  [[nodiscard]] std::uint64_t total() const {
    std::uint64_t t = 0;
    for (int i = 0; i < comm_op_count; ++i) t += moved(static_cast<CommOp>(i));
    return t;
  }
};

/// One rank's handle on one LocalWorld group. See the file comment for the algorithms.
class LocalComm {
 public:
  LocalComm(std::shared_ptr<detail::LocalGroup> group, int rank)
      : s_(std::make_unique<State>(std::move(group), rank)) {}

  [[nodiscard]] int rank() const { return s_->rank; }
  [[nodiscard]] int size() const { return s_->group->size; }
  [[nodiscard]] std::string_view name() const { return s_->group->name; }
  [[nodiscard]] const CommOptions& options() const { return s_->group->options; }
  /// This rank's rank in the world the group was split from.
  [[nodiscard]] int world_rank() const {
    return s_->group->world_ranks[static_cast<std::size_t>(s_->rank)];
  }
  /// Collectives this rank has entered on this group (the last sequence number).
  [[nodiscard]] std::uint64_t sequence() const { return s_->seq; }
  /// The bytes this rank moved between ranks on this group, measured by the copy loops (see the
  /// file comment). Read it between operations (async ones waited for).
  [[nodiscard]] CommTraffic traffic() const {
    CommTraffic t;
    for (std::size_t i = 0; i < t.in.size(); ++i) {
      t.in[i] = s_->moved_in[i].load(std::memory_order_relaxed);
      t.out[i] = s_->moved_out[i].load(std::memory_order_relaxed);
    }
    return t;
  }
  void reset_traffic() {
    for (auto& c : s_->moved_in) c.store(0, std::memory_order_relaxed);
    for (auto& c : s_->moved_out) c.store(0, std::memory_order_relaxed);
  }
  /// The CUDA stream (a `cudaStream_t`) this rank's device-memory operations are ordered on;
  /// set it to the rank's `Context<Cuda>::stream()` (borrowed, never destroyed here). Device
  /// buffers are refused with ConfigError while none is set. Host memory ignores it.
  void set_stream(void* stream) { s_->stream = stream; }
  [[nodiscard]] void* stream() const { return s_->stream; }

  // ---- blocking forms ----------------------------------------------------------------------
  template <comm_element T>
  void all_reduce(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    run_sync([=, this] { all_reduce_now(send, recv, count, op); });
  }
  template <comm_element T>
  void reduce_scatter(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    run_sync([=, this] { reduce_scatter_now(send, recv, count, op); });
  }
  template <comm_element T>
  void all_gather(const T* send, T* recv, std::int64_t count) {
    run_sync([=, this] { all_gather_now(send, recv, count); });
  }
  template <comm_element T>
  void broadcast(T* buf, std::int64_t count, int root) {
    run_sync([=, this] { broadcast_now(buf, count, root); });
  }
  template <comm_element T>
  void send(const T* buf, std::int64_t count, int peer, int tag) {
    run_sync([=, this] { send_now(buf, count, peer, tag); });
  }
  template <comm_element T>
  void recv(T* buf, std::int64_t count, int peer, int tag) {
    run_sync([=, this] { recv_now(buf, count, peer, tag); });
  }
  void barrier() {
    run_sync([this] { barrier_now(); });
  }
  /// A communicator over the ranks that pass the same `color` (>= 0), ranked by (key, rank).
  /// `name` names the new group in messages (default: "<parent>/<color>").
  LocalComm split(int color, int key, std::string name = {}) {
    LocalComm out;
    run_sync([&, this] { out = split_now(color, key, std::move(name)); });
    return out;
  }

  // ---- async forms -------------------------------------------------------------------------
  template <comm_element T>
  Work all_reduce_async(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    return run_async([=, this] { all_reduce_now(send, recv, count, op); });
  }
  template <comm_element T>
  Work reduce_scatter_async(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    return run_async([=, this] { reduce_scatter_now(send, recv, count, op); });
  }
  template <comm_element T>
  Work all_gather_async(const T* send, T* recv, std::int64_t count) {
    return run_async([=, this] { all_gather_now(send, recv, count); });
  }
  template <comm_element T>
  Work broadcast_async(T* buf, std::int64_t count, int root) {
    return run_async([=, this] { broadcast_now(buf, count, root); });
  }
  template <comm_element T>
  Work send_async(const T* buf, std::int64_t count, int peer, int tag) {
    return run_async([=, this] { send_now(buf, count, peer, tag); });
  }
  template <comm_element T>
  Work recv_async(T* buf, std::int64_t count, int peer, int tag) {
    return run_async([=, this] { recv_now(buf, count, peer, tag); });
  }
  Work barrier_async() {
    return run_async([this] { barrier_now(); });
  }

 private:
  LocalComm() = default;

  struct State {
    State(std::shared_ptr<detail::LocalGroup> g, int r) : group(std::move(g)), rank(r) {}
    std::shared_ptr<detail::LocalGroup> group;
    int rank;
    std::uint64_t seq = 0;    // collectives entered
    std::uint64_t sends = 0;  // point-to-point sends posted
    std::uint64_t recvs = 0;  // point-to-point receives started
    void* stream = nullptr;   // cudaStream_t for device memory
    std::array<std::atomic<std::uint64_t>, comm_op_count> moved_in{};   // bytes read from peers
    std::array<std::atomic<std::uint64_t>, comm_op_count> moved_out{};  // bytes written to peers
    detail::LocalEvents events;
    detail::LocalExecutor exec;  // last: joined before the rest is destroyed
  };
  // Behind a pointer so queued async work keeps a stable address when the LocalComm moves.
  std::unique_ptr<State> s_;

  detail::LocalGroup& g() const { return *s_->group; }

  template <class F>
  void run_sync(F&& f) {
    check<CommError>(s_ != nullptr, "fourway: use of a moved-from LocalComm");
    if (s_->exec.idle()) {
      f();
      return;
    }
    run_async(std::forward<F>(f)).wait();
  }
  template <class F>
  Work run_async(F f) {
    check<CommError>(s_ != nullptr, "fourway: use of a moved-from LocalComm");
    auto st = std::make_shared<detail::CompletionState>();
    s_->exec.post([st, f = std::move(f)]() mutable {
      try {
        f();
        st->finish(nullptr);
      } catch (...) {
        st->finish(std::current_exception());
      }
    });
    return Work(st);
  }

  // ---- waiting -----------------------------------------------------------------------------

  /// Waits until `ready()` holds. `ready` may be evaluated without the lock when `spin`;
  /// `missing()` lists the group ranks waited for; `what()` describes the wait for messages.
  template <class Ready, class Missing, class What>
  void wait_until(bool spin, Ready ready, Missing missing, What what) const {
    auto& group = g();
    auto& world = *group.world;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + group.options.deadline;
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
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
        std::ostringstream os;
        os << "fourway: CommTimeout: " << what() << ": waited " << waited << " ms (deadline "
           << group.options.deadline.count() << " ms) for ";
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
        os << ". If those ranks are only slow, raise CommOptions::deadline; otherwise find the "
              "rank that skipped, reordered or never reached this call";
        throw CommTimeout(os.str());
      }
      world.cv.wait_until(lock, deadline);
    }
  }

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
    // slot parity is rewritten two collectives later, after every peer has left this one.
    group.slots[me.seq % 2][static_cast<std::size_t>(s_->rank)] = me;
    group.arrived[s_->rank].store(me.seq, std::memory_order_release);
    group.world->notify();
    wait_for_all(group.arrived.get(), me, " (arrival)");
    verify(me);
    return me;
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

  // ---- the operations, run on the calling or the worker thread -------------------------------

  /// Adds to this rank's measured traffic of `op`: `in` bytes read from peers, `out` written.
  void add_traffic(CommOp op, std::int64_t in, std::int64_t out) {
    s_->moved_in[static_cast<std::size_t>(op)].fetch_add(static_cast<std::uint64_t>(in),
                                                         std::memory_order_relaxed);
    s_->moved_out[static_cast<std::size_t>(op)].fetch_add(static_cast<std::uint64_t>(out),
                                                          std::memory_order_relaxed);
  }

  void check_count(std::int64_t count, CommOp op) const {
    check<ShapeError>(count >= 0, "fourway: ", comm_op_name(op), " in ", g().header(),
                      " got a negative count ", count);
  }
  void check_rank(int r, std::string_view role, CommOp op) const {
    check<ConfigError>(r >= 0 && r < size(), "fourway: ", comm_op_name(op), " in ", g().header(),
                       " got ", role, " ", r, "; valid ranks are 0..", size() - 1);
  }

  template <class T>
  detail::LocalSlot slot(CommOp op, std::int64_t count, const void* send, void* recv,
                         ReduceOp reduce = ReduceOp::sum, int root = 0) const {
    detail::LocalSlot s;
    s.op = op;
    s.dtype = dtype_v<T>;
    s.count = count;
    s.reduce = reduce;
    s.root = root;
    s.send = send;
    s.recv = recv;
    return s;
  }

  template <class T>
  void all_reduce_now(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    check_count(count, CommOp::all_reduce);
#if defined(FOURWAY_CUDA_COMPILATION)
    if (detail::is_device_pointer(send) || detail::is_device_pointer(recv)) {
      return device_all_reduce(send, recv, count, op);
    }
#endif
    const auto me = enter(slot<T>(CommOp::all_reduce, count, send, recv, op));
    auto& group = g();
    const int n = group.size;
    detail::RankPointers<const T*> src(n);
    detail::RankPointers<T*> dst(n);
    for (int q = 0; q < n; ++q) {
      const auto& s = group.slots[me.seq % 2][static_cast<std::size_t>(q)];
      src[q] = static_cast<const T*>(s.send);
      dst[q] = static_cast<T*>(s.recv);
    }
    const auto [lo, hi] = detail::balanced_slice(count, n, s_->rank);
    detail::reduce_range<T>(src.data(), n, dst.data(), n, lo, hi, op);
    // slice [lo, hi) was read from every peer's send buffer and written into every peer's recv
    const std::int64_t slice = (hi - lo) * static_cast<std::int64_t>(sizeof(T));
    add_traffic(CommOp::all_reduce, slice * (n - 1), slice * (n - 1));
    leave(me);
  }

  template <class T>
  void reduce_scatter_now(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    check_count(count, CommOp::reduce_scatter);
#if defined(FOURWAY_CUDA_COMPILATION)
    if (detail::is_device_pointer(send) || detail::is_device_pointer(recv)) {
      return device_reduce_scatter(send, recv, count, op);
    }
#endif
    const auto me = enter(slot<T>(CommOp::reduce_scatter, count, send, recv, op));
    auto& group = g();
    const int n = group.size;
    detail::RankPointers<const T*> src(n);
    for (int q = 0; q < n; ++q) {
      src[q] = static_cast<const T*>(group.slots[me.seq % 2][static_cast<std::size_t>(q)].send) +
               static_cast<std::int64_t>(s_->rank) * count;
    }
    T* out = recv;
    detail::reduce_range<T>(src.data(), n, &out, 1, 0, count, op);
    // block `rank` was read from every peer's send buffer; the result stays in this rank's recv
    add_traffic(CommOp::reduce_scatter, count * static_cast<std::int64_t>(sizeof(T)) * (n - 1), 0);
    leave(me);
  }

  template <class T>
  void all_gather_now(const T* send, T* recv, std::int64_t count) {
    check_count(count, CommOp::all_gather);
#if defined(FOURWAY_CUDA_COMPILATION)
    if (detail::is_device_pointer(send) || detail::is_device_pointer(recv)) {
      return device_all_gather(send, recv, count);
    }
#endif
    const auto me = enter(slot<T>(CommOp::all_gather, count, send, recv));
    auto& group = g();
    std::int64_t from_peers = 0;
    for (int q = 0; q < group.size; ++q) {
      const T* src =
          static_cast<const T*>(group.slots[me.seq % 2][static_cast<std::size_t>(q)].send);
      T* dst = recv + static_cast<std::int64_t>(q) * count;
      if (src != dst && count > 0)
        std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(T));
      if (q != s_->rank) from_peers += count * static_cast<std::int64_t>(sizeof(T));
    }
    add_traffic(CommOp::all_gather, from_peers, 0);
    leave(me);
  }

  template <class T>
  void broadcast_now(T* buf, std::int64_t count, int root) {
    check_count(count, CommOp::broadcast);
    check_rank(root, "root", CommOp::broadcast);
#if defined(FOURWAY_CUDA_COMPILATION)
    if (detail::is_device_pointer(buf)) return device_broadcast(buf, count, root);
#endif
    const auto me = enter(slot<T>(CommOp::broadcast, count, buf, buf, ReduceOp::sum, root));
    auto& group = g();
    const T* src =
        static_cast<const T*>(group.slots[me.seq % 2][static_cast<std::size_t>(root)].send);
    if (src != buf && count > 0) std::memcpy(buf, src, static_cast<std::size_t>(count) * sizeof(T));
    if (root != s_->rank)
      add_traffic(CommOp::broadcast, count * static_cast<std::int64_t>(sizeof(T)), 0);
    leave(me);
  }

  void barrier_now() {
    detail::LocalSlot s;
    s.op = CommOp::barrier;
    enter(s);
  }

  LocalComm split_now(int color, int key, std::string name) {
    check<ConfigError>(color >= 0, "fourway: split in ", g().header(), " got color ", color,
                       "; colors are >= 0");
    detail::LocalSlot s;
    s.op = CommOp::split;
    s.color = color;
    s.key = key;
    const auto me = enter(s);
    auto& group = g();
    std::vector<std::pair<int, int>> members;  // (key, rank) of my color
    {
      std::lock_guard lock(group.world->mu);
      for (int q = 0; q < group.size; ++q) {
        const auto& o = group.slots[me.seq % 2][static_cast<std::size_t>(q)];
        if (o.color == color) members.emplace_back(o.key, q);
      }
    }
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    std::vector<int> world_ranks;
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == s_->rank) new_rank = static_cast<int>(i);
      world_ranks.push_back(group.world_ranks[static_cast<std::size_t>(members[i].second)]);
    }
    const int leader = members.front().second;
    if (leader == s_->rank) {
      auto child = std::make_shared<detail::LocalGroup>(
          group.world, name.empty() ? detail::cat(group.name, "/", color) : std::move(name),
          std::move(world_ranks), group.options);
      std::lock_guard lock(group.world->mu);
      group.slots[me.seq % 2][static_cast<std::size_t>(s_->rank)].split_result = std::move(child);
    }
    leave(me);
    std::shared_ptr<detail::LocalGroup> result;
    {
      std::lock_guard lock(group.world->mu);
      result = group.slots[me.seq % 2][static_cast<std::size_t>(leader)].split_result;
    }
    return LocalComm(std::move(result), new_rank);
  }

  template <class T>
  void send_now(const T* buf, std::int64_t count, int peer, int tag) {
    check_count(count, CommOp::send);
    check_rank(peer, "peer", CommOp::send);
    check<ConfigError>(tag >= 0, "fourway: send in ", g().header(), " got tag ", tag,
                       "; tags are >= 0");
    auto& group = g();
    if (group.world->aborted.load()) {
      throw_aborted(detail::cat(group.header(), ", send (", dtype_name(dtype_v<T>), ", count ",
                                count, ") on ", group.who(s_->rank), " to ", group.who(peer),
                                " with tag ", tag));
    }
    detail::LocalMessage m{dtype_v<T>, count, ++s_->sends, {}};
#if defined(FOURWAY_CUDA_COMPILATION)
    if (detail::is_device_pointer(buf)) {
      device_stage(m, buf, count);
    } else
#endif
    {
      const auto bytes = static_cast<std::size_t>(count) * sizeof(T);
      if (bytes > 0) {
        {
          std::lock_guard lock(group.world->mu);
          for (auto& [p, cap] : group.pool) {
            if (cap >= bytes && cap <= 2 * bytes + 4096) {
              m.data = std::move(p);
              m.capacity = cap;
              std::swap(p, group.pool.back().first);
              std::swap(cap, group.pool.back().second);
              group.pool.pop_back();
              break;
            }
          }
        }
        if (!m.data) {
          m.data.reset(new std::byte[bytes]);
          m.capacity = bytes;
        }
        std::memcpy(m.data.get(), buf, bytes);
      }
    }
    {
      std::lock_guard lock(group.world->mu);
      group.mail[{s_->rank, peer, tag}].push_back(std::move(m));
    }
    group.world->cv.notify_all();
    if (peer != s_->rank)
      add_traffic(CommOp::send, 0, count * static_cast<std::int64_t>(sizeof(T)));
  }

  template <class T>
  void recv_now(T* buf, std::int64_t count, int peer, int tag) {
    check_count(count, CommOp::recv);
    check_rank(peer, "peer", CommOp::recv);
    auto& group = g();
    const auto number = ++s_->recvs;
    const std::tuple<int, int, int> box{peer, s_->rank, tag};
    auto ready = [&] {
      auto it = group.mail.find(box);
      return it != group.mail.end() && !it->second.empty();
    };
    auto what = [&] {
      std::ostringstream os;
      os << group.header() << ", recv #" << number << " (" << dtype_name(dtype_v<T>) << ", count "
         << count << ") on " << group.who(s_->rank) << " from " << group.who(peer) << " with tag "
         << tag;
      std::vector<int> other_tags;
      for (const auto& [k, q] : group.mail) {
        if (std::get<0>(k) == peer && std::get<1>(k) == s_->rank && !q.empty()) {
          other_tags.push_back(std::get<2>(k));
        }
      }
      if (!other_tags.empty()) {
        os << " (messages from that rank are waiting under tags";
        for (int t : other_tags) os << " " << t;
        os << ")";
      }
      return os.str();
    };
    wait_until(
        false, ready, [&] { return std::vector<int>{peer}; }, what);
    detail::LocalMessage m;
    std::string context;
    {
      std::lock_guard lock(group.world->mu);  // wait_until returned with the lock released
      auto& q = group.mail[box];
      m = std::move(q.front());
      q.pop_front();
      if (m.dtype != dtype_v<T> || m.count != count) context = what();
    }
#if defined(FOURWAY_CUDA_COMPILATION)
    const bool device = detail::is_device_pointer(buf) || (count == 0 && m.event != nullptr);
    if (m.event != nullptr && (!device || !context.empty())) drop_device_message(m);
    if (context.empty() && device != (m.event != nullptr)) {
      std::lock_guard lock(group.world->mu);
      throw CommMismatch(detail::cat("fourway: CommMismatch in ", what(), ": the matching send #",
                                     m.number, " carries ", m.event ? "device" : "host",
                                     " memory but this recv writes ", device ? "device" : "host",
                                     " memory"));
    }
#endif
    if (m.dtype != dtype_v<T> || m.count != count) {
      throw CommMismatch(detail::cat("fourway: CommMismatch in ", context, ": the matching send #",
                                     m.number, " carries ", dtype_name(m.dtype), " count ", m.count,
                                     " but this recv expects ", dtype_name(dtype_v<T>), " count ",
                                     count));
    }
    if (peer != s_->rank)
      add_traffic(CommOp::recv, count * static_cast<std::int64_t>(sizeof(T)), 0);
#if defined(FOURWAY_CUDA_COMPILATION)
    if (device) return device_unstage(m, buf, count);
#endif
    if (count > 0) std::memcpy(buf, m.data.get(), static_cast<std::size_t>(count) * sizeof(T));
    if (m.data) {
      std::lock_guard lock(group.world->mu);
      if (group.pool.size() < detail::LocalGroup::pool_max) {
        group.pool.emplace_back(std::move(m.data), m.capacity);
      }
    }
  }

#if defined(FOURWAY_CUDA_COMPILATION)
  // ---- device memory: all ranks on one GPU, each ordered on its own stream ----------------------
  // The host rendezvous orders the streams with events and never waits for the GPU: at entry
  // every rank records `ready` on its stream and, once all arrived, makes its stream wait for
  // every peer's `ready`; it then launches its share and records `done`; after the host "done"
  // rendezvous its stream waits for every peer's `done`.

  cudaStream_t cuda_stream() const { return static_cast<cudaStream_t>(s_->stream); }

  /// Refuses device memory while no stream is set: the legacy stream is unordered with the
  /// context's non-blocking one.
  void require_stream(CommOp op) const {
    check<ConfigError>(s_->stream != nullptr, "fourway: ", comm_op_name(op),
                       " on device memory in ", g().header(), " refused on rank ", s_->rank,
                       ": no stream is set, so it would run unordered with the kernels that "
                       "write the buffers; call comm.set_stream(ctx.stream()) with the rank's "
                       "Context<Cuda> first");
  }

  /// Enables peer access to every GPU holding a peer's buffer (kernels read them directly), or
  /// throws DeviceError naming the GPUs when that is impossible.
  void enable_peer_access(const detail::LocalSlot& me) const {
    const int mine = detail::device_of_pointer(me.send != nullptr ? me.send : me.recv);
    if (mine < 0) return;
    std::vector<int> devices;
    for (const auto& o : g().slots[me.seq % 2]) {
      devices.push_back(detail::device_of_pointer(o.send != nullptr ? o.send : o.recv));
    }
    const auto can = [](int from, int to) {
      int ok = 0;
      return cudaDeviceCanAccessPeer(&ok, from, to) == cudaSuccess && ok != 0;
    };
    for (int d : peer_access_plan(mine, devices, can, g().header())) {
      const cudaError_t st = cudaDeviceEnablePeerAccess(d, 0);  // from the current device, `mine`
      if (st == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        cuda::check_cuda(st, "cudaDeviceEnablePeerAccess");
      }
    }
  }

  /// Makes the GPU holding `p` current for this thread (CUDA's current device is per thread).
  static void use_device_of(const void* p) {
    const int device = detail::device_of_pointer(p);
    if (device >= 0) cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }

  static cudaEvent_t rank_event(void*& slot) {
    if (slot == nullptr) {
      cudaEvent_t e = nullptr;
      cuda::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      slot = e;
    }
    return static_cast<cudaEvent_t>(slot);
  }

  detail::LocalSlot device_enter(detail::LocalSlot me) {
    check<ConfigError>(size() <= detail::max_device_ranks,
                       "fourway: LocalWorld on device memory "
                       "supports groups of up to ",
                       detail::max_device_ranks, " ranks, ", g().header(), " has ", size());
    me.device = true;
    require_stream(me.op);
    use_device_of(me.send != nullptr ? me.send : me.recv);  // async work runs on another thread
    const auto parity = (s_->seq + 1) % 2;
    cudaEvent_t ready = rank_event(s_->events.ready[parity]);
    me.ready_event = ready;
    me.done_event = rank_event(s_->events.done[parity]);
    cuda::check_cuda(cudaEventRecord(ready, cuda_stream()), "cudaEventRecord");
    me = enter(me);
    if (me.op == CommOp::all_reduce || me.op == CommOp::reduce_scatter) enable_peer_access(me);
    const auto& slots = g().slots[me.seq % 2];
    for (int q = 0; q < size(); ++q) {
      if (q == s_->rank) continue;
      cuda::check_cuda(
          cudaStreamWaitEvent(
              cuda_stream(),
              static_cast<cudaEvent_t>(slots[static_cast<std::size_t>(q)].ready_event), 0),
          "cudaStreamWaitEvent");
    }
    return me;
  }

  void device_leave(const detail::LocalSlot& me) {
    cuda::check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(me.done_event), cuda_stream()),
                     "cudaEventRecord");
    leave(me);
    const auto& slots = g().slots[me.seq % 2];
    for (int q = 0; q < size(); ++q) {
      if (q == s_->rank) continue;
      cuda::check_cuda(
          cudaStreamWaitEvent(
              cuda_stream(),
              static_cast<cudaEvent_t>(slots[static_cast<std::size_t>(q)].done_event), 0),
          "cudaStreamWaitEvent");
    }
  }

  template <class T>
  detail::DeviceBuffers device_buffers(const detail::LocalSlot& me, std::int64_t src_offset,
                                       T* only_dst) const {
    const auto& slots = g().slots[me.seq % 2];
    detail::DeviceBuffers b{};
    b.n = size();
    b.ndst = only_dst != nullptr ? 1 : size();
    for (int q = 0; q < size(); ++q) {
      const auto& o = slots[static_cast<std::size_t>(q)];
      b.src[q] = static_cast<const T*>(o.send) + src_offset;
      if (only_dst == nullptr) b.dst[q] = o.recv;
    }
    if (only_dst != nullptr) b.dst[0] = only_dst;
    return b;
  }

  template <class T>
  void device_all_reduce(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    const auto me = device_enter(slot<T>(CommOp::all_reduce, count, send, recv, op));
    const auto b = device_buffers<T>(me, 0, nullptr);
    const auto [lo, hi] = detail::balanced_slice(count, size(), s_->rank);
    detail::device_reduce<T>(b, lo, hi, op, cuda_stream());
    const std::int64_t slice = (hi - lo) * static_cast<std::int64_t>(sizeof(T));
    add_traffic(CommOp::all_reduce, slice * (size() - 1), slice * (size() - 1));
    device_leave(me);
  }

  template <class T>
  void device_reduce_scatter(const T* send, T* recv, std::int64_t count, ReduceOp op) {
    const auto me = device_enter(slot<T>(CommOp::reduce_scatter, count, send, recv, op));
    const auto b = device_buffers<T>(me, static_cast<std::int64_t>(s_->rank) * count, recv);
    detail::device_reduce<T>(b, 0, count, op, cuda_stream());
    add_traffic(CommOp::reduce_scatter, count * static_cast<std::int64_t>(sizeof(T)) * (size() - 1),
                0);
    device_leave(me);
  }

  template <class T>
  void device_all_gather(const T* send, T* recv, std::int64_t count) {
    const auto me = device_enter(slot<T>(CommOp::all_gather, count, send, recv));
    const auto& slots = g().slots[me.seq % 2];
    for (int q = 0; q < size(); ++q) {
      const T* src = static_cast<const T*>(slots[static_cast<std::size_t>(q)].send);
      T* dst = recv + static_cast<std::int64_t>(q) * count;
      if (src != dst && count > 0) {
        cuda::check_cuda(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(count) * sizeof(T),
                                         cudaMemcpyDeviceToDevice, cuda_stream()),
                         "cudaMemcpyAsync (all_gather)");
      }
    }
    add_traffic(CommOp::all_gather, count * static_cast<std::int64_t>(sizeof(T)) * (size() - 1), 0);
    device_leave(me);
  }

  template <class T>
  void device_broadcast(T* buf, std::int64_t count, int root) {
    const auto me = device_enter(slot<T>(CommOp::broadcast, count, buf, buf, ReduceOp::sum, root));
    const T* src =
        static_cast<const T*>(g().slots[me.seq % 2][static_cast<std::size_t>(root)].send);
    if (src != buf && count > 0) {
      cuda::check_cuda(cudaMemcpyAsync(buf, src, static_cast<std::size_t>(count) * sizeof(T),
                                       cudaMemcpyDeviceToDevice, cuda_stream()),
                       "cudaMemcpyAsync (broadcast)");
    }
    if (root != s_->rank)
      add_traffic(CommOp::broadcast, count * static_cast<std::int64_t>(sizeof(T)), 0);
    device_leave(me);
  }

  /// Eager device send: the message is copied into a staging buffer on the sender's stream; the
  /// receiver's stream waits for the sender's event, copies it out and frees the staging buffer.
  template <class T>
  void device_stage(detail::LocalMessage& m, const T* buf, std::int64_t count) {
    const auto bytes = static_cast<std::size_t>(count) * sizeof(T);
    require_stream(CommOp::send);
    use_device_of(buf);
    if (bytes > 0) {
      cuda::check_cuda(cudaMallocAsync(&m.device_data, bytes, cuda_stream()),
                       "cudaMallocAsync (send)");
      cuda::check_cuda(
          cudaMemcpyAsync(m.device_data, buf, bytes, cudaMemcpyDeviceToDevice, cuda_stream()),
          "cudaMemcpyAsync (send)");
    }
    cudaEvent_t e = nullptr;
    cuda::check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    cuda::check_cuda(cudaEventRecord(e, cuda_stream()), "cudaEventRecord");
    m.event = e;
  }

  /// Frees a staged device message that will not be received (its memory came from
  /// cudaMallocAsync, so it goes back with cudaFreeAsync once the sender's copy is done).
  static void drop_device_message(detail::LocalMessage& m) {
    (void)cudaEventSynchronize(static_cast<cudaEvent_t>(m.event));
    if (m.device_data != nullptr) {
      use_device_of(m.device_data);
      (void)cudaFreeAsync(m.device_data, nullptr);
      m.device_data = nullptr;
    }
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(m.event));
    m.event = nullptr;
  }

  template <class T>
  void device_unstage(detail::LocalMessage& m, T* buf, std::int64_t count) {
    const auto bytes = static_cast<std::size_t>(count) * sizeof(T);
    if (s_->stream == nullptr) {
      drop_device_message(m);
      require_stream(CommOp::recv);
    }
    auto e = static_cast<cudaEvent_t>(m.event);
    use_device_of(buf);
    cuda::check_cuda(cudaStreamWaitEvent(cuda_stream(), e, 0), "cudaStreamWaitEvent");
    if (bytes > 0) {
      cuda::check_cuda(
          cudaMemcpyAsync(buf, m.device_data, bytes, cudaMemcpyDeviceToDevice, cuda_stream()),
          "cudaMemcpyAsync (recv)");
      cuda::check_cuda(cudaFreeAsync(m.device_data, cuda_stream()), "cudaFreeAsync (recv)");
    }
    (void)cudaEventDestroy(e);
  }
#endif
};

static_assert(communicator<LocalComm>);

template <class Fn>
void LocalWorld::launch(int n, Fn&& fn, CommOptions options) {
  check<ConfigError>(n >= 1, "fourway: LocalWorld::launch needs at least 1 rank, got ", n);
  check<ConfigError>(options.deadline.count() > 0,
                     "fourway: CommOptions::deadline must be "
                     "positive, got ",
                     options.deadline.count(), " ms");
  auto world = std::make_shared<detail::LocalWorldState>(n);
  std::vector<int> ranks(static_cast<std::size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto group = std::make_shared<detail::LocalGroup>(world, "world", std::move(ranks), options);
  std::mutex first_mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        World<LocalWorld> w(LocalComm(group, r));
        fn(w);
      } catch (...) {
        auto e = std::current_exception();
        {
          std::lock_guard lock(first_mu);
          if (!first) first = e;
        }
        world->abort(r, detail::exception_message(e));
      }
      world->mark_exited(r);
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway
