//! The Cuda backend: device memory through cudaMalloc, and the per-rank CUDA context (device,
//! stream, cuBLAS handle). Several ranks may share one GPU, each with its own stream.
//!
//! All work a context issues goes to its stream; `synchronize()` waits for it. Host<->device
//! copies are ordered on the same stream. A copy to the host waits for the stream; a copy from
//! the host of at most `Context<Cuda>::staging_bytes` goes through the context's pinned staging
//! buffer and does not (it waits only when the staging buffer's previous copy has not run yet),
//! so a step's token upload leaves the device queue running. Every wait is counted
//! (core/sync_counter.hpp). Memory goes to the context's device whatever device is
//! current in the allocating thread: the context binds its device to the rank's accountant and
//! tensors allocate with `Cuda::allocate(bytes, device)`. cuBLAS never reduces in 16 bits
//! (`CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`) and uses TF32 for fp32 GEMMs only when
//! the context is told to (`set_tf32(true)`, fourway-train-cuda's `--tf32`): compute type
//! `CUBLAS_COMPUTE_32F_FAST_TF32` then, `CUBLAS_COMPUTE_32F` otherwise (gemm.cuh). Streams are
//! `cuda::Stream` handles: owned or borrowed (core/handle.hpp). The context also holds a cuBLASLt
//! handle and its persistent workspace (`lt_workspace_bytes`, made at the first epilogue GEMM
//! and counted under `MemTag::workspace` until the context goes: cuda/gemm_epilogue.cuh); from
//! then on cuBLAS's own GEMMs use its head as their workspace too (`cublasSetWorkspace`), so a
//! step captured in a CUDA graph (backend/capture.hpp) runs the algorithms an uncaptured step
//! runs, in memory the context owns, rather than a pool cuBLAS would allocate inside the capture.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fourway/core/error.hpp"
#include "fourway/core/handle.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/sync_counter.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

namespace cuda {
/// Throws DeviceError naming the call and CUDA's message when `status` is not cudaSuccess.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw DeviceError(detail::cat("fourway: ", what, " failed: ", cudaGetErrorName(status), " (",
                                  cudaGetErrorString(status), ")"));
  }
}
inline void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw DeviceError(
        detail::cat("fourway: ", what, " failed with cuBLAS status ", static_cast<int>(status)));
  }
}
/// Number of visible GPUs; 0 (never an exception) when there is no driver or no device.
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

struct StreamTraits {
  using native_type = cudaStream_t;
  static void destroy(cudaStream_t s) noexcept { (void)cudaStreamDestroy(s); }
};
/// A CUDA stream, owned (destroyed with the handle) or borrowed (core/handle.hpp).
using Stream = Handle<StreamTraits>;

/// A new non-blocking stream on `device` (made current for the calling thread), owned.
inline Stream make_stream(int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return Stream::owning(s);
}

/// The math mode every context's cuBLAS handle runs in: no TF32 (CUBLAS_DEFAULT_MATH) and no
/// reduced-precision (16-bit) reductions inside 16-bit GEMMs.
inline constexpr cublasMath_t cublas_math_mode = static_cast<cublasMath_t>(
    CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);

/// Free bytes on `device` now (cudaMemGetInfo): the default per-rank memory cap of the programs,
/// so running out is fourway's OutOfMemory with the per-tag table, not a bare cudaMalloc error.
inline std::size_t free_memory(int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  std::size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}
}  // namespace cuda

struct Cuda {
  static constexpr std::string_view name = "cuda";
  static constexpr bool on_device = true;

  /// `bytes` on the calling thread's current device.
  static void* allocate(std::size_t bytes) { return allocate(bytes, -1); }
  /// `bytes` on `device` (the current device when negative); the thread's current device is left
  /// as it was.
  static void* allocate(std::size_t bytes, int device) {
    int current = -1;
    if (device >= 0) {
      cuda::check_cuda(cudaGetDevice(&current), "cudaGetDevice");
      if (current != device) cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
    }
    void* p = nullptr;
    const cudaError_t st = cudaMalloc(&p, bytes);
    if (device >= 0 && current != device) (void)cudaSetDevice(current);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      throw OutOfMemory(detail::cat("fourway: cudaMalloc of ", bytes, " B on GPU ", device,
                                    " failed: ", cudaGetErrorString(st)));
    }
    return p;
  }
  static void deallocate(void* p) noexcept { (void)cudaFree(p); }
};
static_assert(backend<Cuda>);

