//! CUDA causal attention by query blocks on cuBLAS — what `flash_attention_forward` /
//! `flash_attention_backward` run on a GPU (the Ops entry points of the attention layers): the
//! algorithm of `backend/blockwise_attention.hpp` (written once, its host form tested in CI
//! against the host flash twin) with cuBLAS's strided-batched GEMMs and the element kernels here.
//!
//! The tiled kernels of `flash_attention.cuh` (the twin of the host's tiled online softmax) do
//! their dot products on CUDA cores from shared memory: the first GPU run measured them at about
//! 2 TFLOP/s, 22 ms for one GPT-2 layer's attention at B = 8, T = 1024, against 0.8 ms for the
//! materialised kernels. This path keeps their O(T) stash and puts the products on cuBLAS; in
//! 16-bit types all seven run on the tensor cores (P and dS rounded to the element type).
// fourway-requires: cuda
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>

#include "fourway/backend/blockwise_attention.hpp"
#include "fourway/backend/blockwise_plan.hpp"
#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/flash_attention.cuh"
#include "fourway/backend/cuda/gemm.cuh"
#include "fourway/backend/cuda/softmax.cuh"
#include "fourway/core/tensor.hpp"

namespace fourway::cuda {

namespace detail {

/// Row `row` = (j, r) of a block whose first query is `first`, j = sequence · NH + head of the
/// group: p[row, :t + 1) becomes the softmax of the (already scaled) fp32 scores s[row, :t + 1),
/// p[row, t + 1:e) zero, lse[j · T + t] its log-sum-exp (t = first + r). p may be s (fp32).
template <class E>
__global__ void block_softmax_kernel(const float* s, E* p, float* lse, std::int64_t rows, int rc,
                                     int e, int first, int T) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * softmax_warps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  const std::int64_t j = row / rc;
  const int t = first + static_cast<int>(row % rc);
  const float* x = s + row * e;
  E* y = p + row * e;
  float mx = -INFINITY;
  for (int c = lane; c <= t; c += 32) mx = fmaxf(mx, x[c]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int c = lane; c <= t; c += 32) sum += expf(x[c] - mx);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int c = lane; c <= t; c += 32) store(y + c, expf(x[c] - mx) * inv);
  for (int c = t + 1 + lane; c < e; c += 32) store(y + c, 0.0f);
  if (lane == 0) lse[j * T + t] = mx + logf(sum);
}

/// The backward's element pass over a block: P = exp(s − L) up to the diagonal and zero past it
/// into p, dS = P ∘ (dP − D) into ds (P in fp32 here; each rounded to E once). p may be s and
/// ds may be dp (fp32): every element is read before it is written, by the same thread.
template <class E>
__global__ void block_softmax_grad_kernel(const float* s, const float* dp, E* p, E* ds,
                                          const float* lse, const float* delta, std::int64_t rows,
                                          int rc, int e, int first, int T) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * softmax_warps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  const std::int64_t at = (row / rc) * T + first + row % rc;  // (j, t)
  const int t = first + static_cast<int>(row % rc);
  const float L = lse[at];
  const float D = delta[at];
  const std::int64_t o = row * e;
  for (int c = lane; c < e; c += 32) {
    const float sv = s[o + c];
    const float g = dp[o + c];
    const float pv = c <= t ? expf(sv - L) : 0.0f;
    store(p + o + c, pv);
    store(ds + o + c, pv * (g - D));
  }
}

/// Token-major ↔ head-major (`blockwise::head_major_at`): `to_heads` reads the first and writes
/// the second, else the reverse; each element converted through fp32 once (exact for one type).
template <class To, class From>
void permute_heads(const Context<Cuda>& ctx, To* dst, const From* src, std::int64_t nb,
                   std::int64_t T, std::int64_t parts, std::int64_t C, std::int64_t hs,
                   bool to_heads) {
  for_each(
      ctx, nb * T * parts * C,
      [=] __device__(std::int64_t i) {
        const std::int64_t at = blockwise::head_major_at(i, nb, T, parts, C, hs);
        if (to_heads) {
          store(dst + at, load(src + i));
        } else {
          store(dst + i, load(src + at));
        }
      },
      "blockwise attention head permute launch");
}

inline unsigned block_rows_grid(std::int64_t rows) { return blocks_for(rows, softmax_warps); }

