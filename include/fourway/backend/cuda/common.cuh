//! Building blocks of the CUDA kernels: element loads/stores in fp32, launch sizing, warp and
//! block reductions, and a deterministic column reduction.
//!
//! Every kernel computes in fp32 and touches 16-bit memory only through `load` / `store`
//! (round to nearest even, like the host conversions). Reductions never use floating-point
//! atomics: each sum has one fixed order, so a kernel gives bitwise the same result run after
//! run (the determinism law in docs/design.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway::cuda::detail {

template <class T>
__device__ __forceinline__ float load(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
  } else {
    return __half2float(*reinterpret_cast<const __half*>(p));
  }
}

template <class T>
__device__ __forceinline__ void store(T* p, float v) {
  if constexpr (std::is_same_v<T, float>) {
    *p = v;
  } else if constexpr (std::is_same_v<T, bf16>) {
    *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);
  } else {
    *reinterpret_cast<__half*>(p) = __float2half_rn(v);
  }
}

inline constexpr int block_threads = 256;

/// Blocks for one thread per element (at least 1, so an empty launch is never configured).
inline unsigned int blocks_for(std::int64_t n, int threads = block_threads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned int>(std::clamp<std::int64_t>(b, 1, 0x7fffffff));
}

/// Global index of this thread and the grid's stride, for grid-stride loops.
__device__ __forceinline__ std::int64_t thread_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_stride() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}

template <class V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, <= 1024) in a fixed order; every thread gets
/// the result. `shared` holds 32 values.
template <class V>
__device__ __forceinline__ V block_sum(V v, V* shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x / 32);
  v = lane < warps ? shared[lane] : V{0};
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x / 32);
  v = lane < warps ? shared[lane] : -3.4e38f;
  return warp_max(v);
}

/// Column sums of an implicit (rows, cols) matrix: `finish(c, sum_r value(r, c))`. A block owns
/// 32 columns; its 32 x 16 threads read rows y, y + 16, ... (coalesced along a row) and the 16
/// partial sums are added in a fixed order.
template <class Value, class Finish>
__global__ void column_sum_kernel(std::int64_t rows, std::int64_t cols, Value value,
                                  Finish finish) {
  __shared__ float part[16][33];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    for (std::int64_t r = threadIdx.y; r < rows; r += 16) s += value(r, c);
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int y = 0; y < 16; ++y) total += part[y][threadIdx.x];
    finish(c, total);
  }
}

template <class Value, class Finish>
void column_sum(const Context<Cuda>& ctx, std::int64_t rows, std::int64_t cols, Value value,
                Finish finish) {
  if (cols <= 0) return;
  const dim3 block(32, 16);
  const dim3 grid(blocks_for(cols, 32));
  column_sum_kernel<<<grid, block, 0, ctx.stream()>>>(rows, cols, value, finish);
  check_cuda(cudaGetLastError(), "column_sum kernel launch");
}

/// Launches `f(i)` for i in [0, n) on the context's stream (grid-stride, one element a thread).
template <class F>
__global__ void for_each_kernel(std::int64_t n, F f) {
  for (std::int64_t i = thread_index(); i < n; i += grid_stride()) f(i);
}
template <class F>
void for_each(const Context<Cuda>& ctx, std::int64_t n, F f, const char* what) {
  if (n <= 0) return;
  for_each_kernel<<<blocks_for(n), block_threads, 0, ctx.stream()>>>(n, f);
  check_cuda(cudaGetLastError(), what);
}

}  // namespace fourway::cuda::detail
