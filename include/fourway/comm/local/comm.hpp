//! LocalWorld: N ranks as threads of one process, and `LocalComm`, its communicator: the public
//! operations, the host collectives and `LocalWorld::launch`.
//!
//! Collectives are shared-memory and bandwidth-optimal: at entry every rank publishes its buffer
//! pointers; then each piece of the result is computed once, in one pass. For all_reduce, piece s
//! is read from every rank's send buffer, reduced in the fixed order rank 0, 1, ..., N-1 (fp32
//! accumulation for 16-bit types) and written into piece s of *every* rank's recv buffer; with
//! the pieces spread evenly, each rank reads and writes count elements, as a ring would. A second
//! rendezvous ("done") keeps every buffer alive until all readers finished. The reduction order
//! never depends on timing or on who computes a piece, so results are bitwise identical run to run
//! (and equal to the one-rank reduction of the same inputs in the same order).
//!
//!     rank:        0            1            2
//!     send:   [a0|a1|a2]   [b0|b1|b2]   [c0|c1|c2]
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
//! The reductions and copies of all_reduce, reduce_scatter and all_gather are cut into 64 KiB
//! chunks that any rank of the group may claim (`share_chunks`): a slice is no longer bound to
//! its owner, so a rank that is blocked does the work of a peer that is still computing. The
//! element-wise order of every reduction is the same whoever runs a chunk.
//!
//! Async forms run on one worker thread per communicator, in call order; a blocking call runs on
//! the caller's thread when that worker is idle, else after the queued work. The worker claims
//! chunks only while the rank's own thread is blocked on the communicator (comm/local/gate.hpp):
//! with one core per rank, overlapped communication uses the cores of ranks that wait instead of
//! competing with a rank's compute.
//!
//! Traffic is counted per rank and op inside each chunk as it runs (`LocalComm::traffic()`): the
//! bytes read out of peers' buffers (`in`) and written into peers' buffers (`out`) for the part of
//! the result the rank owns (its balanced slice of an all_reduce, its block of a reduce_scatter or
//! of an all_gather's receive), whichever rank's thread ran the chunks. An all_reduce of P bytes on
//! N ranks moves about (N−1)/N·P in and (N−1)/N·P out per rank (the same total as a ring);
//! reduce_scatter and all_gather move (N−1)·P_rank in; a broadcast moves P into each non-root
//! rank; send/recv count the message out of the sender and into the receiver. Copies within a
//! rank's own buffers are not traffic.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fourway/comm/buffer_kind.hpp"
#include "fourway/comm/concept.hpp"
#include "fourway/comm/launch.hpp"
#include "fourway/comm/local/mailbox.hpp"
#include "fourway/comm/local/reduce.hpp"
#include "fourway/comm/work.hpp"
#include "fourway/core/memory.hpp"

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
/// Its parts, one file each: comm/local/state.hpp (LocalCommBase), rendezvous.hpp, device.hpp,
/// mailbox.hpp; the host collectives are below.
class LocalComm : private detail::LocalMailbox {
 public:
  LocalComm(std::shared_ptr<detail::LocalGroup> group, int rank)
      : detail::LocalMailbox(std::move(group), rank) {}

  [[nodiscard]] int rank() const { return s_->rank; }
  [[nodiscard]] int size() const { return LocalCommBase::size(); }
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
  /// buffers are refused with ConfigError while none is set (and no call passes
  /// `CallOptions::stream`, which overrides it for that call). Host memory ignores both.
  void set_stream(void* stream) { s_->stream = stream; }
  [[nodiscard]] void* stream() const { return s_->stream; }

  /// The rank's accountant (World binds it): the strict world accepts a host buffer only inside
  /// a live block of it (core/memory.hpp `owns`) and turns its block tracking on. Groups split
  /// from this one inherit it.
  void bind_memory(MemoryAccountant& memory) {
    s_->memory = &memory;
    if (g().world->strict) memory.track_blocks(true);
  }
  /// Whether this communicator holds its calls to NCCL's contract (CommOptions::strict).
  [[nodiscard]] bool strict() const { return g().world->strict; }

