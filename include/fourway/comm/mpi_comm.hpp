//! MpiComm: the communicator over MPI (Open MPI; processes started by mpirun or srun), and
//! MpiWorld, its world kind for `fw::launch<fw::MpiWorld>(n, fn)`.
//!
//! Every operation is issued as a non-blocking MPI call (MPI_Iallreduce, MPI_Ireduce_scatter_block,
//! MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv, MPI_Ibarrier) and completed by polling MPI_Test
//! against the deadline, which counts from the call; the blocking form is the async form plus
//! wait(). So no wait can hang: a late peer turns into CommTimeout naming group, op, sequence
//! number and -- where MPI lets us know -- the missing ranks. For that each communicator keeps a
//! one-sided window in which every rank publishes the sequence number and op of the last
//! collective it entered; a rank that times out reads its peers' entries (MPI_Rget, itself with a
//! short deadline) and names those behind it. If the window cannot be created or read (no
//! one-sided transport), the message says the missing ranks are unknown.
//!
//! A request that timed out stays pending inside MPI (MPI cannot cancel a collective): the
//! communicator keeps it, with its buffers, and completes it if the late rank arrives; until
//! then the user's recv buffer of that call may still be written. After a timeout the usual
//! course is to abort the job, as PyTorch's watchdog does.
//!
//! 16-bit floats are reduced in fp32: converted into an fp32 buffer, reduced by MPI with
//! MPI_FLOAT, converted back. `avg` is MPI_SUM divided by the size (truncating for integers).
//! With `CommOptions::debug`, every collective first all-gathers a descriptor (op, dtype, count,
//! reduce op, root) and throws the same CommMismatch on all ranks when they differ.
//!
// fourway-requires: mpi
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: the deprecated C++ bindings warn under -Wextra
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/comm/communicator.hpp"

namespace fourway {

class MpiComm;

/// The world kind "one process per rank under mpirun": `fw::launch<fw::MpiWorld>(n, fn)`.
struct MpiWorld {
  using comm_type = MpiComm;
  /// Initialises MPI if needed (finalised at exit), checks `n` against the number of processes
  /// (0 = all), runs `fn` on this process's rank. A rank whose `fn` throws prints the error and
  /// calls MPI_Abort, so the other processes end at once instead of hanging.
  template <class Fn>
  static void launch(int n, Fn&& fn, CommOptions options = {});
};

namespace detail {

/// Initialises MPI once per process (MPI_THREAD_FUNNELED) and finalises it at exit.
inline void mpi_init_once() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  static struct Finalizer {
    ~Finalizer() {
      int fin = 0;
      MPI_Finalized(&fin);
      if (!fin) MPI_Finalize();
    }
  } finalizer;
}

/// Runs `fn(world)`; if it throws, prints the error with the rank and calls MPI_Abort, so the
/// other processes end at once instead of waiting for this one. `world` outlives the catch.
template <class W, class Fn>
void run_or_abort(W& world, Fn& fn) {
  std::string failure;
  try {
    fn(world);
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "an exception not derived from std::exception";
  }
  if (!failure.empty()) {
    std::fprintf(stderr, "fourway: rank %d of %d failed: %s; aborting the job\n", world.rank(),
                 world.size(), failure.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<std::size_t>(len));
}

inline void mpi_check(int code, const std::string& what) {
  if (code != MPI_SUCCESS) {
    throw CommError(cat("fourway: ", what, " failed: ", mpi_error_string(code)));
  }
}

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) return MPI_UINT16_T;
  return MPI_BYTE;
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

/// What a communicator's operations share: the MPI communicator, its name and options, the
/// progress window, and the requests abandoned after a timeout.
struct MpiShared {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string name;
  CommOptions options;
  int rank = 0;
  int size = 1;
  MPI_Win win = MPI_WIN_NULL;
  std::uint64_t* progress = nullptr;  // [seq, op] of the last collective this rank entered
  struct Abandoned {
    MPI_Request req;
    std::shared_ptr<void> keep;
  };
  std::vector<Abandoned> abandoned;

