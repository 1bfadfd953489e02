//! NcclComm: the communicator over NCCL, one rank per GPU, on device memory.
//!
//! Communicators are created non-blocking (`ncclConfig_t::blocking = 0`): every NCCL call may
//! return `ncclInProgress`, and only `ncclCommGetAsyncError` says when it is done (NCCL offers no
//! callback for it, and asking drives the job of a split), so init, split and enqueueing poll it
//! against the deadline, pausing 10 µs doubling to 1 ms between polls (`NcclPoll`).
//!
//! Every operation is enqueued on the communicator's stream and returns a Work that records a
//! CUDA event. Its host `wait()` sleeps: it queues a host function (cudaLaunchHostFunc) on a
//! notify stream of the communicator's, behind a wait for the event, and sleeps on a condition
//! variable that the function signals, until the deadline. The waiter wakes every 10 ms
//! (`nccl_check_interval`) to read what the stream cannot say: `ncclCommGetAsyncError` (a
//! non-blocking communicator reports a peer's failure there, while its kernel keeps the stream
//! busy) and the event's own error (CUDA runs no host function after a context error). When the
//! deadline passes it reads the async error once more for the message, calls `ncclCommAbort` and
//! throws CommTimeout naming the group, the op and its sequence number -- what PyTorch's NCCL
//! watchdog does, in the waiting thread instead of a separate one. The wake-up state is shared
//! (shared_ptr) by the Work and the host function, so a function that runs after the Work or the
//! communicator is gone (an aborted communicator's stream drains later) touches only it. NCCL
//! cannot tell which peer is missing, so the message says the ranks are unknown; an aborted
//! communicator refuses all further calls with CommError. `Work::wait_device()` involves no host
//! wait at all (below), so `orders_on_device()` is true.
//!
//! Deviations from the host backends, by NCCL's design:
//!   - 16-bit sum/avg are reduced in fp32 (cast into an fp32 workspace, ncclAllReduce /
//!     ncclReduceScatter in fp32, cast back), so they accumulate in fp32 as on LocalWorld and
//!     MPI; this doubles the bytes on the wire. `NcclOptions::fp32_accumulation = false` sends
//!     16-bit data and lets NCCL add in 16 bits. max/min are exact in any type.
//!   - point-to-point is matched by peer in posting order (NCCL has no tags); with
//!     `CommOptions::debug` a header (tag, count, dtype) travels before every message and the
//!     receiver throws CommMismatch when it is not the one it expects, instead of writing it.
//!   - a barrier is an all_reduce of one int.
//!
//! Bootstrap: `NcclComm(id, rank, size, device)` with an id from `nccl_unique_id()` shared out of
//! band (`nccl_mpi.cuh` broadcasts it over MPI), or `NcclComm::single(device)` for one rank.
//!
//! Streams and buffers (what a first multi-GPU run would otherwise trip over):
//!   - a communicator starts on a stream of its own (owned, `cuda::Stream`) that only its internal
//!     work uses (barrier, split, debug checks). Collectives and point-to-point on the caller's
//!     buffers are refused with ConfigError until `set_stream(ctx.stream())` binds the stream that
//!     produces and consumes those buffers, so NCCL's reads are ordered after the kernels that
//!     wrote them. The bound stream is borrowed: never destroyed here. A communicator from
//!     `split` borrows its parent's bound stream, or owns a new one when the parent has none.
//!     A call given `CallOptions::stream` runs on that stream instead (work, workspace, Work
//!     event), bound stream or not.
//!   - the communication stream (`NcclOptions::communication_stream`, on by default): once a
//!     stream is bound, the work runs on a second stream the communicator owns, so a collective
//!     runs beside the kernels the bound stream queues after it (a bucket's reduction beside the
//!     rest of the backward). Each call records an event on the bound stream and makes the
//!     communication stream wait for it (NCCL reads what the kernels before the call wrote);
//!     the Work's event is recorded on the communication stream, and `Work::wait_device()` makes
//!     the bound stream wait for it without blocking the host. The caller must not write a buffer
//!     an operation reads, nor read one it writes, before its Work is waited on (host or device),
//!     as with MPI's non-blocking calls. Off, the work runs on the bound stream itself, in order.
//!     A communicator from `split` gets a communication stream of its own (one per group, as
//!     c10d has one per process group).
//!   - every buffer must be device (or managed) memory: host pointers are refused with a
//!     CommError before NCCL sees them (comm/buffer_kind.hpp).
// fourway-requires: nccl
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/comm/communicator.hpp"
#include "fourway/comm/device_reduce.cuh"