  // ---- blocking forms ----------------------------------------------------------------------
  template <comm_element T>
  void all_reduce(const T* send, T* recv, std::int64_t count, ReduceOp op, CallOptions o = {}) {
    buffers<T>(CommOp::all_reduce, send, recv, count, count, op);
    run_sync(o, call_text<T>(CommOp::all_reduce, count, op),
             [=, this] { all_reduce_now(send, recv, count, op); });
  }
  template <comm_element T>
  void reduce_scatter(const T* send, T* recv, std::int64_t count, ReduceOp op, CallOptions o = {}) {
    buffers<T>(CommOp::reduce_scatter, send, recv, count * size(), count, op);
    run_sync(o, call_text<T>(CommOp::reduce_scatter, count, op),
             [=, this] { reduce_scatter_now(send, recv, count, op); });
  }
  template <comm_element T>
  void all_gather(const T* send, T* recv, std::int64_t count, CallOptions o = {}) {
    buffers<T>(CommOp::all_gather, send, recv, count, count * size());
    run_sync(o, call_text<T>(CommOp::all_gather, count),
             [=, this] { all_gather_now(send, recv, count); });
  }
  template <comm_element T>
  void broadcast(T* buf, std::int64_t count, int root, CallOptions o = {}) {
    buffers<T>(CommOp::broadcast, buf, buf, count, count, ReduceOp::sum, root);
    run_sync(o, call_text<T>(CommOp::broadcast, count, ReduceOp::sum, root),
             [=, this] { broadcast_now(buf, count, root); });
  }
  template <comm_element T>
  void send(const T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    buffers<T>(CommOp::send, buf, nullptr, count, 0);
    run_sync(o, p2p_text<T>(CommOp::send, count, peer, tag),
             [=, this] { send_now(buf, count, peer, tag); });
  }
  template <comm_element T>
  void recv(T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    buffers<T>(CommOp::recv, nullptr, buf, 0, count);
    run_sync(o, p2p_text<T>(CommOp::recv, count, peer, tag),
             [=, this] { recv_now(buf, count, peer, tag); });
  }
  void barrier(CallOptions o = {}) {
    run_sync(o, text_of(CommOp::barrier), [this] { barrier_now(); });
  }
  /// A communicator over the ranks that pass the same `color` (>= 0), ranked by (key, rank).
  /// `name` names the new group in messages (default: "<parent>/<color>"). The new group orders
  /// its device-memory operations on this one's stream, as NcclComm's split children do, and
  /// checks buffers against this one's accountant.
  LocalComm split(int color, int key, std::string name = {}, CallOptions o = {}) {
    LocalComm out;
    run_sync(o, text_of(CommOp::split),
             [&, this] { out = split_now(color, key, std::move(name)); });
    out.set_stream(s_->stream);
    out.s_->memory = s_->memory;
    return out;
  }