/// Per-rank CUDA context: the rank's accountant, its device, a stream, a cuBLAS handle, the
/// pinned staging buffer of small host-to-device copies, and the count of synchronising calls.
template <>
struct Context<Cuda> : SyncCounter {
  /// Host-to-device copies up to this size are staged through pinned memory (asynchronous);
  /// larger ones (weight loads) copy from pageable memory and wait.
  static constexpr std::size_t staging_bytes = std::size_t{4} << 20;

  using backend_type = Cuda;
  /// `tf32`: see `set_tf32`; `fused_attention`, `cudnn_attention`: see `set_fused_attention`,
  /// `set_cudnn_attention`.
  Context(MemoryAccountant& m, int device, bool tf32 = false, bool fused_attention = false,
          bool cudnn_attention = false)
      : memory_(&m),
        device_(device),
        tf32_(tf32),
        fused_attention_(fused_attention),
        cudnn_attention_(cudnn_attention) {
    const int visible = cuda::device_count();
    check<DeviceError>(device >= 0 && device < visible, "fourway: rank ", m.rank(),
                       " asks for CUDA device ", device, " but ", visible,
                       " devices are visible; use a device in [0, ", visible,
                       ") or check CUDA_VISIBLE_DEVICES");
    m.bind_device(device);
    stream_ = cuda::make_stream(device);
    cuda::check_cublas(cublasCreate(&cublas_), "cublasCreate");
    cuda::check_cublas(cublasSetStream(cublas_, stream_.get()), "cublasSetStream");
    cuda::check_cublas(cublasSetMathMode(cublas_, cuda::cublas_math_mode), "cublasSetMathMode");
    cuda::check_cublas(cublasLtCreate(&cublaslt_), "cublasLtCreate");
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() {
    if (staged_ != nullptr) (void)cudaEventSynchronize(staged_);
    if (staged_ != nullptr) (void)cudaEventDestroy(staged_);
    if (staging_ != nullptr) (void)cudaFreeHost(staging_);
    if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
    if (lt_workspace_ != nullptr) {
      (void)cudaStreamSynchronize(stream_.get());
      (void)cudaFree(lt_workspace_);
      memory_->on_free(MemTag::workspace, lt_workspace_bytes);
    }
    if (cublaslt_ != nullptr) (void)cublasLtDestroy(cublaslt_);
  }
  [[nodiscard]] MemoryAccountant& memory() const { return *memory_; }
  [[nodiscard]] int device() const { return device_; }
  [[nodiscard]] cudaStream_t stream() const { return stream_.get(); }
  [[nodiscard]] cublasHandle_t cublas() const { return cublas_; }
  /// Bytes of the persistent cuBLASLt workspace (32 MiB, what cuBLAS itself keeps for Hopper).
  static constexpr std::size_t lt_workspace_bytes = std::size_t{32} << 20;
  /// Its last bytes: the bias gradients' scratch (gemm_epilogue.cuh); the GEMMs get the rest.
  static constexpr std::size_t lt_tail_bytes = std::size_t{1} << 20;
  [[nodiscard]] cublasLtHandle_t cublaslt() const { return cublaslt_; }
  /// The cuBLASLt workspace on this context's device, made at the first call and kept (one
  /// allocation for the context's life, counted under MemTag::workspace).
  [[nodiscard]] void* lt_workspace() const {
    if (lt_workspace_ == nullptr) {
      void* p = Cuda::allocate(lt_workspace_bytes, device_);
      try {
        memory_->on_alloc(MemTag::workspace, lt_workspace_bytes);  // may throw: over the limit
      } catch (...) {
        Cuda::deallocate(p);
        throw;
      }
      lt_workspace_ = p;
      // the stream's work is ordered: GEMMs queued before this switch finish with the old pool
      cuda::check_cublas(cublasSetWorkspace(cublas_, p, lt_workspace_bytes - lt_tail_bytes),
                         "cublasSetWorkspace");
    }
    return lt_workspace_;
  }
  /// TF32 tensor cores for fp32 GEMMs (10-bit mantissa products, fp32 accumulation): off by
  /// default, so fp32 means fp32; 16-bit GEMMs are unaffected.
  void set_tf32(bool on) { tf32_ = on; }
  [[nodiscard]] bool tf32() const { return tf32_; }
  /// The attention layers' kernels in bf16 / fp16 (`cuda/attention_select.cuh`): the fused
  /// tensor-core flash kernels where they take the shape, else (and by default) the blockwise
  /// path on cuBLAS. fourway-train-cuda's `--attention fused`.
  void set_fused_attention(bool on) { fused_attention_ = on; }
  [[nodiscard]] bool fused_attention() const { return fused_attention_; }
  /// The attention layers' kernels in bf16 / fp16 from cuDNN's attention graph (the optional
  /// `fourway::cudnn` component, `cudnn/sdpa.cuh`) where cuDNN takes the shape; before the fused
  /// kernels. A unit compiled without the component refuses it at the first attention call.
  /// fourway-train-cuda's `--attention cudnn`.
  void set_cudnn_attention(bool on) { cudnn_attention_ = on; }
  [[nodiscard]] bool cudnn_attention() const { return cudnn_attention_; }
  /// Makes this context's device current for the calling thread.
  void activate() const { cuda::check_cuda(cudaSetDevice(device_), "cudaSetDevice"); }
  void synchronize(const char* call = "synchronize (cudaStreamSynchronize)") const {
    note_sync(call);
    cuda::check_cuda(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
  }
  /// Copies `bytes` (<= staging_bytes) from host memory to `dst` on the stream without waiting
  /// for it: the bytes go to the pinned staging buffer first (after the buffer's previous copy
  /// has run: a counted wait only when it has not), then cudaMemcpyAsync; the host buffer may be
  /// reused at once.
  void upload_staged(void* dst, const void* src, std::size_t bytes) const {
    if (staging_ == nullptr) {
      cuda::check_cuda(cudaMallocHost(&staging_, staging_bytes), "cudaMallocHost (staging)");
      cuda::check_cuda(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming),
                       "cudaEventCreate (staging)");
    } else if (cudaEventQuery(staged_) == cudaErrorNotReady) {
      note_sync("a staged upload waiting for its pinned buffer (cudaEventSynchronize)");
      cuda::check_cuda(cudaEventSynchronize(staged_), "cudaEventSynchronize (staging)");
    }
    std::memcpy(staging_, src, bytes);
    cuda::check_cuda(cudaMemcpyAsync(dst, staging_, bytes, cudaMemcpyHostToDevice, stream_.get()),
                     "cudaMemcpyAsync H2D (staged)");
    cuda::check_cuda(cudaEventRecord(staged_, stream_.get()), "cudaEventRecord (staging)");
  }

 private:
  MemoryAccountant* memory_;
  int device_;
  cuda::Stream stream_;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  mutable void* lt_workspace_ = nullptr;  // lt_workspace_bytes, made at the first epilogue GEMM
  bool tf32_ = false;
  bool fused_attention_ = false;
  bool cudnn_attention_ = false;
  mutable void* staging_ = nullptr;       // pinned, staging_bytes, made at the first upload
  mutable cudaEvent_t staged_ = nullptr;  // recorded after the staging buffer's last copy
};

namespace cuda {
namespace detail {
template <class T>
__global__ void fill_kernel(T* p, std::int64_t n, T value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}
}  // namespace detail

/// Device-to-device copy on the context's stream.
template <class T>
void copy(const Context<Cuda>& ctx, T* dst, const T* src, std::int64_t n) {
  if (n <= 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T),
                             cudaMemcpyDeviceToDevice, ctx.stream()),
             "cudaMemcpyAsync D2D");
}
/// Device -> host; returns once the data is on the host.
template <class T>
void to_host(const Context<Cuda>& ctx, T* dst, const T* src, std::int64_t n) {
  if (n <= 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T),
                             cudaMemcpyDeviceToHost, ctx.stream()),
             "cudaMemcpyAsync D2H");
  ctx.synchronize("to_host (cudaMemcpyAsync D2H, then the stream waited for)");
}
/// Host -> device; returns once the host buffer may be reused. Up to
/// `Context<Cuda>::staging_bytes`, staged through pinned memory without waiting for the stream;
/// larger copies wait (counted).
template <class T>
void from_host(const Context<Cuda>& ctx, T* dst, const T* src, std::int64_t n) {
  if (n <= 0) return;
  ctx.note_upload("from_host (a copy from host memory)");
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
  if (bytes <= Context<Cuda>::staging_bytes) {
    ctx.upload_staged(dst, src, bytes);
    return;
  }
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T),
                             cudaMemcpyHostToDevice, ctx.stream()),
             "cudaMemcpyAsync H2D");
  ctx.synchronize("from_host (a copy larger than the staging buffer, waited for)");
}
/// p[0, n) = value, on the context's stream.
template <class T>
void fill(const Context<Cuda>& ctx, T* p, std::int64_t n, T value) {
  if (n <= 0) return;
  const int threads = 256;
  const auto blocks = static_cast<int>(std::min<std::int64_t>((n + threads - 1) / threads, 65535));
  detail::fill_kernel<<<blocks, threads, 0, ctx.stream()>>>(p, n, value);
  check_cuda(cudaGetLastError(), "fill kernel launch");
}
}  // namespace cuda

}  // namespace fourway