namespace fourway {

struct NcclOptions {
  /// Reduce 16-bit sums in fp32 (see the file comment).
  bool fp32_accumulation = true;
  /// Run the work on a communication stream of the communicator's own once a stream is bound,
  /// ordered with the bound stream by events (see the file comment); false: on the bound stream.
  bool communication_stream = true;
};

namespace detail {

using NcclClock = std::chrono::steady_clock;

/// How often a sleeping host wait wakes to read ncclCommGetAsyncError and the event's error:
/// the latest a failure NCCL reports only there ends the wait. A wake-up costs a few µs, so
/// 10 ms keeps a waiting thread below 0.1% of a core. Completion itself wakes it at once.
inline constexpr auto nccl_check_interval = std::chrono::milliseconds(10);

/// The pause between polls of a non-blocking NCCL call that returned ncclInProgress (init, split,
/// an enqueue, finalize): NCCL has no completion callback for those, only ncclCommGetAsyncError,
/// whose call also advances a split's job. Enqueueing usually settles at the first poll; init and
/// split take milliseconds to seconds. 10 µs doubling to 1 ms: quick answers stay quick, long
/// ones cost at most a thousand polls a second.
class NcclPoll {
 public:
  void pause() {
    std::this_thread::sleep_for(next_);
    next_ = std::min(next_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds next_{10};
};

/// What a host wait sleeps on, shared by the Work and the host function that signals it: the
/// function may run after the Work is destroyed or its communicator aborted and destroyed, and
/// touches only this (it holds its own reference, released when it has run).
struct NcclWake {
  std::mutex mu;
  std::condition_variable cv;
  bool fired = false;

  /// The host function (cudaHostFn_t): runs on CUDA's thread once the stream reaches it; makes
  /// no CUDA call.
  static void fire(void* self) {
    const std::unique_ptr<std::shared_ptr<NcclWake>> held(
        static_cast<std::shared_ptr<NcclWake>*>(self));
    NcclWake& w = **held;
    {
      std::lock_guard lock(w.mu);
      w.fired = true;
    }
    w.cv.notify_all();
  }
};

template <class T>
ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  if constexpr (std::is_same_v<T, fp16>) return ncclFloat16;
  if constexpr (std::is_same_v<T, bf16>) return ncclBfloat16;
  if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  return ncclUint8;
}

inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclSum;  // divided afterwards: exact for every type
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

/// What a communicator and its pending Work share.
struct NcclShared {
  ncclComm_t comm = nullptr;
  std::string name;
  CommOptions options;
  NcclOptions nccl;
  int rank = 0;
  int size = 1;
  int device = 0;
  cuda::Stream stream;              // owned until set_stream binds the caller's (borrowed)
  cuda::Stream comm_stream;         // the communication stream (owned), once one is bound
  cuda::Stream notify;              // where host waits queue their host functions (owned, lazy)
  cudaEvent_t ready = nullptr;      // recorded on the bound stream before each call
  std::int64_t* scratch = nullptr;  // device, scratch_words(size) int64 (layout below)
  // scratch layout, in int64 words; the slots never overlap
  static constexpr std::int64_t barrier_word = 0;  // barrier's all-reduced int32
  static constexpr std::int64_t p2p_header = 1;    // [1, 4): the header a debug recv receives
  static constexpr std::int64_t my_call = 8;       // [8, 13): this rank's call, debug check
  static constexpr std::int64_t all_calls = 16;    // [16, 16 + 5·size): every rank's call
  static constexpr std::int64_t scratch_words(int n) { return all_calls + 5 * n; }
  bool aborted = false;
  std::string abort_reason;
  // The CallOptions of the call being enqueued (0 / null: none); its Work copies `deadline()`
  // and records its event on `work_stream()`.
  std::chrono::milliseconds call_timeout{0};
  cudaStream_t call_stream = nullptr;

  /// The stream the call being enqueued runs on: its own, else the communication stream, else
  /// the communicator's.
  [[nodiscard]] cudaStream_t work_stream() const {
    if (call_stream != nullptr) return call_stream;
    return comm_stream.get() != nullptr ? comm_stream.get() : stream.get();
  }
  /// The stream that produces and consumes the call's buffers: its own, else the bound one.
  [[nodiscard]] cudaStream_t buffer_stream() const {
    return call_stream != nullptr ? call_stream : stream.get();
  }

  /// The stream a host wait queues its host function on (made at the first host wait): apart
  /// from the work, so a host function never holds up the next collective.
  cudaStream_t notify_stream() {
    if (notify.get() == nullptr) notify = cuda::make_stream(device);
    return notify.get();
  }

  /// Binds `s` (borrowed) as the stream the buffers are ordered on and, with
  /// `communication_stream`, makes the communication stream and its event.
  void bind(cudaStream_t s) {
    cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
    if (stream.owns()) {
      cuda::check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    }
    stream = cuda::Stream::borrowed(s);
    if (nccl.communication_stream && comm_stream.get() == nullptr) {
      comm_stream = cuda::make_stream(device);
      cuda::check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    }
  }

  /// Orders the call's work after what its buffer stream queued before it (nothing to do when
  /// the work runs on that stream).
  void fence() const {
    const cudaStream_t work = work_stream();
    const cudaStream_t buffers = buffer_stream();
    if (work == buffers || ready == nullptr) return;
    cuda::check_cuda(cudaEventRecord(ready, buffers), "cudaEventRecord (communication fence)");
    cuda::check_cuda(cudaStreamWaitEvent(work, ready, 0), "cudaStreamWaitEvent");
  }

  /// The deadline of the call being enqueued: its own timeout, else `options.deadline`.
  [[nodiscard]] std::chrono::milliseconds deadline() const {
    return call_timeout.count() > 0 ? call_timeout : options.deadline;
  }

