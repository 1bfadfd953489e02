//! `Strict<C>`: any communicator held to NCCL's contract, for processes that cannot share memory
//! (MPI): the decorator form of the strict world (docs/comm.md, "The strict world"), which
//! LocalWorld runs natively (`CommOptions::strict`). Over `MpiComm` it makes a CPU test fail
//! where NCCL would refuse or hang:
//!
//!   buffers      every buffer must lie in a live tensor block of the rank's accountant
//!                (`bind_memory`; World binds it), the CommError NcclComm gives for host memory
//!   stream       a communicator runs its operations in issue order: one starts only when the
//!                one before it on the same communicator has finished
//!   rendezvous   a send completes only when its recv is posted: the receiver's recv sends a
//!                small token (its tag, count and type) the sender waits for before it sends
//!                the data; inside a group (`group_start` / `group_end`) sends and recvs are
//!                posted together, so two ranks may exchange without waiting for each other
//!   order        messages between two ranks are matched in posting order, whatever their tags,
//!                as NCCL matches them: a recv whose token names another tag, count or type than
//!                the send it meets is a CommMismatch on the sender
//!   waits        a wait that cannot complete ends at the deadline in CommTimeout listing this
//!                rank's pending operations on every strict communicator it holds (each rank
//!                reports its own: the ranks share no memory to find a deadlock sooner)
//!
//! One rank's strict communicators (a group and everything split from it) share one queue
//! keeper: waiting on any of them moves all of them, as NCCL moves every communicator on its
//! own. The inner communicator's point-to-point carries tags 0 (data) and 1 (tokens) only; its
//! collectives are used as they are. All progress happens on the caller's thread (MPI's
//! MPI_THREAD_FUNNELED suffices).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fourway/comm/buffer_kind.hpp"
#include "fourway/comm/call_desc.hpp"
#include "fourway/comm/concept.hpp"
#include "fourway/comm/types.hpp"
#include "fourway/comm/work.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"

namespace fourway {

namespace detail {

/// One queued operation of a strict communicator: `step()` moves it on and says whether it has
/// finished (it throws the operation's failure).
struct StrictOp {
  std::string what;
  std::function<bool()> step;
  bool done = false;
  std::exception_ptr error;
  std::chrono::steady_clock::time_point posted;
  std::chrono::milliseconds deadline{0};
};

/// The operations of one strict communicator, in issue order (a stream).
struct StrictQueue {
  std::string name;
  std::deque<std::shared_ptr<StrictOp>> ops;
  /// Moves the head on while it finishes; later operations wait for it.
  void progress() {
    while (!ops.empty()) {
      auto& op = *ops.front();
      if (!op.done) {
        try {
          op.done = op.step();
        } catch (...) {
          op.error = std::current_exception();
          op.done = true;
        }
      }
      if (!op.done) return;
      ops.pop_front();
    }
  }
};

/// Every strict communicator of one rank, progressed together.
struct StrictRank {
  std::vector<std::weak_ptr<StrictQueue>> queues;
  void progress() {
    std::erase_if(queues, [](const auto& q) { return q.expired(); });
    for (auto& w : queues)
      if (auto q = w.lock()) q->progress();
  }
  /// This rank's pending operations, communicator by communicator.
  std::string pending() {
    std::ostringstream os;
    for (auto& w : queues) {
      auto q = w.lock();
      if (!q || q->ops.empty()) continue;
      os << "\n  in " << q->name << ": ";
      for (std::size_t i = 0; i < q->ops.size(); ++i) os << (i ? "; then " : "") << q->ops[i]->what;
    }
    const std::string s = os.str();
    return s.empty() ? std::string(" none") : s;
  }
};

/// The Work of a strict operation: waiting moves every strict communicator of the rank.
class StrictWork final : public Work::State {
 public:
  StrictWork(std::shared_ptr<StrictRank> rank, std::shared_ptr<StrictOp> op)
      : rank_(std::move(rank)), op_(std::move(op)) {}
  void wait() override {
    int polls = 0;
    for (;;) {
      rank_->progress();
      if (op_->done) break;
      const auto now = std::chrono::steady_clock::now();
      if (now - op_->posted >= op_->deadline) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - op_->posted).count();
        throw CommTimeout(detail::cat(
            "fourway: CommTimeout (strict: held to NCCL's contract, docs/comm.md): ", op_->what,
            ": waited ", waited, " ms (deadline ", op_->deadline.count(),
            " ms). This rank's pending operations:", rank_->pending(),
            "\nEach rank prints its own. A send completes only when its recv is posted: post the "
            "sends and recvs that must pass each other as one group (group_start() ... "
            "group_end()); every rank must call the collectives of all its groups in one order. "
            "If the peers are only slow, raise the deadline (--comm-timeout)"));
      }
      if (++polls > 200) {
        std::this_thread::sleep_for(std::chrono::microseconds(polls > 2000 ? 500 : 20));
      }
    }
    if (!op_->error) return;
    try {
      std::rethrow_exception(op_->error);
    } catch (const CommTimeout& e) {  // the transport's own deadline: say what was pending
      throw CommTimeout(
          detail::cat(e.what(), ". This rank's pending strict operations:", rank_->pending()));
    }
  }
  bool test() override {
    rank_->progress();
    return op_->done;
  }

