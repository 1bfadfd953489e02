//! Ring attention on CUDA: the algorithm of parallel/cp/ring_algorithm.hpp (its host form,
//! parallel/cp/ring_attention.hpp, is what CI tests against the unsplit attention) with cuBLAS's
//! strided-batched GEMMs (the blockwise attention's kernels: permutes, GEMM, row delta) and the
//! ring's row kernels below, one warp per row, fp32. The communicator must run on the compute's
//! stream (NcclComm::set_stream, LocalWorld's device comms): a pass posted before a step's
//! kernels and waited for after them is then ordered with them on the GPU.
//!
//! Scratch (the fp32 head-major q|k|v and dO, the statistics, a group's scores) is workspace of
//! the rank's accountant (MemTag::workspace), freed on return; the blocks in flight are
//! comm_buffers, as on the host.
// fourway-requires: cuda
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "fourway/backend/cuda/blockwise_attention.cuh"
#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/softmax.cuh"
#include "fourway/core/tensor.hpp"
#include "fourway/parallel/cp/balanced_split.hpp"
#include "fourway/parallel/cp/ring_algorithm.hpp"

namespace fourway::cp {

namespace detail {

/// One warp per row of `rows`: the row index, or -1 past the end.
__device__ __forceinline__ std::int64_t ring_row(std::int64_t rows) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * cuda::detail::softmax_warps +
                           static_cast<std::int64_t>(threadIdx.x) / 32;
  return row < rows ? row : -1;
}

__global__ void ring_merge_kernel(float* s, float* m, float* l, float* corr, std::int64_t rows,
                                  std::int64_t T, BalancedSplit queries, BalancedSplit keys) {
  const std::int64_t row = ring_row(rows);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t at = queries.position(row % T);
  float* sr = s + row * T;
  const float before = m[row];
  float mx = before;
  for (std::int64_t j = lane; j < T; j += 32)
    if (keys.position(j) <= at) mx = fmaxf(mx, sr[j]);
  mx = cuda::detail::warp_max(mx);
  if (mx == -INFINITY) {  // nothing visible in this block
    for (std::int64_t j = lane; j < T; j += 32) sr[j] = 0.0f;
    if (lane == 0) corr[row] = 1.0f;
    return;
  }
  float sum = 0.0f;
  for (std::int64_t j = lane; j < T; j += 32) {
    sr[j] = keys.position(j) <= at ? expf(sr[j] - mx) : 0.0f;
    sum += sr[j];
  }
  sum = cuda::detail::warp_sum(sum);
  if (lane == 0) {
    const float c = before == -INFINITY ? 0.0f : expf(before - mx);
    l[row] = l[row] * c + sum;
    m[row] = mx;
    corr[row] = c;
  }
}

__global__ void ring_probabilities_kernel(float* s, const float* lse, std::int64_t rows,
                                          std::int64_t T, BalancedSplit queries,
                                          BalancedSplit keys) {
  const std::int64_t row = ring_row(rows);
  if (row < 0) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t at = queries.position(row % T);
  float* sr = s + row * T;
  const float L = lse[row];
  for (std::int64_t j = lane; j < T; j += 32)
    sr[j] = keys.position(j) <= at ? expf(sr[j] - L) : 0.0f;
}

/// The CUDA kernels of the ring (parallel/cp/ring_algorithm.hpp).
struct CudaRingKernels : cuda::detail::CudaBlockKernels {
  static Tensor<float, Cuda> scratch(const Context<Cuda>& ctx, std::int64_t n) {
    return Tensor<float, Cuda>(Shape{n}, MemTag::workspace, ctx.memory());
  }
  template <class To, class From>
  static void convert(const Context<Cuda>& ctx, To* dst, const From* src, std::int64_t n) {
    cuda::detail::for_each(
        ctx, n,
        [=] __device__(std::int64_t i) {
          cuda::detail::store(dst + i, cuda::detail::load(src + i));
        },
        "ring attention convert launch");
  }
  static void fill(const Context<Cuda>& ctx, float* p, std::int64_t n, float value) {
    cuda::detail::for_each(
        ctx, n, [=] __device__(std::int64_t i) { p[i] = value; }, "ring attention fill launch");
  }
  static void merge(const Context<Cuda>& ctx, float* s, float* m, float* l, float* corr,
                    std::int64_t rows, std::int64_t T, const BalancedSplit& queries,
                    const BalancedSplit& keys) {
    ring_merge_kernel<<<cuda::detail::blocks_for(rows, cuda::detail::softmax_warps),
                        cuda::detail::softmax_warps * 32, 0, ctx.stream()>>>(s, m, l, corr, rows, T,
                                                                             queries, keys);
    cuda::check_cuda(cudaGetLastError(), "ring attention merge launch");
  }
  static void scale_rows(const Context<Cuda>& ctx, float* acc, const float* corr, std::int64_t rows,
                         std::int64_t hs) {
    cuda::detail::for_each(
        ctx, rows * hs, [=] __device__(std::int64_t i) { acc[i] *= corr[i / hs]; },
        "ring attention rescale launch");
  }
  static void finish(const Context<Cuda>& ctx, float* acc, float* lse, const float* m,
                     const float* l, std::int64_t rows, std::int64_t hs) {
    cuda::detail::for_each(
        ctx, rows * hs,
        [=] __device__(std::int64_t i) {
          const std::int64_t row = i / hs;
          acc[i] *= 1.0f / l[row];
          if (i % hs == 0) lse[row] = m[row] + logf(l[row]);
        },
        "ring attention finish launch");
  }
  static void probabilities(const Context<Cuda>& ctx, float* s, const float* lse, std::int64_t rows,
                            std::int64_t T, const BalancedSplit& queries,
                            const BalancedSplit& keys) {
    ring_probabilities_kernel<<<cuda::detail::blocks_for(rows, cuda::detail::softmax_warps),
                                cuda::detail::softmax_warps * 32, 0, ctx.stream()>>>(
        s, lse, rows, T, queries, keys);
    cuda::check_cuda(cudaGetLastError(), "ring attention probabilities launch");
  }
  static void score_grads(const Context<Cuda>& ctx, const float* p, float* dp, const float* delta,
                          std::int64_t rows, std::int64_t T) {
    cuda::detail::for_each(
        ctx, rows * T, [=] __device__(std::int64_t i) { dp[i] = p[i] * (dp[i] - delta[i / T]); },
        "ring attention score gradient launch");
  }
};

}  // namespace detail

/// CUDA's kernels for `ring_attention_forward` / `ring_attention_backward`
/// (parallel/cp/ring_algorithm.hpp) on a `Context<Cuda>`.
template <>
struct ring::Kernels<Cuda> : detail::CudaRingKernels {};

}  // namespace fourway::cp