  NcclShared() = default;
  NcclShared(const NcclShared&) = delete;
  NcclShared& operator=(const NcclShared&) = delete;
  ~NcclShared() {
    if (comm != nullptr && !aborted) {
      // Flush, then free; a peer that never finalises must not hang this destructor.
      (void)ncclCommFinalize(comm);
      const auto until = NcclClock::now() + std::min<std::chrono::milliseconds>(
                                                options.deadline, std::chrono::seconds(10));
      ncclResult_t st = async_state(comm);
      NcclPoll poll;
      while (st == ncclInProgress && NcclClock::now() < until) {
        poll.pause();
        st = async_state(comm);
      }
      if (st == ncclSuccess) {
        (void)ncclCommDestroy(comm);
      } else {
        (void)ncclCommAbort(comm);
      }
    }
    if (scratch != nullptr) (void)cudaFree(scratch);
    if (ready != nullptr) (void)cudaEventDestroy(ready);
  }

  [[nodiscard]] std::string header() const {
    return cat("group '", name, "' (", size, " ranks, NCCL)");
  }

  [[noreturn]] void fail(const std::string& what, ncclResult_t r) {
    throw CommError(cat("fourway: ", what, " in ", header(), " failed: ", ncclGetErrorString(r),
                        " (", ncclGetLastError(comm), ")"));
  }

  void check_usable(const std::string& what) const {
    check<CommError>(!aborted, "fourway: ", what, " in ", header(),
                     " refused: the communicator was aborted: ", abort_reason);
  }

  void abort(const std::string& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    (void)ncclCommAbort(comm);
  }

  /// A non-blocking communicator's state: ncclCommGetAsyncError's answer, or its own return
  /// value when that is not ncclSuccess (it returns ncclInProgress itself while it completes a
  /// communicator's pending group job, as a split child's first polls do).
  static ncclResult_t async_state(ncclComm_t c) {
    ncclResult_t st = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(c, &st);
    return r != ncclSuccess ? r : st;
  }

  /// After a call on a non-blocking communicator: polls while it is ncclInProgress (NcclPoll).
  void settle(ncclResult_t r, const std::string& what, NcclClock::time_point start) {
    if (r != ncclSuccess && r != ncclInProgress) fail(what, r);
    ncclResult_t st = r;
    NcclPoll poll;
    while (st == ncclInProgress) {
      st = async_state(comm);
      if (st == ncclInProgress) {
        if (NcclClock::now() - start > deadline()) {
          abort(cat(what, " did not finish enqueueing within the deadline"));
          throw CommTimeout(cat("fourway: CommTimeout: ", what, " in ", header(),
                                ": NCCL did not finish the call within ", deadline().count(),
                                " ms; communicator aborted"));
        }
        poll.pause();
      }
    }
    if (st != ncclSuccess) fail(what, st);
  }
};

/// Work on an NCCL stream: an event; a host wait sleeps until it completes, the communicator's
/// async error reports a failure, or the deadline passes (see the file comment).
class NcclWork final : public Work::State {
 public:
  /// `deferred`: the operation sits in an open NCCL group and is enqueued only at the outermost
  /// ncclGroupEnd, so its event is recorded then (`record`), not here.
  NcclWork(std::shared_ptr<NcclShared> s, std::string what, NcclClock::time_point start,
           std::shared_ptr<void> keep, bool deferred = false)
      : s_(std::move(s)),
        what_(std::move(what)),
        start_(start),
        deadline_(s_->deadline()),
        consumer_(s_->buffer_stream()),
        keep_(std::move(keep)) {
    cuda::check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    if (!deferred) record();
  }
  /// Records the completion event behind the operation on its stream.
  void record() {
    cuda::check_cuda(cudaEventRecord(event_, s_->work_stream()), "cudaEventRecord");
    recorded_ = true;
  }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;
  ~NcclWork() override {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }

  void wait() override {
    check<ConfigError>(recorded_, "fourway: ", what_, " in ", s_->header(),
                       " waited inside its group: NCCL enqueues a group's operations at "
                       "group_end(); end the group, then wait");
    if (!test()) {
      arm();
      const auto until = start_ + deadline_;
      while (!test()) {
        const auto now = NcclClock::now();
        if (now >= until) {
          time_out(now);
          break;
        }
        std::unique_lock lock(wake_->mu);
        wake_->cv.wait_until(lock, std::min(until, now + nccl_check_interval),
                             [&] { return wake_->fired; });
      }
    }
    if (error_) std::rethrow_exception(error_);
  }

  /// The stream that consumes the buffers waits for the event; the host goes on. The
  /// workspace is released at once: its cudaFreeAsync is ordered after the operation on the
  /// stream it ran on.
  void wait_on_device() override {
    check<ConfigError>(recorded_, "fourway: ", what_, " in ", s_->header(),
                       " waited inside its group: end the group (group_end()) first");
    if (test()) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
    cuda::check_cuda(cudaStreamWaitEvent(consumer_, event_, 0), "cudaStreamWaitEvent");
    keep_.reset();
  }