 private:
  std::shared_ptr<StrictRank> rank_;
  std::shared_ptr<StrictOp> op_;
};

/// A rendezvous token: what a recv expects (tag, count, type), sent to its sender.
using StrictToken = std::array<std::int64_t, 3>;

/// The decorated communicator with the tokens its failed operations abandoned in flight. A
/// token whose transfer had not finished when its operation was dropped (a group that failed)
/// is kept here; `comm` is destroyed first, which finishes or fails its pending transfers, so
/// no transfer touches a freed token.
template <class C>
struct StrictInner {
  explicit StrictInner(C c) : comm(std::move(c)) {}
  std::vector<std::shared_ptr<StrictToken>> abandoned;
  C comm;  // last: destroyed first
};

/// A token and the transfer that reads or writes it, shared by one Part's moves; when the last
/// of them is dropped before the transfer finished, the token goes to the communicator's
/// abandoned list instead of being freed.
template <class C>
struct StrictTokenHold {
  StrictTokenHold(std::shared_ptr<StrictInner<C>> i, StrictToken t)
      : token(std::make_shared<StrictToken>(t)), inner(std::move(i)) {}
  StrictTokenHold(const StrictTokenHold&) = delete;
  StrictTokenHold& operator=(const StrictTokenHold&) = delete;
  ~StrictTokenHold() {
    bool finished = true;
    try {
      finished = transfer.test();
    } catch (...) {  // a failed transfer touches nothing more
    }
    if (!finished) inner->abandoned.push_back(token);
  }
  std::shared_ptr<StrictToken> token;
  Work transfer;
  std::shared_ptr<StrictInner<C>> inner;
};

}  // namespace detail

template <call_options_communicator C>
class Strict {
 public:
  using inner_type = C;

  explicit Strict(C inner)
      : Strict(std::move(inner), std::make_shared<detail::StrictRank>(), nullptr) {}

  [[nodiscard]] int rank() const { return inner_->rank(); }
  [[nodiscard]] int size() const { return inner_->size(); }
  [[nodiscard]] std::string_view name() const { return inner_->name(); }
  [[nodiscard]] const CommOptions& options() const { return inner_->options(); }
  [[nodiscard]] C& inner() { return *inner_; }
  /// The rank's accountant: buffers must lie in its live tensor blocks.
  void bind_memory(MemoryAccountant& memory) {
    memory_ = &memory;
    memory.track_blocks(true);
  }

  // ---- blocking forms ----------------------------------------------------------------------
  template <comm_element T>
  void all_reduce(const T* s, T* r, std::int64_t n, ReduceOp op, CallOptions o = {}) {
    all_reduce_async(s, r, n, op, o).wait();
  }
  template <comm_element T>
  void reduce_scatter(const T* s, T* r, std::int64_t n, ReduceOp op, CallOptions o = {}) {
    reduce_scatter_async(s, r, n, op, o).wait();
  }
  template <comm_element T>
  void all_gather(const T* s, T* r, std::int64_t n, CallOptions o = {}) {
    all_gather_async(s, r, n, o).wait();
  }
  template <comm_element T>
  void broadcast(T* b, std::int64_t n, int root, CallOptions o = {}) {
    broadcast_async(b, n, root, o).wait();
  }
  template <comm_element T>
  void send(const T* b, std::int64_t n, int peer, int tag, CallOptions o = {}) {
    outside_group("send");
    send_async(b, n, peer, tag, o).wait();
  }
  template <comm_element T>
  void recv(T* b, std::int64_t n, int peer, int tag, CallOptions o = {}) {
    outside_group("recv");
    recv_async(b, n, peer, tag, o).wait();
  }
  void barrier(CallOptions o = {}) {
    outside_group("barrier");
    barrier_async(o).wait();
  }
  /// A strict communicator over the inner split; it shares this rank's queue keeper and
  /// accountant. Runs in this communicator's order, like any operation.
  template <class... Extra>
  Strict split(int color, int key, Extra&&... extra) {
    outside_group("split");
    drain();
    return Strict(inner_->split(color, key, std::forward<Extra>(extra)...), rank_, memory_);
  }