  // ---- async forms -------------------------------------------------------------------------
  template <comm_element T>
  Work all_reduce_async(const T* send, T* recv, std::int64_t count, ReduceOp op,
                        CallOptions o = {}) {
    buffers<T>(CommOp::all_reduce, send, recv, count, count, op);
    return run_async(o, call_text<T>(CommOp::all_reduce, count, op),
                     [=, this] { all_reduce_now(send, recv, count, op); });
  }
  template <comm_element T>
  Work reduce_scatter_async(const T* send, T* recv, std::int64_t count, ReduceOp op,
                            CallOptions o = {}) {
    buffers<T>(CommOp::reduce_scatter, send, recv, count * size(), count, op);
    return run_async(o, call_text<T>(CommOp::reduce_scatter, count, op),
                     [=, this] { reduce_scatter_now(send, recv, count, op); });
  }
  template <comm_element T>
  Work all_gather_async(const T* send, T* recv, std::int64_t count, CallOptions o = {}) {
    buffers<T>(CommOp::all_gather, send, recv, count, count * size());
    return run_async(o, call_text<T>(CommOp::all_gather, count),
                     [=, this] { all_gather_now(send, recv, count); });
  }
  template <comm_element T>
  Work broadcast_async(T* buf, std::int64_t count, int root, CallOptions o = {}) {
    buffers<T>(CommOp::broadcast, buf, buf, count, count, ReduceOp::sum, root);
    return run_async(o, call_text<T>(CommOp::broadcast, count, ReduceOp::sum, root),
                     [=, this] { broadcast_now(buf, count, root); });
  }
  /// Inside a group (group_start ... group_end) the send is posted with the group's other
  /// operations at group_end, and its Work completes with the group.
  template <comm_element T>
  Work send_async(const T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    buffers<T>(CommOp::send, buf, nullptr, count, 0);
    if (s_->group_depth > 0) {
      s_->group_sends.push_back([=, this] { posted_.push_back(send_post(buf, count, peer, tag)); });
      s_->group_text.push_back(p2p_text<T>(CommOp::send, count, peer, tag)());
      return Work(s_->group_work);
    }
    return run_async(o, p2p_text<T>(CommOp::send, count, peer, tag),
                     [=, this] { send_now(buf, count, peer, tag); });
  }
  /// Inside a group the recv is posted at group_end, after the group's sends.
  template <comm_element T>
  Work recv_async(T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    buffers<T>(CommOp::recv, nullptr, buf, 0, count);
    if (s_->group_depth > 0) {
      s_->group_recvs.push_back([=, this] { recv_now(buf, count, peer, tag); });
      s_->group_text.push_back(p2p_text<T>(CommOp::recv, count, peer, tag)());
      return Work(s_->group_work);
    }
    return run_async(o, p2p_text<T>(CommOp::recv, count, peer, tag),
                     [=, this] { recv_now(buf, count, peer, tag); });
  }
  Work barrier_async(CallOptions o = {}) {
    return run_async(o, text_of(CommOp::barrier), [this] { barrier_now(); });
  }

  // ---- groups of point-to-point operations (NCCL's ncclGroupStart / ncclGroupEnd) -----------
  /// Starts a group: the `send_async` / `recv_async` calls up to the matching `group_end()` are
  /// posted together, as one operation in this communicator's order, so two ranks may each
  /// send to and receive from the other without waiting for one another (in the strict world an
  /// ungrouped send waits for its recv). Their Works complete together. Inside a group only
  /// `send_async` and `recv_async` are allowed (a blocking call or a collective is refused with
  /// ConfigError: NCCL runs nothing of a group before its end). Groups nest; the outermost end
  /// posts.
  void group_start() {
    check<CommError>(s_ != nullptr, "fourway: use of a moved-from LocalComm");
    if (s_->group_depth++ == 0) {
      s_->group_work = std::make_shared<detail::LocalWorkState>(s_->gate, strict_world());
    }
  }
  /// Ends a group (see group_start); the outermost end posts its operations. Returns at once.
  void group_end(CallOptions o = {}) {
    check<ConfigError>(s_ != nullptr && s_->group_depth > 0, "fourway: group_end() in ",
                       s_ ? g().header() : std::string("a moved-from LocalComm"),
                       " without a group_start()");
    if (--s_->group_depth > 0) return;
    auto sends = std::move(s_->group_sends);
    auto recvs = std::move(s_->group_recvs);
    auto text = std::move(s_->group_text);
    auto st = std::move(s_->group_work);
    s_->group_sends.clear();
    s_->group_recvs.clear();
    s_->group_text.clear();
    if (sends.empty() && recvs.empty()) {
      st->finish(nullptr);
      return;
    }
    std::string what = "group of";
    for (std::size_t i = 0; i < text.size(); ++i) what += (i ? ", " : " ") + text[i];
    post(
        o, st, [what] { return what; },
        [this, sends = std::move(sends), recvs = std::move(recvs)] {
          posted_.clear();
          for (const auto& f : sends) f();  // posted at once: nothing waits for its recv yet
          for (const auto& f : recvs) f();
          if (g().world->strict)
            for (const auto& p : posted_) send_taken(p);
          posted_.clear();
        });
  }
  /// The number of groups open (0: calls run on their own).
  [[nodiscard]] int group_depth() const { return s_->group_depth; }

 private:
  LocalComm() = default;