  bool test() override {
    if (done_) return true;
    if (!recorded_) return false;  // in a group not yet ended
    const cudaError_t q = cudaEventQuery(event_);
    if (q == cudaSuccess) {
      done_ = true;
      keep_.reset();
      return true;
    }
    if (q != cudaErrorNotReady) {
      error_ = std::make_exception_ptr(
          DeviceError(cat("fourway: ", what_, ": ", cudaGetErrorString(q))));
      done_ = true;
      return true;
    }
    ncclResult_t st = ncclSuccess;
    if (s_->aborted) {
      error_ = std::make_exception_ptr(
          CommError(cat("fourway: ", what_, " in ", s_->header(),
                        " abandoned: the communicator was aborted: ", s_->abort_reason)));
      done_ = true;
      return true;
    }
    st = detail::NcclShared::async_state(s_->comm);
    if (st != ncclSuccess && st != ncclInProgress) {
      s_->abort(cat(what_, " failed: ", ncclGetErrorString(st)));
      error_ = std::make_exception_ptr(
          CommError(cat("fourway: ", what_, " in ", s_->header(),
                        " failed: ", ncclGetErrorString(st), "; communicator aborted")));
      done_ = true;
      return true;
    }
    return false;
  }

 private:
  std::shared_ptr<NcclShared> s_;
  std::string what_;
  NcclClock::time_point start_;
  std::chrono::milliseconds deadline_;  // the call's CallOptions::timeout, else the group's
  cudaStream_t consumer_;               // the stream the buffers are ordered on
  std::shared_ptr<void> keep_;
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
  std::shared_ptr<NcclWake> wake_;  // made by the first host wait
  bool done_ = false;
  std::exception_ptr error_;

  /// Queues, once, the host function that wakes a host wait when the event completes: on the
  /// notify stream behind a wait for the event, so the work stream never waits for the host.
  void arm() {
    if (wake_) return;
    wake_ = std::make_shared<NcclWake>();
    const cudaStream_t n = s_->notify_stream();
    cuda::check_cuda(cudaStreamWaitEvent(n, event_, 0), "cudaStreamWaitEvent (host wait)");
    auto held = std::make_unique<std::shared_ptr<NcclWake>>(wake_);
    cuda::check_cuda(cudaLaunchHostFunc(n, &NcclWake::fire, held.get()),
                     "cudaLaunchHostFunc (host wait)");
    (void)held.release();  // NcclWake::fire deletes it
  }

  /// The deadline passed: NCCL's own state read once more for the message, then the abort.
  void time_out(NcclClock::time_point now) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - start_).count();
    const ncclResult_t st = NcclShared::async_state(s_->comm);
    error_ = std::make_exception_ptr(CommTimeout(
        cat("fourway: CommTimeout: ", s_->header(), ", ", what_, ": waited ", waited,
            " ms (deadline ", deadline_.count(),
            " ms) for ranks unknown (NCCL does not report which ranks have not arrived; "
            "ncclCommGetAsyncError at the deadline: ",
            ncclGetErrorString(st),
            "); the communicator was aborted, as PyTorch's NCCL watchdog does. If the peers are "
            "only slow, raise CommOptions::deadline (or this call's CallOptions::timeout)")));
    s_->abort(cat(what_, " timed out"));
    done_ = true;
  }
};

/// A device buffer freed on the stream when the last owner lets go.
inline std::shared_ptr<void> nccl_workspace(std::size_t bytes, cudaStream_t stream, void** out) {
  void* p = nullptr;
  if (bytes > 0)
    cuda::check_cuda(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync (NCCL workspace)");
  *out = p;
  return std::shared_ptr<void>(p, [stream](void* q) {
    if (q != nullptr) (void)cudaFreeAsync(q, stream);
  });
}

/// The NCCL group open on this thread, across every communicator: ncclGroupStart/End nest per
/// thread in NCCL itself, and the operations of a group are enqueued only at the outermost end,
/// so the Works they return record their events then. (A mirror of NCCL's own thread-local
/// group state, not state of fourway's.)
struct NcclThreadGroup {
  int depth = 0;
  std::vector<std::shared_ptr<NcclWork>> deferred;
};
inline NcclThreadGroup& nccl_thread_group() {
  thread_local NcclThreadGroup g;
  return g;
}
}  // namespace detail

/// A new NCCL unique id (call on one rank, share with all).
inline ncclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  check<CommError>(r == ncclSuccess, "fourway: ncclGetUniqueId failed: ", ncclGetErrorString(r));
  return id;
}