  // ---- async forms -------------------------------------------------------------------------
  template <comm_element T>
  Work all_reduce_async(const T* s, T* r, std::int64_t n, ReduceOp op, CallOptions o = {}) {
    buffer(s, n, "send", CommOp::all_reduce);
    buffer(r, n, "recv", CommOp::all_reduce);
    return collective(describe<T>(CommOp::all_reduce, n, op), o, [=, c = inner_, t = transport(o)] {
      return c->all_reduce_async(s, r, n, op, t);
    });
  }
  template <comm_element T>
  Work reduce_scatter_async(const T* s, T* r, std::int64_t n, ReduceOp op, CallOptions o = {}) {
    buffer(s, n * size(), "send", CommOp::reduce_scatter);
    buffer(r, n, "recv", CommOp::reduce_scatter);
    return collective(
        describe<T>(CommOp::reduce_scatter, n, op), o,
        [=, c = inner_, t = transport(o)] { return c->reduce_scatter_async(s, r, n, op, t); });
  }
  template <comm_element T>
  Work all_gather_async(const T* s, T* r, std::int64_t n, CallOptions o = {}) {
    buffer(s, n, "send", CommOp::all_gather);
    buffer(r, n * size(), "recv", CommOp::all_gather);
    return collective(describe<T>(CommOp::all_gather, n), o, [=, c = inner_, t = transport(o)] {
      return c->all_gather_async(s, r, n, t);
    });
  }
  template <comm_element T>
  Work broadcast_async(T* b, std::int64_t n, int root, CallOptions o = {}) {
    buffer(b, n, "buffer", CommOp::broadcast);
    return collective(
        describe<T>(CommOp::broadcast, n, ReduceOp::sum, root), o,
        [=, c = inner_, t = transport(o)] { return c->broadcast_async(b, n, root, t); });
  }
  /// A rendezvous send (or, inside a group, posted with the group at group_end).
  template <comm_element T>
  Work send_async(const T* b, std::int64_t n, int peer, int tag, CallOptions o = {}) {
    buffer(b, n, "send", CommOp::send);
    auto part = send_part(b, n, peer, tag, o);
    return group_depth_ > 0 ? join_group(std::move(part)) : post(std::move(part), o);
  }
  template <comm_element T>
  Work recv_async(T* b, std::int64_t n, int peer, int tag, CallOptions o = {}) {
    buffer(b, n, "recv", CommOp::recv);
    auto part = recv_part(b, n, peer, tag, o);
    return group_depth_ > 0 ? join_group(std::move(part)) : post(std::move(part), o);
  }
  Work barrier_async(CallOptions o = {}) {
    outside_group("barrier");
    return collective("barrier", o, [t = transport(o), c = inner_] { return c->barrier_async(t); });
  }

  // ---- groups (NCCL's ncclGroupStart / ncclGroupEnd) ---------------------------------------
  /// The sends and recvs up to the matching group_end are posted together, as one operation in
  /// this communicator's order; their Works complete together. Nothing else may be called.
  void group_start() {
    if (group_depth_++ == 0) group_.clear();
  }
  void group_end(CallOptions o = {}) {
    check<ConfigError>(group_depth_ > 0, "fourway: group_end() in group '", name(),
                       "' without a group_start()");
    if (--group_depth_ > 0) return;
    auto parts = std::move(group_);
    group_.clear();
    if (parts.empty() || !group_work_) return;
    std::string what = "group of";
    for (std::size_t i = 0; i < parts.size(); ++i) what += (i ? ", " : " ") + parts[i].what;
    auto op = make_op(what, o, run_parts(std::move(parts)));
    *group_work_ = Work(std::make_shared<detail::StrictWork>(rank_, op));
    group_work_.reset();
  }

 private:
  /// One send or recv of an operation (alone, or one of a group's), in three moves:
  /// `token` posts its half of the rendezvous (a send receives the token, a recv sends it);
  /// `data` posts the data once it may (a send: after its token came, false until then);
  /// `finished` says whether every message of it completed (and throws their failures).
  struct Part {
    std::string what;
    bool sends = false;
    std::function<void()> token;
    std::function<bool()> data;
    std::function<bool()> finished;
  };