  [[nodiscard]] std::string header() const { return cat("group '", name, "' (", size, " ranks)"); }

  void publish(std::uint64_t seq, CommOp op) {
    if (win == MPI_WIN_NULL) return;
    progress[0] = seq;
    progress[1] = static_cast<std::uint64_t>(op);
    MPI_Win_sync(win);
  }

  /// Peers behind `seq`, read from the progress window within 1 s; empty string if unknowable.
  std::string behind(std::uint64_t seq) {
    if (win == MPI_WIN_NULL) return {};
    std::vector<std::uint64_t> peer(2 * static_cast<std::size_t>(size), 0);
    std::vector<MPI_Request> reqs;
    for (int q = 0; q < size; ++q) {
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Rget(peer.data() + 2 * q, 2, MPI_UINT64_T, q, 0, 2, MPI_UINT64_T, win, &r) !=
          MPI_SUCCESS) {
        return {};
      }
      reqs.push_back(r);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    int all = 0;
    while (!all) {
      if (MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &all, MPI_STATUSES_IGNORE) !=
          MPI_SUCCESS) {
        return {};
      }
      if (!all && std::chrono::steady_clock::now() > until) return {};
      if (!all) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    std::ostringstream os;
    bool first = true;
    for (int q = 0; q < size; ++q) {
      const auto s = peer[2 * static_cast<std::size_t>(q)];
      if (s >= seq) continue;
      os << (first ? "" : ", ") << "rank " << q;
      if (s == 0) {
        os << " [entered no collective yet]";
      } else {
        os << " [last entered #" << s << " "
           << comm_op_name(static_cast<CommOp>(peer[2 * static_cast<std::size_t>(q) + 1])) << "]";
      }
      first = false;
    }
    return os.str();
  }