class NcclComm : public detail::BlockingForms<NcclComm> {
 public:
  /// Rank `rank` of `size` on GPU `device`; every rank passes the same `id`.
  NcclComm(ncclUniqueId id, int rank, int size, int device, CommOptions options = {},
           std::string name = "world", NcclOptions nccl = {}) {
    check<ConfigError>(size >= 1 && rank >= 0 && rank < size, "fourway: NcclComm rank ", rank,
                       " of ", size, " is not a rank");
    init_shared(options, std::move(name), nccl, rank, size, device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto start = detail::NcclClock::now();
    s_->settle(ncclCommInitRankConfig(&s_->comm, size, id, rank, &config), "ncclCommInitRankConfig",
               start);
  }
  /// A one-rank communicator on `device` (no bootstrap).
  static NcclComm single(int device = 0, CommOptions options = {}, NcclOptions nccl = {}) {
    cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
    return NcclComm(nccl_unique_id(), 0, 1, device, options, "world", nccl);
  }
  NcclComm(NcclComm&&) noexcept = default;
  NcclComm& operator=(NcclComm&&) noexcept = default;

  [[nodiscard]] int rank() const { return s_->rank; }
  [[nodiscard]] int size() const { return s_->size; }
  [[nodiscard]] std::string_view name() const { return s_->name; }
  [[nodiscard]] int device() const { return s_->device; }
  [[nodiscard]] const CommOptions& options() const { return s_->options; }
  [[nodiscard]] ncclComm_t native() const { return s_->comm; }
  /// The stream the buffers are ordered on: the bound one, else the communicator's own.
  [[nodiscard]] cudaStream_t stream() const { return s_->stream.get(); }
  /// The stream the work runs on: the communication stream once a stream is bound (with
  /// `NcclOptions::communication_stream`), else `stream()`.
  [[nodiscard]] cudaStream_t communication_stream() const {
    return s_->comm_stream.get() != nullptr ? s_->comm_stream.get() : s_->stream.get();
  }
  /// Whether `set_stream` bound a caller's stream (collectives on buffers need one).
  [[nodiscard]] bool stream_bound() const { return !s_->stream.owns(); }
  /// Orders this communicator's work with `stream` (the rank's Context<Cuda>::stream()),
  /// borrowed: the caller keeps it alive while the communicator is used. The own stream is
  /// destroyed; the work then runs on the communication stream (see the file comment), or on
  /// `stream` itself without one.
  void set_stream(cudaStream_t stream) {
    check<ConfigError>(stream != nullptr, "fourway: set_stream on ", s_->header(),
                       " got a null stream; pass the rank's Context<Cuda>::stream()");
    s_->bind(stream);
  }
  [[nodiscard]] bool aborted() const { return s_->aborted; }
  /// `Work::wait_device()` orders the buffers' stream on the device, never by a host wait
  /// (comm/work.hpp `complete_in_stream_order`).
  [[nodiscard]] static constexpr bool orders_on_device() { return true; }

  void barrier(CallOptions o = {}) {
    use_call_options(o);
    const auto start = detail::NcclClock::now();
    const auto what = begin<std::int32_t>(CommOp::barrier, 1, ReduceOp::sum, 0);
    auto* one = reinterpret_cast<std::int32_t*>(s_->scratch + detail::NcclShared::barrier_word);
    s_->settle(ncclAllReduce(one, one, 1, ncclInt32, ncclSum, s_->comm, s_->work_stream()), what,
               start);
    Work(std::make_shared<detail::NcclWork>(s_, what, start, nullptr)).wait();
  }

  template <comm_element T>
  Work all_reduce_async(const T* send, T* recv, std::int64_t count, ReduceOp op,
                        CallOptions o = {}) {
    use_call_options(o);
    const auto start = detail::NcclClock::now();
    const auto what = begin<T>(CommOp::all_reduce, count, op, 0);
    user_buffer(what, send, count, "send");
    user_buffer(what, recv, count, "recv");
    std::shared_ptr<void> keep;
    if (widen<T>(op)) {
      void* w = nullptr;
      keep = detail::nccl_workspace(static_cast<std::size_t>(count) * sizeof(float),
                                    s_->work_stream(), &w);
      auto* f = static_cast<float*>(w);
      detail::device_cast<T, float>(f, send, count, 1.0f, s_->work_stream());
      s_->settle(ncclAllReduce(f, f, static_cast<std::size_t>(count), ncclFloat32, ncclSum,
                               s_->comm, s_->work_stream()),
                 what, start);
      detail::device_cast<float, T>(
          recv, f, count, op == ReduceOp::avg ? 1.0f / static_cast<float>(s_->size) : 1.0f,
          s_->work_stream());
    } else {
      s_->settle(ncclAllReduce(send, recv, static_cast<std::size_t>(count), detail::nccl_type<T>(),
                               detail::nccl_op(op), s_->comm, s_->work_stream()),
                 what, start);
      if (op == ReduceOp::avg) finish_avg(recv, count);
    }
    return Work(std::make_shared<detail::NcclWork>(s_, what, start, std::move(keep)));
  }

  template <comm_element T>
  Work reduce_scatter_async(const T* send, T* recv, std::int64_t count, ReduceOp op,
                            CallOptions o = {}) {
    use_call_options(o);
    const auto start = detail::NcclClock::now();
    const auto what = begin<T>(CommOp::reduce_scatter, count, op, 0);
    const std::int64_t total = count * s_->size;
    user_buffer(what, send, total, "send");
    user_buffer(what, recv, count, "recv");
    std::shared_ptr<void> keep;
    if (widen<T>(op)) {
      void* w = nullptr;
      keep = detail::nccl_workspace(static_cast<std::size_t>(total + count) * sizeof(float),
                                    s_->work_stream(), &w);
      auto* f = static_cast<float*>(w);
      detail::device_cast<T, float>(f, send, total, 1.0f, s_->work_stream());
      s_->settle(ncclReduceScatter(f, f + total, static_cast<std::size_t>(count), ncclFloat32,
                                   ncclSum, s_->comm, s_->work_stream()),
                 what, start);
      detail::device_cast<float, T>(
          recv, f + total, count, op == ReduceOp::avg ? 1.0f / static_cast<float>(s_->size) : 1.0f,
          s_->work_stream());
    } else {
      s_->settle(
          ncclReduceScatter(send, recv, static_cast<std::size_t>(count), detail::nccl_type<T>(),
                            detail::nccl_op(op), s_->comm, s_->work_stream()),
          what, start);
      if (op == ReduceOp::avg) finish_avg(recv, count);
    }
    return Work(std::make_shared<detail::NcclWork>(s_, what, start, std::move(keep)));
  }

  template <comm_element T>
  Work all_gather_async(const T* send, T* recv, std::int64_t count, CallOptions o = {}) {
    use_call_options(o);
    const auto start = detail::NcclClock::now();
    const auto what = begin<T>(CommOp::all_gather, count, ReduceOp::sum, 0);
    user_buffer(what, send, count, "send");
    user_buffer(what, recv, count * s_->size, "recv");
    s_->settle(ncclAllGather(send, recv, static_cast<std::size_t>(count), detail::nccl_type<T>(),
                             s_->comm, s_->work_stream()),
               what, start);
    return Work(std::make_shared<detail::NcclWork>(s_, what, start, nullptr));
  }

  template <comm_element T>
  Work broadcast_async(T* buf, std::int64_t count, int root, CallOptions o = {}) {
    use_call_options(o);
    check<ConfigError>(root >= 0 && root < s_->size, "fourway: broadcast in ", s_->header(),
                       " got root ", root, "; valid ranks are 0..", s_->size - 1);
    const auto start = detail::NcclClock::now();
    const auto what = begin<T>(CommOp::broadcast, count, ReduceOp::sum, root);
    user_buffer(what, buf, count, "broadcast");
    s_->settle(ncclBroadcast(buf, buf, static_cast<std::size_t>(count), detail::nccl_type<T>(),
                             root, s_->comm, s_->work_stream()),
               what, start);
    return Work(std::make_shared<detail::NcclWork>(s_, what, start, nullptr));
  }

  template <comm_element T>
  Work send_async(const T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    use_call_options(o);
    check_p2p(peer, tag, count, "send");
    const auto start = detail::NcclClock::now();
    const std::string what =
        detail::cat("send #", ++sends_, " (", dtype_name(dtype_v<T>), ", count ", count,
                    ") on rank ", s_->rank, " to rank ", peer, " with tag ", tag);
    s_->check_usable(what);
    cuda::check_cuda(cudaSetDevice(s_->device), "cudaSetDevice");
    s_->fence();
    user_buffer(what, buf, count, "send");
    std::shared_ptr<void> keep;
    in_group_debug_check(what);
    s_->settle(ncclGroupStart(), what, start);
    if (s_->options.debug) {
      void* h = nullptr;
      keep = detail::nccl_workspace(3 * sizeof(std::int64_t), s_->work_stream(), &h);
      const std::int64_t header[3] = {tag, count, static_cast<std::int64_t>(dtype_v<T>)};
      cuda::check_cuda(
          cudaMemcpyAsync(h, header, sizeof(header), cudaMemcpyHostToDevice, s_->work_stream()),
          "cudaMemcpyAsync (p2p header)");
      cuda::check_cuda(cudaStreamSynchronize(s_->work_stream()), "cudaStreamSynchronize");
      (void)ncclSend(h, 3, ncclInt64, peer, s_->comm, s_->work_stream());
    }
    (void)ncclSend(buf, static_cast<std::size_t>(count), detail::nccl_type<T>(), peer, s_->comm,
                   s_->work_stream());
    s_->settle(ncclGroupEnd(), what, start);
    return p2p_work(what, start, std::move(keep));
  }

  template <comm_element T>
  Work recv_async(T* buf, std::int64_t count, int peer, int tag, CallOptions o = {}) {
    use_call_options(o);
    check_p2p(peer, tag, count, "recv");
    const auto start = detail::NcclClock::now();
    const std::string what =
        detail::cat("recv #", ++recvs_, " (", dtype_name(dtype_v<T>), ", count ", count,
                    ") on rank ", s_->rank, " from rank ", peer, " with tag ", tag);
    s_->check_usable(what);
    cuda::check_cuda(cudaSetDevice(s_->device), "cudaSetDevice");
    s_->fence();
    user_buffer(what, buf, count, "recv");
    in_group_debug_check(what);
    if (s_->options.debug) {
      std::int64_t* h = s_->scratch + detail::NcclShared::p2p_header;
      s_->settle(ncclRecv(h, 3, ncclInt64, peer, s_->comm, s_->work_stream()), what, start);
      Work(std::make_shared<detail::NcclWork>(s_, what + " (header)", start, nullptr)).wait();
      std::int64_t header[3];
      cuda::check_cuda(cudaMemcpy(header, h, sizeof(header), cudaMemcpyDeviceToHost),
                       "cudaMemcpy (p2p header)");
      if (header[0] != tag || header[1] != count ||
          header[2] != static_cast<std::int64_t>(dtype_v<T>)) {
        throw CommMismatch(
            detail::cat("fourway: CommMismatch in ", s_->header(), ", ", what,
                        ": the next message from rank ", peer, " has tag ", header[0], ", count ",
                        header[1], ", ", dtype_name(static_cast<Dtype>(header[2])),
                        " (NCCL delivers point-to-point messages "
                        "in posting order: post the receives in the order of the sends)"));
      }
    }
    s_->settle(ncclRecv(buf, static_cast<std::size_t>(count), detail::nccl_type<T>(), peer,
                        s_->comm, s_->work_stream()),
               what, start);
    return p2p_work(what, start, nullptr);
  }

  /// Starts a group of point-to-point operations (ncclGroupStart): the send_async and recv_async
  /// calls up to the matching group_end() are enqueued together there, so two ranks may send
  /// to and receive from each other without waiting. Their Works can be waited after
  /// group_end(). Nothing else may be called inside (a collective is refused with ConfigError,
  /// as are debug mode's headers, which need a host wait). Groups nest, here and across
  /// communicators (NCCL's group is the calling thread's).
  void group_start() {
    s_->check_usable("group_start");
    cuda::check_cuda(cudaSetDevice(s_->device), "cudaSetDevice");
    s_->settle(ncclGroupStart(), "ncclGroupStart", detail::NcclClock::now());
    ++group_depth_;
    ++detail::nccl_thread_group().depth;
  }
  /// Ends a group (ncclGroupEnd); the thread's outermost end enqueues every operation of it.
  void group_end(CallOptions o = {}) {
    use_call_options(o);
    check<ConfigError>(group_depth_ > 0, "fourway: group_end() in ", s_->header(),
                       " without a group_start()");
    s_->settle(ncclGroupEnd(), "ncclGroupEnd", detail::NcclClock::now());
    --group_depth_;
    auto& g = detail::nccl_thread_group();
    if (--g.depth > 0) return;
    auto works = std::move(g.deferred);
    g.deferred.clear();
    for (auto& w : works) w->record();
  }

  /// ncclCommSplit (non-blocking) over the ranks passing the same color, ranked by key.
  NcclComm split(int color, int key, std::string name = {}, CallOptions o = {}) {
    use_call_options(o);
    check<ConfigError>(color >= 0, "fourway: split in ", s_->header(), " got color ", color,
                       "; colors are >= 0");
    const auto start = detail::NcclClock::now();
    const auto what = begin<std::uint8_t>(CommOp::split, 0, ReduceOp::sum, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t out = nullptr;
    s_->settle(ncclCommSplit(s_->comm, color, key, &out, &config), what, start);
    int r = 0;
    int n = 0;
    // A non-blocking split leaves the new handle null until its job is done (NCCL publishes it
    // from the job's thread; asking the parent for its state completes the job): drain the
    // parent until the handle appears, then the child until it is ready.
    ncclResult_t st = ncclInProgress;
    detail::NcclPoll poll;
    for (;;) {
      const ncclComm_t child = __atomic_load_n(&out, __ATOMIC_ACQUIRE);
      if (child != nullptr) {
        st = detail::NcclShared::async_state(child);
        if (st != ncclInProgress) break;
      } else {
        st = detail::NcclShared::async_state(s_->comm);
        if (st != ncclSuccess && st != ncclInProgress) break;
      }
      check<CommTimeout>(detail::NcclClock::now() - start <= s_->deadline(),
                         "fourway: CommTimeout: ", what, " in ", s_->header(),
                         ": ncclCommSplit did not finish within the deadline");
      poll.pause();
    }
    check<CommError>(st == ncclSuccess, "fourway: ncclCommSplit in ", s_->header(),
                     " failed: ", ncclGetErrorString(st));
    ncclCommUserRank(out, &r);
    ncclCommCount(out, &n);
    NcclComm c;
    c.init_shared(s_->options, name.empty() ? detail::cat(s_->name, "/", color) : std::move(name),
                  s_->nccl, r, n, s_->device);
    c.s_->comm = out;
    if (stream_bound()) c.s_->bind(s_->stream.get());  // else: the child's own, from init
    return c;
  }

 private:
  NcclComm() = default;

  void init_shared(CommOptions options, std::string name, NcclOptions nccl, int rank, int size,
                   int device) {
    s_ = std::make_shared<detail::NcclShared>();
    s_->options = options;
    s_->name = std::move(name);
    s_->nccl = nccl;
    s_->rank = rank;
    s_->size = size;
    s_->device = device;
    s_->stream = cuda::make_stream(device);
    void* p = nullptr;
    const auto words = detail::NcclShared::scratch_words(size);
    cuda::check_cuda(cudaMalloc(&p, static_cast<std::size_t>(words) * sizeof(std::int64_t)),
                     "cudaMalloc");
    s_->scratch = static_cast<std::int64_t*>(p);
    cuda::check_cuda(
        cudaMemset(s_->scratch, 0, static_cast<std::size_t>(words) * sizeof(std::int64_t)),
        "cudaMemset");
  }

  /// Makes `o` the options of the call being enqueued: its deadline, and the stream its work,
  /// workspaces and Work event go on (NCCL takes a stream per call, as c10d's per-op streams do;
  /// the scratch buffers a debug check or a barrier uses are waited for before the call returns,
  /// so calls on different streams never share them in flight).
  void use_call_options(const CallOptions& o) {
    s_->call_timeout = detail::call_deadline(s_->options, o);
    s_->call_stream = static_cast<cudaStream_t>(o.stream);
  }

  /// Refuses a caller's buffer NCCL cannot use (host memory) or cannot order (no bound stream).
  template <class T>
  void user_buffer(const std::string& what, const T* p, std::int64_t count,
                   std::string_view role) const {
    check<ConfigError>(stream_bound() || s_->call_stream != nullptr, "fourway: ", what, " in ",
                       s_->header(),
                       " refused: no stream is bound, so NCCL would read the buffers unordered "
                       "with the kernels that write them; call set_stream(ctx.stream()) with the "
                       "rank's Context<Cuda> first, or pass the call CallOptions{.stream = ...}");
    require_nccl_buffer(detail::cuda_buffer_kind(p), count, role, what);
  }

  template <class T>
  bool widen(ReduceOp op) const {
    return (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>)&&s_->nccl.fp32_accumulation &&
           (op == ReduceOp::sum || op == ReduceOp::avg);
  }

  template <class T>
  void finish_avg(T* recv, std::int64_t count) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, fp16>) {
      detail::device_cast<T, T>(recv, recv, count, 1.0f / static_cast<float>(s_->size),
                                s_->work_stream());
    } else {
      detail::device_divide<T>(recv, count, s_->size, s_->work_stream());
    }
  }

