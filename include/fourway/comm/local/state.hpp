//! LocalWorld's shared state: the world (abort, exits, wake-ups), a group (members, published
//! slots, arrival counters, mailboxes, buffer pool), one rank on a group (`LocalRankState`:
//! sequence numbers, stream, this call's options, traffic counters, events, executor) and
//! `LocalCommBase`, the root of LocalComm's parts, with the bookkeeping every operation shares.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "fourway/comm/call_desc.hpp"
#include "fourway/comm/local/executor.hpp"
#include "fourway/comm/local/gate.hpp"
#include "fourway/comm/types.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

#if defined(FOURWAY_CUDA_COMPILATION)
#include <cuda_runtime_api.h>
#endif

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
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
  // The next unclaimed chunk of the collective of each sequence parity (share_chunks); reset by
  // rank 0 when it enters, before it publishes its arrival.
  std::atomic<std::int64_t> next_chunk[2] = {0, 0};
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

inline std::string exception_message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

/// One rank's state on one group (behind a pointer in LocalComm, so queued async work keeps a
/// stable address when the communicator moves).
struct LocalRankState {
  LocalRankState(std::shared_ptr<LocalGroup> g, int r)
      : group(std::move(g)),
        rank(r),
        call{group->options.deadline, nullptr},
        gate(std::make_shared<LocalGate>([w = group->world] { w->notify(); })) {}
  LocalRankState(const LocalRankState&) = delete;
  LocalRankState& operator=(const LocalRankState&) = delete;
  // Queued work still runs: its worker may now move data (comm/local/gate.hpp), then is joined.
  ~LocalRankState() { gate->open_forever(); }
  std::shared_ptr<LocalGroup> group;
  int rank;
  std::uint64_t seq = 0;    // collectives entered
  std::uint64_t sends = 0;  // point-to-point sends posted
  std::uint64_t recvs = 0;  // point-to-point receives started
  void* stream = nullptr;   // cudaStream_t for device memory (set_stream)
  // The operation now running, its options resolved: `timeout` is never 0 (the call's or the
  // group's deadline), `stream` is the call's or `stream`. Set before each operation runs (one
  // at a time per communicator: on the caller's thread when the executor is idle, else on it).
  CallOptions call;
  std::array<std::atomic<std::uint64_t>, comm_op_count> moved_in{};   // bytes read from peers
  std::array<std::atomic<std::uint64_t>, comm_op_count> moved_out{};  // bytes written to peers
  LocalEvents events;
  std::shared_ptr<LocalGate> gate;  // when the worker may move data (comm/local/gate.hpp)
  LocalExecutor exec;               // last: joined before the rest is destroyed
};

/// The root of LocalComm's parts (rendezvous, device part, mailbox, LocalComm itself): the
/// rank's state and the bookkeeping every operation shares.
class LocalCommBase {
 protected:
  LocalCommBase() = default;
  LocalCommBase(std::shared_ptr<LocalGroup> group, int rank)
      : s_(std::make_unique<LocalRankState>(std::move(group), rank)) {}

  std::unique_ptr<LocalRankState> s_;

  LocalGroup& g() const { return *s_->group; }
  [[nodiscard]] int size() const { return s_->group->size; }

  /// Resolves `o` against the group's deadline and the bound stream (see LocalRankState::call).
  [[nodiscard]] CallOptions resolve(const CallOptions& o) const {
    return {call_deadline(g().options, o), o.stream != nullptr ? o.stream : s_->stream};
  }

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
  LocalSlot slot(CommOp op, std::int64_t count, const void* send, void* recv,
                 ReduceOp reduce = ReduceOp::sum, int root = 0) const {
    LocalSlot s;
    s.op = op;
    s.dtype = dtype_v<T>;
    s.count = count;
    s.reduce = reduce;
    s.root = root;
    s.send = send;
    s.recv = recv;
    return s;
  }
};

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