  /// The world's state for Work states that take part in the strict world's waits (else null).
  [[nodiscard]] std::shared_ptr<detail::LocalWorldSync> strict_world() const {
    return g().world->strict ? std::shared_ptr<detail::LocalWorldSync>(g().world) : nullptr;
  }

  /// Refuses a call inside a group that NCCL would not run there (`what` describes it).
  template <class D>
  void outside_group(D& what) const {
    if (s_->group_depth == 0) return;
    throw ConfigError(detail::cat("fourway: ", what(), " in ", g().header(), " on ",
                                  g().who(s_->rank),
                                  " inside a group (group_start() without group_end()): a group "
                                  "holds send_async and recv_async only, posted at group_end(); "
                                  "end the group first"));
  }

  /// The call's description for the strict world's pending operations (made only there).
  template <class T>
  auto call_text(CommOp op, std::int64_t count, ReduceOp reduce = ReduceOp::sum,
                 int root = 0) const {
    return [=] { return detail::describe_call({op, dtype_v<T>, count, reduce, root, false}); };
  }
  template <class T>
  auto p2p_text(CommOp op, std::int64_t count, int peer, int tag) const {
    return [=, this] {
      return detail::cat(comm_op_name(op), " (", dtype_name(dtype_v<T>), ", count ", count, ") ",
                         op == CommOp::send ? "to " : "from ", g().who(peer), " with tag ", tag);
    };
  }
  /// An operation's name as its description (barrier, split).
  struct OpName {
    CommOp op;
    [[nodiscard]] std::string operator()() const { return std::string(comm_op_name(op)); }
  };
  static OpName text_of(CommOp op) { return {op}; }

  /// The strict world's check of one call's buffers: each must lie in memory the backend
  /// allocated (a live tensor block of the rank's accountant, or device memory), as NCCL takes
  /// device memory only; refused with the CommError NcclComm gives (comm/buffer_kind.hpp).
  template <class T>
  void buffers(CommOp op, const T* send, const T* recv, std::int64_t send_count,
               std::int64_t recv_count, ReduceOp reduce = ReduceOp::sum, int root = 0) const {
    check<CommError>(s_ != nullptr, "fourway: use of a moved-from LocalComm");
    if (!g().world->strict) return;
    auto one = [&](const T* p, std::int64_t count, std::string_view role) {
      if (p == nullptr && count == 0) return;
#if defined(FOURWAY_CUDA_COMPILATION)
      if (detail::is_device_pointer(p)) return;
#endif
      check<ConfigError>(s_->memory != nullptr,
                         "fourway: the strict world checks every buffer "
                         "against the rank's memory accountant, and ",
                         g().header(), " on ", g().who(s_->rank),
                         " has none bound; start the ranks with fw::launch "
                         "(World binds it) or call comm.bind_memory(accountant)");
      if (s_->memory->owns(p, static_cast<std::size_t>(count) * sizeof(T))) return;
      require_nccl_buffer(
          BufferKind::host, count, role,
          detail::cat(detail::describe_call(
                          {op, dtype_v<T>, std::max(send_count, recv_count), reduce, root, false}),
                      " in ", g().header(), " on ", g().who(s_->rank),
                      " (strict world: only tensor "
                      "memory the backend allocated stands for device memory)"));
    };
    if (op != CommOp::recv) one(send, send_count, op == CommOp::broadcast ? "buffer" : "send");
    if (op != CommOp::send && op != CommOp::broadcast) one(recv, recv_count, "recv");
  }