  void check_p2p(int peer, int tag, std::int64_t count, const char* op) const {
    check<ConfigError>(peer >= 0 && peer < s_->size, "fourway: ", op, " in ", s_->header(),
                       " got peer ", peer, "; valid ranks are 0..", s_->size - 1);
    check<ConfigError>(tag >= 0, "fourway: ", op, " in ", s_->header(), " got tag ", tag,
                       "; tags are >= 0");
    check<ShapeError>(count >= 0, "fourway: ", op, " in ", s_->header(), " got a negative count ",
                      count);
  }

  /// A point-to-point operation's Work: its event recorded now, or at the thread's outermost
  /// group_end when it sits in a group.
  Work p2p_work(const std::string& what, detail::NcclClock::time_point start,
                std::shared_ptr<void> keep) {
    const bool grouped = detail::nccl_thread_group().depth > 0;
    auto w = std::make_shared<detail::NcclWork>(s_, what, start, std::move(keep), grouped);
    if (grouped) detail::nccl_thread_group().deferred.push_back(w);
    return Work(w);
  }
  /// Debug mode's p2p headers need a host wait, which a group cannot hold.
  void in_group_debug_check(const std::string& what) const {
    check<ConfigError>(!(s_->options.debug && detail::nccl_thread_group().depth > 0),
                       "fourway: ", what, " in ", s_->header(),
                       " inside a group in debug mode: the p2p header check waits on the host, "
                       "which a group cannot; run without CommOptions::debug, or ungrouped");
  }

