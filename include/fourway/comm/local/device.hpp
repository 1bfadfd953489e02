//! LocalWorld's device part: collectives and point-to-point on device memory when the unit is
//! compiled by nvcc -- all ranks on one or more GPUs, each ordered on its own stream (the call's
//! `CallOptions::stream`, else the one `set_stream` bound), the host rendezvous ordering the
//! streams with events. In a host unit this part is empty: device pointers cannot reach it.
#pragma once

#include <cstdint>
#include <vector>

#include "fourway/comm/local/rendezvous.hpp"

#if defined(FOURWAY_CUDA_COMPILATION)
#include "fourway/comm/device_reduce.cuh"
#include "fourway/comm/local/reduce.hpp"
#include "fourway/comm/peer_access.hpp"
#endif

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
FOURWAY_BEGIN_MODE_NAMESPACE

/// The device-memory part of LocalComm (see the file comment).
class LocalDevice : protected LocalRendezvous {
 protected:
  using LocalRendezvous::LocalRendezvous;

#if defined(FOURWAY_CUDA_COMPILATION)
  // The host rendezvous orders the streams with events and never waits for the GPU: at entry
  // every rank records `ready` on its stream and, once all arrived, makes its stream wait for
  // every peer's `ready`; it then launches its share and records `done`; after the host "done"
  // rendezvous its stream waits for every peer's `done`.

  cudaStream_t cuda_stream() const { return static_cast<cudaStream_t>(s_->call.stream); }

  /// Refuses device memory while no stream is set: the legacy stream is unordered with the
  /// context's non-blocking one.
  void require_stream(CommOp op) const {
    check<ConfigError>(s_->call.stream != nullptr, "fourway: ", comm_op_name(op),
                       " on device memory in ", g().header(), " refused on rank ", s_->rank,
                       ": no stream is set, so it would run unordered with the kernels that "
                       "write the buffers; call comm.set_stream(ctx.stream()) with the rank's "
                       "Context<Cuda> first (or pass the call CallOptions{.stream = ...})");
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
    wait_for_peers(me, &detail::LocalSlot::ready_event);
    return me;
  }

  void device_leave(const detail::LocalSlot& me) {
    cuda::check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(me.done_event), cuda_stream()),
                     "cudaEventRecord");
    leave(me);
    wait_for_peers(me, &detail::LocalSlot::done_event);
  }

  /// The rank's stream waits for event `which` of every peer's slot of `me`'s call.
  template <class Event>
  void wait_for_peers(const detail::LocalSlot& me, Event detail::LocalSlot::*which) {
    const auto& slots = g().slots[me.seq % 2];
    for (int q = 0; q < size(); ++q) {
      if (q == s_->rank) continue;
      cuda::check_cuda(cudaStreamWaitEvent(
                           cuda_stream(),
                           static_cast<cudaEvent_t>(slots[static_cast<std::size_t>(q)].*which), 0),
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
    if (s_->call.stream == nullptr) {
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

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