  template <class D, class F>
  void run_sync(const CallOptions& o, D describe, F&& f) {
    check<CommError>(s_ != nullptr, "fourway: use of a moved-from LocalComm");
    outside_group(describe);
    if (s_->exec.idle()) {
      s_->call = resolve(o);
      const detail::LocalGate::Blocked blocked(*s_->gate);  // this thread moves data too
      const Pending pending(*this, describe);
      f();
      return;
    }
    run_async(o, describe, std::forward<F>(f)).wait();
  }
  template <class D, class F>
  Work run_async(const CallOptions& o, D describe, F f) {
    check<CommError>(s_ != nullptr, "fourway: use of a moved-from LocalComm");
    outside_group(describe);
    auto st = std::make_shared<detail::LocalWorkState>(s_->gate, strict_world());
    post(o, st, describe, std::move(f));
    return Work(st);
  }
  /// Queues `f` on the worker; `st` is finished with its outcome.
  template <class D, class F>
  void post(const CallOptions& o, const std::shared_ptr<detail::LocalWorkState>& st, D describe,
            F f) {
    auto& world = *g().world;
    std::uint64_t id = 0;
    if (world.strict) id = note_pending(describe());
    s_->exec.post([st, this_s = s_.get(), world = g().world, id, call = resolve(o),
                   f = std::move(f)]() mutable {
      try {
        // a world that failed (a rank threw, or the strict world declared a deadlock) starts
        // nothing more: its rank may already be unwinding and freeing this operation's buffers
        // (only a strict world declares deadlocks: a lenient one's tasks take no lock here)
        if (world->strict || world->aborted.load()) {
          std::lock_guard lock(world->mu);
          if (!world->deadlock.empty()) throw CommDeadlock(world->deadlock);
          check<CommError>(!world->aborted.load(), "fourway: a queued operation of ",
                           this_s->group->header(), " was not started: world rank ",
                           world->failed_rank, " failed: ", world->failure);
        }
        this_s->call = call;
        f();
        st->finish(nullptr);
      } catch (...) {
        st->finish(std::current_exception());
      }
      if (world->strict) {
        std::lock_guard lock(world->mu);
        drop_pending(*this_s, id);
      }
    });
  }

  /// Lists an operation among this rank's pending ones (the strict world); returns its id.
  std::uint64_t note_pending(std::string text) {
    std::lock_guard lock(g().world->mu);
    const auto id = ++s_->pending->next_id;
    s_->pending->ops.emplace_back(id, std::move(text));
    return id;
  }
  static void drop_pending(detail::LocalRankState& s, std::uint64_t id) {
    if (!s.pending) return;
    std::erase_if(s.pending->ops, [&](const auto& op) { return op.first == id; });
  }
  /// A blocking call running on the rank's thread, listed while it runs (the strict world).
  struct Pending {
    template <class D>
    Pending(LocalComm& c, D& describe) : c_(c) {
      if (c.g().world->strict) id_ = c.note_pending(describe());
    }
    ~Pending() {
      if (id_ == 0) return;
      std::lock_guard lock(c_.g().world->mu);
      drop_pending(*c_.s_, id_);
    }
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;

   private:
    LocalComm& c_;
    std::uint64_t id_ = 0;
  };