  /// Counts the collective and, in debug mode, checks that all ranks make the same call (an
  /// all_gather of descriptors through the scratch buffer). Returns the description for messages.
  template <class T>
  std::string begin(CommOp op, std::int64_t count, ReduceOp reduce, int root) {
    check<ShapeError>(count >= 0, "fourway: ", comm_op_name(op), " in ", s_->header(),
                      " got a negative count ", count);
    check<ConfigError>(group_depth_ == 0, "fourway: ", comm_op_name(op), " in ", s_->header(),
                       " inside a group (group_start() without group_end()): a group holds "
                       "send_async and recv_async only; end the group first");
    const detail::CallDesc mine{op, dtype_v<T>, count, reduce, root, true};
    const auto seq = ++seq_;
    std::string what = detail::cat(detail::describe_call(mine), " #", seq, " on rank ", s_->rank);
    s_->check_usable(what);
    cuda::check_cuda(cudaSetDevice(s_->device), "cudaSetDevice");
    s_->fence();
    if (!s_->options.debug) return what;
    const auto start = detail::NcclClock::now();
    const std::int64_t d[5] = {static_cast<std::int64_t>(op), static_cast<std::int64_t>(mine.dtype),
                               count, static_cast<std::int64_t>(reduce), root};
    std::int64_t* mine_dev = s_->scratch + detail::NcclShared::my_call;
    std::int64_t* all_dev = s_->scratch + detail::NcclShared::all_calls;
    cuda::check_cuda(
        cudaMemcpyAsync(mine_dev, d, sizeof(d), cudaMemcpyHostToDevice, s_->work_stream()),
        "cudaMemcpyAsync");
    s_->settle(ncclAllGather(mine_dev, all_dev, 5, ncclInt64, s_->comm, s_->work_stream()),
               what + " (debug check)", start);
    Work(std::make_shared<detail::NcclWork>(s_, what + " (debug check)", start, nullptr)).wait();
    std::vector<std::int64_t> all(static_cast<std::size_t>(5 * s_->size));
    cuda::check_cuda(
        cudaMemcpy(all.data(), all_dev, all.size() * sizeof(std::int64_t), cudaMemcpyDeviceToHost),
        "cudaMemcpy");
    std::vector<detail::CallDesc> calls;
    for (int q = 0; q < s_->size; ++q) {
      const std::int64_t* e = all.data() + 5 * q;
      calls.push_back({static_cast<CommOp>(e[0]), static_cast<Dtype>(e[1]), e[2],
                       static_cast<ReduceOp>(e[3]), static_cast<int>(e[4]), true});
    }
    const auto report =
        detail::mismatch_report(calls, [](int q) { return detail::cat("rank ", q); });
    if (!report.empty()) {
      throw CommMismatch(detail::cat("fourway: CommMismatch in ", s_->header(), " at collective #",
                                     seq, ": ", report));
    }
    return what;
  }

  std::shared_ptr<detail::NcclShared> s_;
  std::uint64_t seq_ = 0;
  int group_depth_ = 0;
  std::uint64_t sends_ = 0;
  std::uint64_t recvs_ = 0;
};

static_assert(call_options_communicator<NcclComm>);

}  // namespace fourway