  /// The step of an operation made of `parts`, in the order an in-order transport needs (one
  /// whose operations run one after another, as LocalComm's do): every token out and in first,
  /// then the data sends as their tokens come, then the data recvs, so no posted recv waits in
  /// front of a send its peer waits for.
  static std::function<bool()> run_parts(std::vector<Part> parts) {
    auto state = std::make_shared<std::vector<Part>>(std::move(parts));
    auto phase = std::make_shared<int>(0);
    auto posted = std::make_shared<std::vector<char>>(state->size(), 0);
    return [state, phase, posted]() {
      auto& ps = *state;
      if (*phase == 0) {
        for (auto& p : ps)
          if (!p.sends) p.token();
        for (auto& p : ps)
          if (p.sends) p.token();
        *phase = 1;
      }
      if (*phase == 1) {
        bool all = true;
        for (std::size_t i = 0; i < ps.size(); ++i) {
          if (!ps[i].sends || (*posted)[i]) continue;
          (*posted)[i] = ps[i].data() ? 1 : 0;
          all = all && (*posted)[i];
        }
        if (!all) return false;
        for (auto& p : ps)
          if (!p.sends) (void)p.data();
        *phase = 2;
      }
      bool done = true;
      for (auto& p : ps) done = p.finished() && done;
      return done;
    };
  }

  Strict(C inner, std::shared_ptr<detail::StrictRank> rank, MemoryAccountant* memory)
      : box_(std::make_shared<detail::StrictInner<C>>(std::move(inner))),
        inner_(box_, &box_->comm),
        rank_(std::move(rank)),
        queue_(std::make_shared<detail::StrictQueue>()),
        memory_(memory) {
    queue_->name = detail::cat("group '", inner_->name(), "' (", inner_->size(), " ranks)");
    rank_->queues.push_back(queue_);
  }

  /// A call's options for the transport: its stream, but the group's own deadline (the strict
  /// wait keeps the call's and names what was pending when it passes).
  static CallOptions transport(CallOptions o) {
    o.timeout = std::chrono::milliseconds(0);
    return o;
  }

  static constexpr int data_tag = 0;
  static constexpr int token_tag = 1;

  template <class T>
  static std::string describe(CommOp op, std::int64_t n, ReduceOp r = ReduceOp::sum, int root = 0) {
    return detail::describe_call({op, dtype_v<T>, n, r, root, false});
  }

  void outside_group(std::string_view what) const {
    check<ConfigError>(group_depth_ == 0, "fourway: ", what, " in group '", name(),
                       "' inside a group (group_start() without group_end()): a group holds "
                       "send_async and recv_async only; end the group first");
  }

  /// NCCL's buffer rule, held on the host by the accountant (see the file comment).
  template <class T>
  void buffer(const T* p, std::int64_t n, std::string_view role, CommOp op) const {
    if (p == nullptr && n == 0) return;
    check<ConfigError>(memory_ != nullptr, "fourway: Strict<", "C> checks every buffer against ",
                       "the rank's accountant and group '", name(), "' has none bound; start the ",
                       "ranks with fw::launch (World binds it) or call bind_memory(accountant)");
    if (memory_->owns(p, static_cast<std::size_t>(n) * sizeof(T))) return;
    require_nccl_buffer(BufferKind::host, n, role,
                        detail::cat(comm_op_name(op), " in group '", name(), "' on rank ", rank(),
                                    " (strict: only tensor memory the backend allocated stands for "
                                    "device memory)"));
  }

  std::shared_ptr<detail::StrictOp> make_op(std::string what, const CallOptions& o,
                                            std::function<bool()> step) {
    auto op = std::make_shared<detail::StrictOp>();
    op->what = std::move(what);
    op->step = std::move(step);
    op->posted = std::chrono::steady_clock::now();
    op->deadline = detail::call_deadline(inner_->options(), o);
    // the transport keeps its own (the group's) deadline: this one is the strict wait's, which
    // names what was pending
    queue_->ops.push_back(op);
    rank_->progress();  // it may start at once
    return op;
  }

  template <class Start>
  Work collective(std::string what, const CallOptions& o, Start start) {
    outside_group(what);
    auto work = std::make_shared<Work>();
    auto started = std::make_shared<bool>(false);
    auto op = make_op(std::move(what), o, [work, started, start]() mutable {
      if (!*started) {
        *work = start();
        *started = true;
      }
      if (!work->test()) return false;
      work->wait();  // rethrows its failure
      return true;
    });
    return Work(std::make_shared<detail::StrictWork>(rank_, op));
  }