  std::vector<Posted> posted_;  // the sends of the group now running on the worker

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
    // Chunk c reduces elements [c·k, (c+1)·k) of every send buffer into every recv buffer.
    // Counted as it runs: element i was read from n - 1 other ranks' send buffers and written
    // into n - 1 other ranks' recv buffers; the bytes go to the owner of i's balanced slice
    // (what a ring would have that rank send and receive), whichever thread ran the chunk.
    const bool streaming = detail::streams_result(count * n, sizeof(T));
    const auto& slots = group.slots[me.seq % 2];
    share_chunks(me, pieces_of<T>(count), [&](std::int64_t c) {
      const auto [lo, hi] = piece<T>(count, c);
      detail::reduce_range<T>(src.data(), n, dst.data(), n, lo, hi, op, streaming);
      for (int r = 0; r < n; ++r) {
        const auto [slo, shi] = detail::balanced_slice(count, n, r);
        const std::int64_t len = std::min(hi, shi) - std::max(lo, slo);
        if (len <= 0) continue;
        const std::int64_t bytes = len * static_cast<std::int64_t>(sizeof(T)) * (n - 1);
        slots[static_cast<std::size_t>(r)].credit(CommOp::all_reduce, bytes, bytes);
      }
    });
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
    const auto& slots = group.slots[me.seq % 2];
    // Chunk c reduces piece c % pieces of block b = c / pieces of every send buffer into rank
    // b's recv buffer.
    const std::int64_t pieces = pieces_of<T>(count);
    const bool streaming = detail::streams_result(count, sizeof(T));
    share_chunks(me, pieces * n, [&](std::int64_t c) {
      const auto b = static_cast<int>(c / pieces);
      const auto [lo, hi] = piece<T>(count, c % pieces);
      detail::RankPointers<const T*> src(n);
      for (int q = 0; q < n; ++q) {
        src[q] = static_cast<const T*>(slots[static_cast<std::size_t>(q)].send) +
                 static_cast<std::int64_t>(b) * count;
      }
      T* out = static_cast<T*>(slots[static_cast<std::size_t>(b)].recv);
      detail::reduce_range<T>(src.data(), n, &out, 1, lo, hi, op, streaming);
      // counted as it runs, to the block's owner: read from the n - 1 other send buffers
      slots[static_cast<std::size_t>(b)].credit(
          CommOp::reduce_scatter, (hi - lo) * static_cast<std::int64_t>(sizeof(T)) * (n - 1), 0);
    });
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
    const int n = group.size;
    const auto& slots = group.slots[me.seq % 2];
    // Chunk c copies piece c % pieces of rank q's send buffer into block q of rank d's recv
    // buffer, (d, q) = (c / pieces / n, c / pieces % n).
    const std::int64_t pieces = pieces_of<T>(count);
    share_chunks(me, pieces * n * n, [&](std::int64_t c) {
      const std::int64_t block = c / pieces;
      const auto d = static_cast<std::size_t>(block / n);
      const auto q = static_cast<std::size_t>(block % n);
      const auto [lo, hi] = piece<T>(count, c % pieces);
      const T* src = static_cast<const T*>(slots[q].send) + lo;
      T* dst = static_cast<T*>(slots[d].recv) + static_cast<std::int64_t>(q) * count + lo;
      if (src != dst) std::memcpy(dst, src, static_cast<std::size_t>(hi - lo) * sizeof(T));
      // counted as it runs, to the receiving rank: a block copied from another rank's buffer
      if (d != q) {
        slots[d].credit(CommOp::all_gather, (hi - lo) * static_cast<std::int64_t>(sizeof(T)), 0);
      }
    });
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

  /// Elements of one shared chunk (comm/local/rendezvous.hpp `share_chunks`): 64 KiB, small
  /// enough that a poll between layers (`Work::test`) costs little, large enough that claiming
  /// (one atomic add) is noise.
  template <class T>
  static constexpr std::int64_t chunk_elements = std::int64_t{65536} /
                                                 static_cast<std::int64_t>(sizeof(T));
  /// Chunks of at most chunk_elements<T> that cover `count` elements.
  template <class T>
  static std::int64_t pieces_of(std::int64_t count) {
    return (count + chunk_elements<T> - 1) / chunk_elements<T>;
  }
  /// Elements [lo, hi) of piece `p` of `count` elements.
  template <class T>
  static std::pair<std::int64_t, std::int64_t> piece(std::int64_t count, std::int64_t p) {
    const std::int64_t lo = p * chunk_elements<T>;
    return {lo, std::min(count, lo + chunk_elements<T>)};
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
};

static_assert(call_options_communicator<LocalComm>);

template <class Fn>
void LocalWorld::launch(int n, Fn&& fn, CommOptions options) {
  check<ConfigError>(n >= 1, "fourway: LocalWorld::launch needs at least 1 rank, got ", n);
  check<ConfigError>(options.deadline.count() > 0,
                     "fourway: CommOptions::deadline must be "
                     "positive, got ",
                     options.deadline.count(), " ms");
  auto world = std::make_shared<detail::LocalWorldState>(n, options.strict);
  std::vector<int> ranks(static_cast<std::size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto group = std::make_shared<detail::LocalGroup>(world, "world", std::move(ranks), options);
  std::mutex first_mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](std::exception_ptr e) {
        {
          std::lock_guard lock(first_mu);
          if (!first) first = e;
        }
        world->abort(r, detail::exception_message(e));
      };
      try {
        // the world is aborted before `w` dies: the rank's queued operations then fail fast
        // when its communicator joins them, instead of waiting for peers that gave up
        World<LocalWorld> w(LocalComm(group, r));
        try {
          fn(w);
        } catch (...) {
          fail(std::current_exception());
        }
      } catch (...) {
        fail(std::current_exception());
      }
      world->mark_exited(r);
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway
