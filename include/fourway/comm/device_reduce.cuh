//! CUDA kernels of the communicators: the fixed-order multi-buffer reduction LocalWorld runs on
//! device memory, and the fp32 casts NcclComm uses so that 16-bit sums accumulate in fp32.
//!
//! `device_reduce` computes, for i in [lo, hi), dst[d][i] = op over q = 0..n-1 (in this order)
//! of src[q][i], accumulating in fp32 (fp64 for double, int64 for integers: `detail::accumulator`)
//! exactly as the host `detail::reduce_range` does, so host and device LocalWorld give
//! bitwise-equal results for sum, max and min (avg divides once at the end on both).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/comm/buffer_kind.hpp"
#include "fourway/comm/communicator.hpp"

namespace fourway::detail {

/// Most ranks one device reduction reads (kernel parameters are passed by value, < 4 KiB).
inline constexpr int max_device_ranks = 64;

struct DeviceBuffers {
  const void* src[max_device_ranks];
  void* dst[max_device_ranks];
  int n;
  int ndst;
};

/// What `p` points to, as CUDA sees it (memory CUDA does not know is pageable host memory).
inline BufferKind cuda_buffer_kind(const void* p) {
  if (p == nullptr) return BufferKind::null;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return BufferKind::host;
  }
  switch (attr.type) {
    case cudaMemoryTypeDevice: return BufferKind::device;
    case cudaMemoryTypeManaged: return BufferKind::managed;
    case cudaMemoryTypeHost: return BufferKind::pinned_host;
    default: return BufferKind::host;
  }
}

/// True when `p` is device (or managed) memory, false for host memory and null.
inline bool is_device_pointer(const void* p) { return nccl_accepts(cuda_buffer_kind(p)); }

/// The device holding `p` (-1 if not device memory).
inline int device_of_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (p == nullptr || cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.device;
}

template <class T, class A>
__device__ inline A device_load(const T* p, std::int64_t i) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<A>(p[i]);
  } else if constexpr (std::is_same_v<T, double>) {
    return p[i];
  } else {
    return static_cast<float>(p[i]);
  }
}
template <class T, class A>
__device__ inline void device_store(T* p, std::int64_t i, A v) {
  if constexpr (std::is_integral_v<T>) {
    p[i] = static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, double>) {
    p[i] = v;
  } else {
    p[i] = T(static_cast<float>(v));
  }
}
template <class T>
__global__ void device_reduce_kernel(DeviceBuffers b, std::int64_t lo, std::int64_t hi,
                                     ReduceOp op) {
  using A = typename accumulator<T>::type;
  for (std::int64_t i = lo + blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < hi; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    A acc = device_load<T, A>(static_cast<const T*>(b.src[0]), i);
    for (int q = 1; q < b.n; ++q) {
      const A v = device_load<T, A>(static_cast<const T*>(b.src[q]), i);
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: acc = acc_add(acc, v); break;
        case ReduceOp::max: acc = acc < v ? v : acc; break;
        case ReduceOp::min: acc = v < acc ? v : acc; break;
      }
    }
    if (op == ReduceOp::avg) acc = acc / static_cast<A>(b.n);
    for (int d = 0; d < b.ndst; ++d) device_store<T, A>(static_cast<T*>(b.dst[d]), i, acc);
  }
}

/// Launches the fixed-order reduction of [lo, hi) on `stream`.
template <class T>
void device_reduce(const DeviceBuffers& b, std::int64_t lo, std::int64_t hi, ReduceOp op,
                   cudaStream_t stream) {
  if (hi <= lo) return;
  const int threads = 256;
  const auto blocks =
      static_cast<int>(std::min<std::int64_t>((hi - lo + threads - 1) / threads, 4096));
  device_reduce_kernel<T><<<blocks, threads, 0, stream>>>(b, lo, hi, op);
  cuda::check_cuda(cudaGetLastError(), "device_reduce kernel launch");
}

template <class From, class To>
__global__ void device_cast_kernel(To* dst, const From* src, std::int64_t n, float scale) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = To(static_cast<float>(src[i]) * scale);
  }
}

/// dst[i] = To(float(src[i]) * scale) on `stream` (16-bit <-> fp32 around an NCCL reduction).
template <class From, class To>
void device_cast(To* dst, const From* src, std::int64_t n, float scale, cudaStream_t stream) {
  if (n <= 0) return;
  const int threads = 256;
  const auto blocks = static_cast<int>(std::min<std::int64_t>((n + threads - 1) / threads, 4096));
  device_cast_kernel<From, To><<<blocks, threads, 0, stream>>>(dst, src, n, scale);
  cuda::check_cuda(cudaGetLastError(), "device_cast kernel launch");
}

}  // namespace fourway::detail

namespace fourway::detail {

template <class T>
__global__ void device_divide_kernel(T* p, std::int64_t n, int by) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<T>(p[i] / static_cast<T>(by));
  }
}

/// p[i] /= by on `stream` (integer and fp64 `avg` after an NCCL sum; truncating for integers).
template <class T>
void device_divide(T* p, std::int64_t n, int by, cudaStream_t stream) {
  if (n <= 0) return;
  const int threads = 256;
  const auto blocks = static_cast<int>(std::min<std::int64_t>((n + threads - 1) / threads, 4096));
  device_divide_kernel<T><<<blocks, threads, 0, stream>>>(p, n, by);
  cuda::check_cuda(cudaGetLastError(), "device_divide kernel launch");
}

}  // namespace fourway::detail
