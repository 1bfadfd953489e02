//! Building blocks of the CUDA kernels: element loads/stores in fp32, launch sizing, warp and
//! block reductions, a deterministic column reduction at full occupancy, and elementwise maps
//! that move 128 bits per load and store.
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
#include <utility>

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"

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

/// Column sums of an implicit (rows, cols) matrix: `finish(c, sum_r value(r, c))`, deterministic
/// and at full occupancy. A block owns 32 columns of one slice of `column_sum_rows` rows; its
/// 32 x 16 threads read rows y, y + 16, ... of the slice (coalesced along a row) and add their 16
/// partial sums in a fixed order. One slice (rows <= column_sum_rows) finishes in that block;
/// otherwise each slice writes its sums to a workspace and a second kernel adds the slices in
/// order. The slices are a function of the shape alone, so the sum is the same run after run
/// and on every GPU; a (B·T = 8192, C = 768) sum runs 16 x 24 = 384 blocks instead of 24.
inline constexpr std::int64_t column_sum_rows = 512;

template <class Value>
__device__ __forceinline__ float column_slice_sum(std::int64_t r0, std::int64_t r1, std::int64_t c,
                                                  std::int64_t cols, Value& value,
                                                  float (*part)[33]) {
  float s = 0.0f;
  if (c < cols) {
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += 16) s += value(r, c);
  }
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.y == 0) {
    for (int y = 0; y < 16; ++y) total += part[y][threadIdx.x];
  }
  return total;
}

template <class Value, class Finish>
__global__ void column_sum_kernel(std::int64_t rows, std::int64_t cols, Value value, Finish finish,
                                  float* slices) {
  __shared__ float part[16][33];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * column_sum_rows;
  const std::int64_t r1 = std::min(rows, r0 + column_sum_rows);
  const float total = column_slice_sum(r0, r1, c, cols, value, part);
  if (threadIdx.y != 0 || c >= cols) return;
  if (slices == nullptr) {
    finish(c, total);
  } else {
    slices[static_cast<std::int64_t>(blockIdx.y) * cols + c] = total;
  }
}

template <class Finish>
__global__ void column_slices_kernel(std::int64_t slices_n, std::int64_t cols, const float* slices,
                                     Finish finish) {
  for (std::int64_t c = thread_index(); c < cols; c += grid_stride()) {
    float total = 0.0f;
    for (std::int64_t s = 0; s < slices_n; ++s) total += slices[s * cols + c];
    finish(c, total);
  }
}

template <class Value, class Finish>
void column_sum(const Context<Cuda>& ctx, std::int64_t rows, std::int64_t cols, Value value,
                Finish finish) {
  if (cols <= 0) return;
  const std::int64_t slices =
      std::max<std::int64_t>(1, (rows + column_sum_rows - 1) / column_sum_rows);
  check<ShapeError>(slices <= 65535, "fourway: column_sum over ", rows, " rows needs ", slices,
                    " slices of ", column_sum_rows, "; the grid holds 65535");
  const dim3 block(32, 16);
  const dim3 grid(blocks_for(cols, 32), static_cast<unsigned int>(slices));
  if (slices == 1) {
    column_sum_kernel<<<grid, block, 0, ctx.stream()>>>(rows, cols, value, finish, nullptr);
    check_cuda(cudaGetLastError(), "column_sum kernel launch");
    return;
  }
  Tensor<float, Cuda> partial(Shape{slices * cols}, MemTag::workspace, ctx.memory());
  column_sum_kernel<<<grid, block, 0, ctx.stream()>>>(rows, cols, value, finish, partial.data());
  check_cuda(cudaGetLastError(), "column_sum kernel launch");
  column_slices_kernel<<<blocks_for(cols), block_threads, 0, ctx.stream()>>>(
      slices, cols, partial.data(), finish);
  check_cuda(cudaGetLastError(), "column_sum slices kernel launch");
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

/// V consecutive elements of T, loaded and stored as one access (V · sizeof(T) bytes; past 16, as
/// several 16-byte instructions).
template <class T, int V>
struct alignas(sizeof(T) * V) Run {
  static constexpr int size = V;
  T v[V];
};

/// 128 bits of T: 4 fp32 or 8 bf16 / fp16 elements, loaded and stored as one 16-byte access.
template <class T>
using Pack = Run<T, 16 / static_cast<int>(sizeof(T))>;

template <class T>
bool aligned16(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

template <class T, class F, std::size_t... I>
__device__ __forceinline__ float map_at(F& f, std::int64_t i, const Pack<T> (&in)[sizeof...(I)],
                                        int j, std::index_sequence<I...> /*inputs*/) {
  return f(i, load(&in[I].v[j])...);
}

/// `out[i] = f(i, in[i]...)` a pack at a time: each thread loads one 16-byte pack of every input,
/// stores one of the output; the last n mod pack elements one a thread.
template <class T, class F, class... In>
__global__ void map_packed_kernel(std::int64_t n, T* out, F f, const In*... in) {
  constexpr int V = Pack<T>::size;
  const std::int64_t packs = n / V;
  for (std::int64_t p = thread_index(); p < packs; p += grid_stride()) {
    const std::int64_t i = p * V;
    const Pack<T> x[sizeof...(In)] = {*reinterpret_cast<const Pack<T>*>(in + i)...};
    Pack<T> y;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      store(&y.v[j], map_at<T>(f, i + j, x, j, std::index_sequence_for<In...>{}));
    }
    *reinterpret_cast<Pack<T>*>(out + i) = y;
  }
  const std::int64_t t = packs * V + thread_index();
  if (t < n) store(out + t, f(t, load(in + t)...));
}

/// The same map one element a thread, for pointers not on a 16-byte boundary.
template <class T, class F, class... In>
__global__ void map_scalar_kernel(std::int64_t n, T* out, F f, const In*... in) {
  for (std::int64_t i = thread_index(); i < n; i += grid_stride())
    store(out + i, f(i, load(in + i)...));
}

/// Elementwise `out[i] = f(i, in[i]...)` over n elements of T (every input a T; `out` may be one
/// of them), f computing in fp32. When every pointer sits on a 16-byte boundary (what the
/// allocator returns) each thread moves 128 bits per load and store; otherwise one element.
template <floating_dtype T, class F, class... In>
void map(const Context<Cuda>& ctx, std::int64_t n, F f, const char* what, T* out, const In*... in) {
  static_assert(sizeof...(In) >= 1 && (std::is_same_v<In, T> && ...),
                "fourway: map takes one or more inputs of the output's element type");
  if (n <= 0) return;
  if (aligned16(out) && (aligned16(in) && ...)) {
    const std::int64_t packs = std::max<std::int64_t>(n / Pack<T>::size, 1);
    map_packed_kernel<<<blocks_for(packs), block_threads, 0, ctx.stream()>>>(n, out, f, in...);
  } else {
    map_scalar_kernel<<<blocks_for(n), block_threads, 0, ctx.stream()>>>(n, out, f, in...);
  }
  check_cuda(cudaGetLastError(), what);
}

}  // namespace fourway::cuda::detail