  Work post(Part part, const CallOptions& o) {
    std::string what = part.what;
    std::vector<Part> one;
    one.push_back(std::move(part));
    auto op = make_op(std::move(what), o, run_parts(std::move(one)));
    return Work(std::make_shared<detail::StrictWork>(rank_, op));
  }

  /// A part of the open group; its Work is the group's, set at group_end.
  Work join_group(Part part) {
    group_.push_back(std::move(part));
    if (!group_work_) group_work_ = std::make_shared<Work>();
    return Work(std::make_shared<GroupMember>(group_work_));
  }
  /// A member's view of its group's Work (which exists once group_end ran).
  class GroupMember final : public Work::State {
   public:
    explicit GroupMember(std::shared_ptr<Work> w) : w_(std::move(w)) {}
    void wait() override { w_->wait(); }
    bool test() override { return w_->test(); }

   private:
    std::shared_ptr<Work> w_;
  };

  /// A send: wait for the receiver's token (its recv is posted), check it, send the data.
  template <class T>
  Part send_part(const T* b, std::int64_t n, int peer, int tag, const CallOptions& o) {
    std::string what = detail::cat("send (", dtype_name(dtype_v<T>), ", count ", n, ") to rank ",
                                   peer, " with tag ", tag);
    const std::string where = detail::cat("group '", name(), "' on rank ", rank());
    auto hold = std::make_shared<detail::StrictTokenHold<C>>(box_, detail::StrictToken{});
    auto out = std::make_shared<Work>();
    auto c = inner_;
    const CallOptions t = transport(o);
    Part p;
    p.what = what;
    p.sends = true;
    p.token = [=] { hold->transfer = c->recv_async(hold->token->data(), 3, peer, token_tag, t); };
    p.data = [=]() {
      if (!hold->transfer.test()) return false;
      hold->transfer.wait();
      const detail::StrictToken& got = *hold->token;
      const detail::StrictToken want{tag, n, static_cast<std::int64_t>(dtype_v<T>)};
      check<CommMismatch>(got == want, "fourway: CommMismatch in ", where, ": ", what,
                          " met a recv expecting tag ", got[0], ", count ", got[1], ", ",
                          dtype_name(static_cast<Dtype>(got[2])),
                          "; NCCL matches point-to-point by posting order, not tag: post the "
                          "sends and recvs between two ranks in the same order on both");
      *out = c->send_async(b, n, peer, data_tag, t);
      return true;
    };
    p.finished = [=]() {
      if (!out->test()) return false;
      out->wait();
      return true;
    };
    return p;
  }

  /// A recv: tell the sender it is posted (the token), then take the data.
  template <class T>
  Part recv_part(T* b, std::int64_t n, int peer, int tag, const CallOptions& o) {
    auto hold = std::make_shared<detail::StrictTokenHold<C>>(
        box_, detail::StrictToken{tag, n, static_cast<std::int64_t>(dtype_v<T>)});
    auto in = std::make_shared<Work>();
    auto c = inner_;
    const CallOptions t = transport(o);
    Part p;
    p.what = detail::cat("recv (", dtype_name(dtype_v<T>), ", count ", n, ") from rank ", peer,
                         " with tag ", tag);
    p.token = [=] { hold->transfer = c->send_async(hold->token->data(), 3, peer, token_tag, t); };
    p.data = [=]() {
      *in = c->recv_async(b, n, peer, data_tag, t);
      return true;
    };
    p.finished = [=]() {
      if (!hold->transfer.test() || !in->test()) return false;
      hold->transfer.wait();
      in->wait();
      return true;
    };
    return p;
  }

  /// Waits until every queued operation of this communicator finished.
  void drain() {
    if (queue_->ops.empty()) return;
    Work(std::make_shared<detail::StrictWork>(rank_, queue_->ops.back())).wait();
  }

  std::shared_ptr<detail::StrictInner<C>> box_;
  std::shared_ptr<C> inner_;  // box_'s comm, shared with queued operations: a Strict may move
  std::shared_ptr<detail::StrictRank> rank_;
  std::shared_ptr<detail::StrictQueue> queue_;
  MemoryAccountant* memory_ = nullptr;
  int group_depth_ = 0;
  std::vector<Part> group_;
  std::shared_ptr<Work> group_work_;
};

}  // namespace fourway