  void reap() {
    std::erase_if(abandoned, [](Abandoned& a) {
      int done = 0;
      MPI_Test(&a.req, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
  }
};

/// A pending MPI request polled against a deadline; `finish` runs once on success.
class MpiWork final : public Work::State {
 public:
  MpiWork(std::shared_ptr<MpiShared> shared, MPI_Request req, std::string what, std::uint64_t seq,
          std::function<void(const MPI_Status&)> finish, std::shared_ptr<void> keep,
          std::chrono::milliseconds deadline)
      : shared_(std::move(shared)),
        req_(req),
        what_(std::move(what)),
        seq_(seq),
        finish_(std::move(finish)),
        keep_(std::move(keep)),
        deadline_(deadline),
        start_(std::chrono::steady_clock::now()) {}

  void wait() override {
    if (error_) std::rethrow_exception(error_);
    int polls = 0;
    while (!done_) {
      if (poll()) break;
      if (error_) std::rethrow_exception(error_);
      if (std::chrono::steady_clock::now() - start_ >= deadline_) {
        time_out();
        std::rethrow_exception(error_);
      }
      // Tight polling first (latency), then sleep so oversubscribed ranks leave the cores free.
      if (++polls > 200) {
        std::this_thread::sleep_for(std::chrono::microseconds(polls > 2000 ? 500 : 20));
      }
    }
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    if (done_ || error_) return true;
    return poll() || error_ != nullptr;
  }

 private:
  bool poll() {
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&req_, &flag, &status);
    if (rc != MPI_SUCCESS) {
      const bool truncate = rc == MPI_ERR_TRUNCATE ||
                            (rc == MPI_ERR_IN_STATUS && status.MPI_ERROR == MPI_ERR_TRUNCATE);
      if (truncate) {
        error_ =
            std::make_exception_ptr(CommMismatch(cat("fourway: CommMismatch in ", what_,
                                                     ": the matching send carries more elements "
                                                     "than this recv expects (",
                                                     mpi_error_string(rc), ")")));
      } else {
        error_ = std::make_exception_ptr(
            CommError(cat("fourway: ", what_, " failed: ", mpi_error_string(rc))));
      }
      done_ = true;
      return true;
    }
    if (!flag) return false;
    done_ = true;
    try {
      if (finish_) finish_(status);
    } catch (...) {
      error_ = std::current_exception();
    }
    return true;
  }

  void time_out() {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start_)
                            .count();
    std::string missing = seq_ > 0 ? shared_->behind(seq_) : std::string{};
    if (missing.empty()) {
      missing =
          "ranks unknown (MPI does not report which ranks have not arrived; each rank that "
          "did prints this message)";
    }
    error_ = std::make_exception_ptr(CommTimeout(
        cat("fourway: CommTimeout: ", what_, ": waited ", waited, " ms (deadline ",
            deadline_.count(), " ms) for ", missing,
            ". If those ranks are only slow, raise CommOptions::deadline (or this call's "
            "CallOptions::timeout); otherwise find the rank that skipped, reordered or never "
            "reached this call")));
    shared_->abandoned.push_back({req_, keep_});
    done_ = true;
  }

  std::shared_ptr<MpiShared> shared_;
  MPI_Request req_;
  std::string what_;
  std::uint64_t seq_;  // 0 for point-to-point
  std::function<void(const MPI_Status&)> finish_;
  std::shared_ptr<void> keep_;
  std::chrono::milliseconds deadline_;  // the call's CallOptions::timeout, else the group's
  std::chrono::steady_clock::time_point start_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace detail

class MpiComm : public detail::BlockingForms<MpiComm> {
 public:
  /// Duplicates `comm` (MPI must be initialised: `detail::mpi_init_once()` or MPI_Init) and sets
  /// MPI_ERRORS_RETURN on the copy, so MPI errors become CommError instead of aborting.
  explicit MpiComm(MPI_Comm comm = MPI_COMM_WORLD, CommOptions options = {},
                   std::string name = "world") {
    MPI_Comm dup = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
    check<ConfigError>(!options.strict,
                       "fourway: MpiComm does not run the strict world itself; "
                       "wrap it (fw::Strict<fw::MpiComm>, comm/strict.hpp) or use LocalWorld "
                       "with CommOptions::strict");
    adopt(dup, options, std::move(name));
  }
  MpiComm(MpiComm&&) noexcept = default;
  MpiComm& operator=(MpiComm&&) noexcept = default;
  ~MpiComm() { release(); }

  [[nodiscard]] int rank() const { return s_->rank; }
  [[nodiscard]] int size() const { return s_->size; }
  [[nodiscard]] std::string_view name() const { return s_->name; }
  [[nodiscard]] const CommOptions& options() const { return s_->options; }
  [[nodiscard]] MPI_Comm native() const { return s_->comm; }
  [[nodiscard]] std::uint64_t sequence() const { return seq_; }

  void barrier(CallOptions o = {}) { barrier_async(o).wait(); }

  template <comm_element T>
  Work all_reduce_async(const T* send, T* recv, std::int64_t count, ReduceOp op,
                        CallOptions o = {}) {
    const auto deadline = call_deadline(o);
    const auto seq = enter<T>(CommOp::all_reduce, count, op, 0, deadline);
    const int n = s_->size;
    const int c = mpi_count(count, CommOp::all_reduce);
    if constexpr (is_half<T>) {
      auto buf = std::make_shared<std::vector<float>>(static_cast<std::size_t>(2 * count));
      for (std::int64_t i = 0; i < count; ++i)
        (*buf)[static_cast<std::size_t>(i)] = static_cast<float>(send[i]);
      MPI_Request req = MPI_REQUEST_NULL;
      detail::mpi_check(MPI_Iallreduce(buf->data(), buf->data() + count, c, MPI_FLOAT,
                                       detail::mpi_op(op), s_->comm, &req),
                        "MPI_Iallreduce");
      return work<T>(
          deadline, req, seq, CommOp::all_reduce, count, op,
          [=](const MPI_Status&) {
            const float div = op == ReduceOp::avg ? static_cast<float>(n) : 1.0f;
            for (std::int64_t i = 0; i < count; ++i)
              recv[i] = T((*buf)[static_cast<std::size_t>(count + i)] / div);
          },
          buf);
    } else {
      MPI_Request req = MPI_REQUEST_NULL;
      detail::mpi_check(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, c,
                                       detail::mpi_type<T>(), detail::mpi_op(op), s_->comm, &req),
                        "MPI_Iallreduce");
      return work<T>(deadline, req, seq, CommOp::all_reduce, count, op, [=](const MPI_Status&) {
        if (op == ReduceOp::avg) divide(recv, count, n);
      });
    }
  }

  template <comm_element T>
  Work reduce_scatter_async(const T* send, T* recv, std::int64_t count, ReduceOp op,
                            CallOptions o = {}) {
    const auto deadline = call_deadline(o);
    const auto seq = enter<T>(CommOp::reduce_scatter, count, op, 0, deadline);
    const int n = s_->size;
    const int c = mpi_count(count * n, CommOp::reduce_scatter);
    if constexpr (is_half<T>) {
      auto buf = std::make_shared<std::vector<float>>(static_cast<std::size_t>(count * n + count));
      for (std::int64_t i = 0; i < count * n; ++i)
        (*buf)[static_cast<std::size_t>(i)] = static_cast<float>(send[i]);
      MPI_Request req = MPI_REQUEST_NULL;
      detail::mpi_check(MPI_Ireduce_scatter_block(buf->data(), buf->data() + count * n, c / n,
                                                  MPI_FLOAT, detail::mpi_op(op), s_->comm, &req),
                        "MPI_Ireduce_scatter_block");
      return work<T>(
          deadline, req, seq, CommOp::reduce_scatter, count, op,
          [=](const MPI_Status&) {
            const float div = op == ReduceOp::avg ? static_cast<float>(n) : 1.0f;
            for (std::int64_t i = 0; i < count; ++i) {
              recv[i] = T((*buf)[static_cast<std::size_t>(count * n + i)] / div);
            }
          },
          buf);
    } else {
      // MPI forbids recv inside send; an aliasing recv (send + rank*count) goes through a copy.
      const bool alias = recv >= send && recv < send + count * n;
      std::shared_ptr<std::vector<T>> tmp;
      if (alias) tmp = std::make_shared<std::vector<T>>(static_cast<std::size_t>(count));
      T* out = alias ? tmp->data() : recv;
      MPI_Request req = MPI_REQUEST_NULL;
      detail::mpi_check(MPI_Ireduce_scatter_block(send, out, c / n, detail::mpi_type<T>(),
                                                  detail::mpi_op(op), s_->comm, &req),
                        "MPI_Ireduce_scatter_block");
      return work<T>(
          deadline, req, seq, CommOp::reduce_scatter, count, op,
          [=](const MPI_Status&) {
            if (alias && count > 0)
              std::memcpy(recv, out, static_cast<std::size_t>(count) * sizeof(T));
            if (op == ReduceOp::avg) divide(recv, count, n);
          },
          tmp);
    }
  }

  template <comm_element T>
  Work all_gather_async(const T* send, T* recv, std::int64_t count, CallOptions o = {}) {
    const auto deadline = call_deadline(o);
    const auto seq = enter<T>(CommOp::all_gather, count, ReduceOp::sum, 0, deadline);
    const int c = mpi_count(count * s_->size, CommOp::all_gather) / s_->size;
    const bool in_place = send == recv + static_cast<std::int64_t>(s_->rank) * count;
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, c, detail::mpi_type<T>(), recv,
                                     c, detail::mpi_type<T>(), s_->comm, &req),
                      "MPI_Iallgather");
    return work<T>(deadline, req, seq, CommOp::all_gather, count, ReduceOp::sum, {});
  }

