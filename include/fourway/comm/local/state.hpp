//! LocalWorld's shared state: the world (abort, exits, wake-ups), a group (members, published
//! slots, arrival counters, mailboxes, buffer pool), one rank on a group (`LocalRankState`:
//! sequence numbers, stream, this call's options, traffic counters, events, executor) and
//! `LocalCommBase`, the root of LocalComm's parts, with the bookkeeping every operation shares.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "fourway/comm/call_desc.hpp"
#include "fourway/comm/local/activity.hpp"
#include "fourway/comm/local/executor.hpp"
#include "fourway/comm/local/gate.hpp"
#include "fourway/comm/types.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"

#if defined(FOURWAY_CUDA_COMPILATION)
#include <cuda_runtime_api.h>
#endif

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
FOURWAY_BEGIN_MODE_NAMESPACE

/// What one rank has posted on one group and not finished: the strict world's deadlock report
/// lists it (guarded by the world's mutex).
struct LocalPendingOps {
  int world_rank = 0;
  std::string group;                                      // the group's header
  std::deque<std::pair<std::uint64_t, std::string>> ops;  // (id, description), posted order
  std::uint64_t next_id = 0;
  std::string waiting;  // what the operation now running waits for, while it waits
};

/// State shared by every group of one LocalWorld launch: the synchronisation core
/// (comm/local/activity.hpp), abort, exits, and the strict world's pending operations.
struct LocalWorldState : LocalWorldSync {
  explicit LocalWorldState(int n, bool strict_world = false)
      : LocalWorldSync(n, strict_world),
        exited(static_cast<std::size_t>(n), 0),
        poll_first(static_cast<unsigned>(n) <= std::thread::hardware_concurrency()) {
    pending_report = [this] { return report_pending_locked(); };
  }
  std::atomic<bool> aborted{false};
  int failed_rank = -1;      // world rank whose function threw first (guarded by mu)
  std::string failure;       // its message (guarded by mu)
  std::vector<char> exited;  // world rank returned from its function (guarded by mu)
  // Every rank has a core of its own: a waiter polls with a pause before it yields its core.
  const bool poll_first;
  // The strict world: every rank's pending operations per group (guarded by mu).
  std::vector<std::weak_ptr<LocalPendingOps>> pending;

  void abort(int world_rank, const std::string& what) {
    {
      std::lock_guard lock(mu);
      if (!aborted.load()) {
        failed_rank = world_rank;
        failure = what;
        aborted.store(true);
      }
      notify_changed();
    }
  }
  void mark_exited(int world_rank) {
    {
      std::lock_guard lock(mu);
      exited[static_cast<std::size_t>(world_rank)] = 1;
      busy.fetch_sub(1, std::memory_order_acq_rel);
      notify_changed();
    }
  }

  /// Every rank's pending operations, rank by rank (lock held).
  std::string report_pending_locked() {
    std::erase_if(pending, [](const std::weak_ptr<LocalPendingOps>& p) { return p.expired(); });
    std::vector<std::shared_ptr<LocalPendingOps>> all;
    for (const auto& w : pending) all.push_back(w.lock());
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& a, const auto& b) { return a->world_rank < b->world_rank; });
    std::ostringstream os;
    for (std::size_t r = 0; r < exited.size(); ++r) {
      os << "\n  world rank " << r << ":";
      bool any = false;
      for (const auto& p : all) {
        if (p->world_rank != static_cast<int>(r) || p->ops.empty()) continue;
        any = true;
        os << " in " << p->group << ": ";
        for (std::size_t i = 0; i < p->ops.size(); ++i)
          os << (i ? "; then " : "") << p->ops[i].second;
        if (!p->waiting.empty()) os << " [waiting: " << p->waiting << "]";
        os << ".";
      }
      if (exited[r]) {
        os << " returned from its function.";
      } else if (!any) {
        os << " nothing pending.";
      }
    }
    return os.str();
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
  // this rank's traffic counters (per op): a chunk credits the rank that owns its result, on
  // whichever rank's thread it runs
  std::atomic<std::uint64_t>* moved_in = nullptr;
  std::atomic<std::uint64_t>* moved_out = nullptr;
  /// Adds `in` / `out` bytes of `op` to this rank's counters.
  void credit(CommOp op, std::int64_t in, std::int64_t out) const {
    const auto i = static_cast<std::size_t>(op);
    if (in > 0) moved_in[i].fetch_add(static_cast<std::uint64_t>(in), std::memory_order_relaxed);
    if (out > 0) moved_out[i].fetch_add(static_cast<std::uint64_t>(out), std::memory_order_relaxed);
  }
};

struct LocalMessage {
  Dtype dtype;
  std::int64_t count;
  int tag;                            // the strict world matches by order and checks the tag
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
  // (src, dst, tag); the strict world matches by order, as NCCL does: (src, dst, 0)
  std::map<std::tuple<int, int, int>, std::deque<LocalMessage>> mail;
  // Messages ever taken from each mailbox: a strict send waits until its own has been (its
  // place in the mailbox's FIFO is the count posted before it plus one).
  std::map<std::tuple<int, int, int>, std::uint64_t> taken;
  std::map<std::tuple<int, int, int>, std::uint64_t> posted;
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
        gate(std::make_shared<LocalGate>([w = group->world] { w->notify(); })) {
    if (!group->world->strict) return;
    // NCCL progresses every communicator on its own: no waiting for the rank's thread
    gate->open_forever();
    pending = std::make_shared<LocalPendingOps>();
    pending->world_rank = group->world_ranks[static_cast<std::size_t>(rank)];
    pending->group = group->header();
    exec.set_activity([w = group->world.get()](int d) {
      // a worker that runs out of tasks may have been the last thing running
      if (w->busy.fetch_add(d, std::memory_order_acq_rel) + d == 0) w->notify();
    });
    std::lock_guard lock(group->world->mu);
    group->world->pending.push_back(pending);
  }
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
  // The rank's accountant (bound by World): the strict world checks buffers against it.
  MemoryAccountant* memory = nullptr;
  // The strict world: what this rank posted on this group and has not finished.
  std::shared_ptr<LocalPendingOps> pending;
  // group_start() / group_end(): the depth and the operations collected at depth > 0.
  int group_depth = 0;
  std::vector<std::function<void()>> group_sends;  // post a send, return at once
  std::vector<std::function<void()>> group_recvs;  // receive (waits for the message)
  std::vector<std::function<void()>> group_waits;  // strict: wait until a send was taken
  std::vector<std::string> group_text;
  std::shared_ptr<LocalWorkState> group_work;
  LocalExecutor exec;  // last: joined before the rest is destroyed
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
    s.moved_in = s_->moved_in.data();
    s.moved_out = s_->moved_out.data();
    return s;
  }
};

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