/// The CUDA kernels of the blockwise algorithm (`backend/blockwise_attention.hpp`).
struct CudaBlockKernels {
  using Backend = Cuda;
  template <class... Args>
  static void gemm_strided_batched(Args&&... args) {
    cuda::gemm_strided_batched(std::forward<Args>(args)...);
  }
  template <class To, class From>
  static void permute_heads(const Context<Cuda>& ctx, To* dst, const From* src, std::int64_t nb,
                            std::int64_t T, std::int64_t parts, std::int64_t C, std::int64_t hs,
                            bool to_heads) {
    detail::permute_heads(ctx, dst, src, nb, T, parts, C, hs, to_heads);
  }
  template <class E>
  static void block_softmax(const Context<Cuda>& ctx, const float* s, E* p, float* lse,
                            std::int64_t rows, std::int64_t rc, std::int64_t e, std::int64_t first,
                            std::int64_t T) {
    block_softmax_kernel<E><<<block_rows_grid(rows), softmax_warps * 32, 0, ctx.stream()>>>(
        s, p, lse, rows, static_cast<int>(rc), static_cast<int>(e), static_cast<int>(first),
        static_cast<int>(T));
    check_cuda(cudaGetLastError(), "blockwise attention softmax launch");
  }
  template <class E>
  static void block_softmax_grad(const Context<Cuda>& ctx, const float* s, const float* dp, E* p,
                                 E* ds, const float* lse, const float* delta, std::int64_t rows,
                                 std::int64_t rc, std::int64_t e, std::int64_t first,
                                 std::int64_t T) {
    block_softmax_grad_kernel<E><<<block_rows_grid(rows), softmax_warps * 32, 0, ctx.stream()>>>(
        s, dp, p, ds, lse, delta, rows, static_cast<int>(rc), static_cast<int>(e),
        static_cast<int>(first), static_cast<int>(T));
    check_cuda(cudaGetLastError(), "blockwise attention gradient launch");
  }
  template <class E>
  static void row_delta(const Context<Cuda>& ctx, float* delta, const E* dout, const E* out,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
    const std::int64_t hs = C / NH;
    const FlashShape f{static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH),
                       static_cast<int>(hs), 1.0f / std::sqrt(static_cast<float>(hs))};
    launch_flash_delta(ctx, delta, dout, out, B, f);
  }
  static void zero(const Context<Cuda>& ctx, float* p, std::int64_t n) {
    check_cuda(cudaMemsetAsync(p, 0, static_cast<std::size_t>(n) * sizeof(float), ctx.stream()),
               "blockwise attention: clearing the gradient");
  }
};

}  // namespace detail

/// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); causal, scale 1/sqrt(hs); at most
/// `chunk` query rows per block and `budget` fp32 scores per block (`blockwise_plan`).
template <floating_dtype E>
void blockwise_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                                 std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                                 std::int64_t chunk = attention_query_chunk,
                                 std::int64_t budget = attention_score_budget) {
  blockwise::forward<detail::CudaBlockKernels>(ctx, out, lse, qkv, B, T, C, NH, chunk, budget);
}

/// dqkv (B, T, 3C) (`=`); `delta` (B, NH, T) is scratch and ends holding rowsum(dO ∘ O).
template <floating_dtype E>
void blockwise_attention_backward(const Context<Cuda>& ctx, E* dqkv, float* delta, const E* dout,
                                  const E* qkv, const E* out, const float* lse, std::int64_t B,
                                  std::int64_t T, std::int64_t C, std::int64_t NH,
                                  std::int64_t chunk = attention_query_chunk,
                                  std::int64_t budget = attention_score_budget) {
  blockwise::backward<detail::CudaBlockKernels>(ctx, dqkv, delta, dout, qkv, out, lse, B, T, C, NH,
                                                chunk, budget);
}

/// The attention layers' entry points on a GPU: the blockwise path above.
template <floating_dtype E>
void flash_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  blockwise_attention_forward(ctx, out, lse, qkv, B, T, C, NH);
}
template <floating_dtype E>
void flash_attention_backward(const Context<Cuda>& ctx, E* dqkv, float* delta, const E* dout,
                              const E* qkv, const E* out, const float* lse, std::int64_t B,
                              std::int64_t T, std::int64_t C, std::int64_t NH) {
  blockwise_attention_backward(ctx, dqkv, delta, dout, qkv, out, lse, B, T, C, NH);
}

}  // namespace fourway::cuda