  template <comm_element T>
  Work broadcast_async(T* buf, std::int64_t count, int root, CallOptions o = {}) {
    const auto deadline = call_deadline(o);
    check_rank(root, "root", CommOp::broadcast);
    const auto seq = enter<T>(CommOp::broadcast, count, ReduceOp::sum, root, deadline);
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Ibcast(buf, mpi_count(count, CommOp::broadcast), detail::mpi_type<T>(),
                                 root, s_->comm, &req),
                      "MPI_Ibcast");
    return work<T>(deadline, req, seq, CommOp::broadcast, count, ReduceOp::sum, {}, {}, root);
  }

  template <comm_element T>
  Work send_async(const T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    const auto deadline = call_deadline(o);
    check_p2p(peer, tag, CommOp::send);
    const int c = mpi_count(count, CommOp::send);
    const auto number = ++sends_;
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Isend(buf, c, detail::mpi_type<T>(), peer, tag, s_->comm, &req),
                      "MPI_Isend");
    return Work(std::make_shared<detail::MpiWork>(
        s_, req,
        detail::cat(s_->header(), ", send #", number, " (", dtype_name(dtype_v<T>), ", count ",
                    count, ") on rank ", s_->rank, " to rank ", peer, " with tag ", tag),
        0, nullptr, nullptr, deadline));
  }

  template <comm_element T>
  Work recv_async(T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    const auto deadline = call_deadline(o);
    check_p2p(peer, tag, CommOp::recv);
    const int c = mpi_count(count, CommOp::recv);
    const auto number = ++recvs_;
    std::string what =
        detail::cat(s_->header(), ", recv #", number, " (", dtype_name(dtype_v<T>), ", count ",
                    count, ") on rank ", s_->rank, " from rank ", peer, " with tag ", tag);
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Irecv(buf, c, detail::mpi_type<T>(), peer, tag, s_->comm, &req),
                      "MPI_Irecv");
    return Work(std::make_shared<detail::MpiWork>(
        s_, req, what, 0,
        [what, c](const MPI_Status& st) {
          int got = 0;
          MPI_Get_count(&st, detail::mpi_type<T>(), &got);
          if (got != c) {
            throw CommMismatch(detail::cat("fourway: CommMismatch in ", what,
                                           ": the matching send "
                                           "carries count ",
                                           got, " but this recv expects ", c));
          }
        },
        nullptr, deadline));
  }

  /// A group of point-to-point operations (NCCL's ncclGroupStart; comm/local/comm.hpp): MPI's
  /// non-blocking sends and recvs never wait for each other, so a group only marks the span in
  /// which a collective is refused, as on every backend. Groups nest.
  void group_start() { ++group_depth_; }
  void group_end(CallOptions /*unused*/ = {}) {
    check<ConfigError>(group_depth_ > 0, "fourway: group_end() in ", s_->header(),
                       " without a group_start()");
    --group_depth_;
  }

  Work barrier_async(CallOptions o = {}) {
    const auto deadline = call_deadline(o);
    const auto seq = enter<std::uint8_t>(CommOp::barrier, 0, ReduceOp::sum, 0, deadline);
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(MPI_Ibarrier(s_->comm, &req), "MPI_Ibarrier");
    return work<std::uint8_t>(deadline, req, seq, CommOp::barrier, 0, ReduceOp::sum, {});
  }

  /// MPI_Comm_split behind a deadline: the (color, key) exchange is an MPI_Iallgather polled
  /// against the deadline, so the blocking MPI_Comm_split after it has every rank present.
  MpiComm split(int color, int key, std::string name = {}, CallOptions o = {}) {
    const auto deadline = call_deadline(o);
    check<ConfigError>(color >= 0, "fourway: split in ", s_->header(), " got color ", color,
                       "; colors are >= 0");
    const auto seq = enter<std::uint8_t>(CommOp::split, 0, ReduceOp::sum, 0, deadline);
    auto both = std::make_shared<std::vector<int>>(2 * static_cast<std::size_t>(s_->size) + 2);
    (*both)[0] = color;
    (*both)[1] = key;
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(
        MPI_Iallgather(both->data(), 2, MPI_INT, both->data() + 2, 2, MPI_INT, s_->comm, &req),
        "MPI_Iallgather");
    work<std::uint8_t>(deadline, req, seq, CommOp::split, 0, ReduceOp::sum, {}, both).wait();
    MPI_Comm out = MPI_COMM_NULL;
    detail::mpi_check(MPI_Comm_split(s_->comm, color, key, &out), "MPI_Comm_split");
    return MpiComm(out, s_->options,
                   name.empty() ? detail::cat(s_->name, "/", color) : std::move(name), 0);
  }

 private:
  template <class T>
  static constexpr bool is_half = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

  MpiComm(MPI_Comm owned, CommOptions options, std::string name, int /*adopt*/) {
    adopt(owned, options, std::move(name));
  }

  void adopt(MPI_Comm comm, CommOptions options, std::string name) {
    s_ = std::make_shared<detail::MpiShared>();
    s_->comm = comm;
    s_->options = options;
    s_->name = std::move(name);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &s_->rank);
    MPI_Comm_size(comm, &s_->size);
    void* base = nullptr;
    if (MPI_Win_allocate(2 * sizeof(std::uint64_t), sizeof(std::uint64_t), MPI_INFO_NULL, comm,
                         &base, &s_->win) == MPI_SUCCESS) {
      s_->progress = static_cast<std::uint64_t*>(base);
      s_->progress[0] = 0;
      s_->progress[1] = 0;
      MPI_Win_set_errhandler(s_->win, MPI_ERRORS_RETURN);
      if (MPI_Win_lock_all(MPI_MODE_NOCHECK, s_->win) != MPI_SUCCESS) {
        MPI_Win_free(&s_->win);
        s_->win = MPI_WIN_NULL;
      }
    } else {
      s_->win = MPI_WIN_NULL;
    }
  }

  /// Frees the window and the communicator if every rank gets here within the deadline (both
  /// frees are collective: a peer that never arrives would otherwise hang this rank). Never
  /// throws; on a timeout it leaks them, which MPI_Finalize or process exit reclaims.
  void release() noexcept {
    if (!s_ || s_.use_count() > 1) return;  // pending Work still refers to it
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    const auto limit =
        std::min<std::chrono::milliseconds>(s_->options.deadline, std::chrono::seconds(10));
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!s_->abandoned.empty() && std::chrono::steady_clock::now() < until) {
      s_->reap();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(s_->comm, &req) != MPI_SUCCESS) return;
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < until) {
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!done) return;
    if (s_->win != MPI_WIN_NULL) {
      MPI_Win_unlock_all(s_->win);
      MPI_Win_free(&s_->win);
    }
    if (s_->abandoned.empty() && s_->comm != MPI_COMM_NULL) MPI_Comm_free(&s_->comm);
  }

  int mpi_count(std::int64_t count, CommOp op) const {
    check<ShapeError>(count >= 0, "fourway: ", comm_op_name(op), " in ", s_->header(),
                      " got a negative count ", count);
    check<ShapeError>(count <= INT32_MAX, "fourway: ", comm_op_name(op), " in ", s_->header(),
                      " moves ", count,
                      " elements; MPI counts are int: split the call into "
                      "pieces of at most ",
                      INT32_MAX);
    return static_cast<int>(count);
  }
  void check_rank(int r, std::string_view role, CommOp op) const {
    check<ConfigError>(r >= 0 && r < s_->size, "fourway: ", comm_op_name(op), " in ", s_->header(),
                       " got ", role, " ", r, "; valid ranks are 0..", s_->size - 1);
  }
  void check_p2p(int peer, int tag, CommOp op) const {
    check_rank(peer, "peer", op);
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(s_->comm, MPI_TAG_UB, &ub, &flag);
    const int max_tag = flag && ub ? *ub : 32767;
    check<ConfigError>(tag >= 0 && tag <= max_tag, "fourway: ", comm_op_name(op), " in ",
                       s_->header(), " got tag ", tag, "; MPI tags are 0..", max_tag);
  }

  /// Counts the collective, publishes it in the progress window and, in debug mode, checks
  /// that every rank makes the same call. Returns its sequence number.
  template <class T>
  std::uint64_t enter(CommOp op, std::int64_t count, ReduceOp reduce, int root,
                      std::chrono::milliseconds deadline) {
    check<ConfigError>(group_depth_ == 0, "fourway: ", comm_op_name(op), " in ", s_->header(),
                       " inside a group (group_start() without group_end()): a group holds "
                       "send_async and recv_async only; end the group first");
    s_->reap();
    const auto seq = ++seq_;
    s_->publish(seq, op);
    detail::CallDesc mine{op, dtype_v<T>, count, reduce, root};
    if (!s_->options.debug) return seq;
    std::int64_t d[5] = {static_cast<std::int64_t>(op), static_cast<std::int64_t>(mine.dtype),
                         count, static_cast<std::int64_t>(reduce), root};
    auto all = std::make_shared<std::vector<std::int64_t>>(5 * static_cast<std::size_t>(s_->size));
    MPI_Request req = MPI_REQUEST_NULL;
    detail::mpi_check(
        MPI_Iallgather(d, 5, MPI_INT64_T, all->data(), 5, MPI_INT64_T, s_->comm, &req),
        "MPI_Iallgather (debug check)");
    Work(std::make_shared<detail::MpiWork>(
             s_, req,
             detail::cat(s_->header(), ", ", detail::describe_call(mine), " #", seq, " on rank ",
                         s_->rank, " (debug check)"),
             seq, nullptr, all, deadline))
        .wait();
    std::vector<detail::CallDesc> calls;
    for (int q = 0; q < s_->size; ++q) {
      const std::int64_t* e = all->data() + 5 * q;
      calls.push_back({static_cast<CommOp>(e[0]), static_cast<Dtype>(e[1]), e[2],
                       static_cast<ReduceOp>(e[3]), static_cast<int>(e[4])});
    }
    const auto report =
        detail::mismatch_report(calls, [](int q) { return detail::cat("rank ", q); });
    if (!report.empty()) {
      throw CommMismatch(detail::cat("fourway: CommMismatch in ", s_->header(), " at collective #",
                                     seq, ": ", report));
    }
    return seq;
  }

  template <class T>
  Work work(std::chrono::milliseconds deadline, MPI_Request req, std::uint64_t seq, CommOp op,
            std::int64_t count, ReduceOp reduce, std::function<void(const MPI_Status&)> finish,
            std::shared_ptr<void> keep = nullptr, int root = 0) {
    return Work(std::make_shared<detail::MpiWork>(
        s_, req,
        detail::cat(s_->header(), ", ",
                    detail::describe_call({op, dtype_v<T>, count, reduce, root}), " #", seq,
                    " on rank ", s_->rank),
        seq, std::move(finish), std::move(keep), deadline));
  }

  /// This call's deadline; MPI moves host memory, so a stream is refused (CallOptions).
  [[nodiscard]] std::chrono::milliseconds call_deadline(const CallOptions& o) const {
    check<ConfigError>(o.stream == nullptr, "fourway: MpiComm in ", s_->header(),
                       " cannot honour CallOptions::stream: MPI moves host memory and orders "
                       "nothing on a CUDA stream; leave it null (use NcclComm or LocalComm for "
                       "device memory)");
    return detail::call_deadline(s_->options, o);
  }

  template <class T>
  static void divide(T* p, std::int64_t n, int by) {
    for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(by));
  }

  std::shared_ptr<detail::MpiShared> s_;
  std::uint64_t seq_ = 0;
  std::uint64_t sends_ = 0;
  std::uint64_t recvs_ = 0;
  int group_depth_ = 0;
};

static_assert(call_options_communicator<MpiComm>);

template <class Fn>
void MpiWorld::launch(int n, Fn&& fn, CommOptions options) {
  detail::mpi_init_once();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  check<ConfigError>(n == 0 || n == size, "fourway: launch<MpiWorld>(", n, ") but mpirun started ",
                     size, " processes; run `mpirun -np ", n, "` or pass 0 to use them all");
  World<MpiWorld> w(MpiComm(MPI_COMM_WORLD, options, "world"));
  detail::run_or_abort(w, fn);
}

}  // namespace fourway
