//! CUDA causal attention by query blocks on cuBLAS — what `flash_attention_forward` /
//! `flash_attention_backward` run on a GPU (the Ops entry points of the attention layers).
//!
//! The tiled kernels of `flash_attention.cuh` (the twin of the host's tiled online softmax) do
//! their dot products on CUDA cores from shared memory: the first GPU run measured them at about
//! 2 TFLOP/s, 22 ms for one GPT-2 layer's attention at B = 8, T = 1024, against 0.8 ms for the
//! materialised kernels. This path keeps what makes attention flash-style — the stash is the
//! output and one fp32 log-sum-exp per row, O(T) per head; the backward recomputes the
//! probabilities; blocks above the diagonal are never computed — and runs the products as
//! strided-batched GEMMs over the heads:
//!
//!   per batch b, per block of `chunk` query rows [i0, i0 + rc), keys [0, e = i0 + rc):
//!   forward   S = Q Kᵀ/√hs (rc × e), P = causal softmax(S) with its log-sum-exp, O = P V
//!   backward  S again, dP = dO Vᵀ, P = exp(S − L) (causal), dS = P ∘ (dP − D),
//!             dV += Pᵀ dO, dQ = dS K/√hs, dK += dSᵀ Q/√hs      (D = rowsum(dO ∘ O))
//!
//! Everything inside is fp32: the two products of stored values (Q·Kᵀ, dO·Vᵀ) take q|k|v and dO
//! as stored (16-bit products are exact in fp32; cuBLAS accumulates in fp32, on the tensor cores),
//! the other five multiply fp32 P or dS by fp32 copies of q|k|v and dO made once per sequence
//! (fp32 GEMMs, no TF32, as the context's cuBLAS handle is set); the outputs are rounded to E
//! once, as the tiled kernels and the host twin do; the sums run in one fixed order, so the
//! result is the same run after run. Transient workspace (MemTag::workspace, freed on return):
//! (3C + C) · T floats forward plus NH · min(chunk, T) · T for the scores; backward 2 · 3C · T +
//! C · T plus twice the scores — about 47 MB at GPT-2 small's T = 1024, chunk 256.
// fourway-requires: cuda
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/elementwise.cuh"
#include "fourway/backend/cuda/flash_attention.cuh"
#include "fourway/backend/cuda/gemm.cuh"
#include "fourway/backend/cuda/softmax.cuh"
#include "fourway/core/tensor.hpp"

namespace fourway::cuda {

/// Query rows per block of the blockwise attention (the scores of one block are NH · chunk · T).
inline constexpr std::int64_t attention_query_chunk = 256;

namespace detail {

/// Row `row` = (h, r) of a block whose first query is `first`: s[row, :t + 1) becomes the softmax
/// of the (already scaled) scores, s[row, t + 1:e) zero, lse[h · T + t] its log-sum-exp
/// (t = first + r).
__global__ inline void block_softmax_kernel(float* s, float* lse, std::int64_t rows, int rc, int e,
                                            int first, int T) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * softmax_warps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  const int h = static_cast<int>(row / rc);
  const int t = first + static_cast<int>(row % rc);
  float* x = s + row * e;
  float mx = -INFINITY;
  for (int c = lane; c <= t; c += 32) mx = fmaxf(mx, x[c]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int c = lane; c <= t; c += 32) sum += expf(x[c] - mx);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int c = lane; c <= t; c += 32) x[c] = expf(x[c] - mx) * inv;
  for (int c = t + 1 + lane; c < e; c += 32) x[c] = 0.0f;
  if (lane == 0) lse[static_cast<std::int64_t>(h) * T + t] = mx + logf(sum);
}

/// The backward's element pass over a block: s (scaled scores) becomes P = exp(s − L) up to the
/// diagonal and zero past it; dp becomes dS = P ∘ (dP − D).
__global__ inline void block_softmax_grad_kernel(float* s, float* dp, const float* lse,
                                                 const float* delta, std::int64_t rows, int rc,
                                                 int e, int first, int T) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * softmax_warps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  const std::int64_t at = (row / rc) * T + first + row % rc;  // (h, t)
  const int t = first + static_cast<int>(row % rc);
  const float L = lse[at];
  const float D = delta[at];
  float* x = s + row * e;
  float* g = dp + row * e;
  for (int c = lane; c < e; c += 32) {
    const float p = c <= t ? expf(x[c] - L) : 0.0f;
    x[c] = p;
    g[c] = p * (g[c] - D);
  }
}

struct BlockPlan {
  std::int64_t hs, qc;  // head size, query rows per block
  float scale;
};

inline BlockPlan block_plan(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                            std::int64_t chunk) {
  check<ShapeError>(chunk > 0, "fourway: blockwise attention needs a query chunk > 0, got ", chunk);
  check<ShapeError>(B >= 0 && T >= 0 && T <= 0x7fffffff / 4, "fourway: blockwise attention: B=", B,
                    ", T=", T, " out of range");
  const std::int64_t hs = host::detail::head_size(C, NH);
  return {hs, std::min(chunk, std::max<std::int64_t>(T, 1)),
          1.0f / std::sqrt(static_cast<float>(hs))};
}

/// S (NH blocks of rc × e, compact, fp32) = scale · Q[i0, i0 + rc) K[0, e)ᵀ of one sequence's
/// q|k|v (T × 3C) as stored: in 16 bits the products are exact in fp32 and cuBLAS accumulates
/// them in fp32 on the tensor cores, so this is the fp32 result in another summation order.
template <class E>
void block_scores(const Context<Cuda>& ctx, float* s, const E* x, std::int64_t i0, std::int64_t rc,
                  std::int64_t e, std::int64_t C, std::int64_t NH, const BlockPlan& p) {
  gemm_strided_batched(ctx, Trans::none, Trans::transpose, rc, e, p.hs, p.scale, x + i0 * 3 * C,
                       3 * C, p.hs, x + C, 3 * C, p.hs, 0.0f, s, e, rc * e, NH);
}

inline unsigned block_rows_grid(std::int64_t rows) { return blocks_for(rows, softmax_warps); }

}  // namespace detail

/// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); causal, scale 1/sqrt(hs); `chunk` query
/// rows per block.
template <floating_dtype E>
void blockwise_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                                 std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                                 std::int64_t chunk = attention_query_chunk) {
  const detail::BlockPlan p = detail::block_plan(B, T, C, NH, chunk);
  if (B * T == 0) return;
  Tensor<float, Cuda> x({T * 3 * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> o({T * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> s({NH * p.qc * T}, MemTag::workspace, ctx.memory());
  for (std::int64_t b = 0; b < B; ++b) {
    cast(ctx, x.data(), qkv + b * T * 3 * C, T * 3 * C);
    for (std::int64_t i0 = 0; i0 < T; i0 += p.qc) {
      const std::int64_t rc = std::min(p.qc, T - i0), e = i0 + rc;
      detail::block_scores(ctx, s.data(), qkv + b * T * 3 * C, i0, rc, e, C, NH, p);
      detail::block_softmax_kernel<<<detail::block_rows_grid(NH * rc), detail::softmax_warps * 32,
                                     0, ctx.stream()>>>(s.data(), lse + b * NH * T, NH * rc,
                                                        static_cast<int>(rc), static_cast<int>(e),
                                                        static_cast<int>(i0), static_cast<int>(T));
      check_cuda(cudaGetLastError(), "blockwise attention softmax launch");
      gemm_strided_batched(ctx, Trans::none, Trans::none, rc, p.hs, e, 1.0f, s.data(), e, rc * e,
                           x.data() + 2 * C, 3 * C, p.hs, 0.0f, o.data() + i0 * C, C, p.hs, NH);
    }
    cast(ctx, out + b * T * C, o.data(), T * C);
  }
}

/// dqkv (B, T, 3C) (`=`); `delta` (B, NH, T) is scratch and ends holding rowsum(dO ∘ O).
template <floating_dtype E>
void blockwise_attention_backward(const Context<Cuda>& ctx, E* dqkv, float* delta, const E* dout,
                                  const E* qkv, const E* out, const float* lse, std::int64_t B,
                                  std::int64_t T, std::int64_t C, std::int64_t NH,
                                  std::int64_t chunk = attention_query_chunk) {
  const detail::BlockPlan p = detail::block_plan(B, T, C, NH, chunk);
  if (B * T == 0) return;
  const detail::FlashShape f{static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH),
                             static_cast<int>(p.hs), p.scale};
  detail::launch_flash_delta(ctx, delta, dout, out, B, f);
  Tensor<float, Cuda> x({T * 3 * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> g({T * 3 * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> dy({T * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> s({NH * p.qc * T}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> dp({NH * p.qc * T}, MemTag::workspace, ctx.memory());
  const Trans N = Trans::none, Tr = Trans::transpose;
  for (std::int64_t b = 0; b < B; ++b) {
    cast(ctx, x.data(), qkv + b * T * 3 * C, T * 3 * C);
    cast(ctx, dy.data(), dout + b * T * C, T * C);
    check_cuda(cudaMemsetAsync(g.data(), 0, static_cast<std::size_t>(T * 3 * C) * sizeof(float),
                               ctx.stream()),
               "blockwise attention: clearing the gradient");
    const float* q = x.data();
    const float* k = q + C;
    const E* x16 = qkv + b * T * 3 * C;  // as stored: for the two products of stored values
    for (std::int64_t i0 = 0; i0 < T; i0 += p.qc) {
      const std::int64_t rc = std::min(p.qc, T - i0), e = i0 + rc, blk = rc * e;
      const float* dyb = dy.data() + i0 * C;
      detail::block_scores(ctx, s.data(), x16, i0, rc, e, C, NH, p);
      gemm_strided_batched(ctx, N, Tr, rc, e, p.hs, 1.0f, dout + (b * T + i0) * C, C, p.hs,
                           x16 + 2 * C, 3 * C, p.hs, 0.0f, dp.data(), e, blk, NH);  // dP = dO Vᵀ
      detail::block_softmax_grad_kernel<<<detail::block_rows_grid(NH * rc),
                                          detail::softmax_warps * 32, 0, ctx.stream()>>>(
          s.data(), dp.data(), lse + b * NH * T, delta + b * NH * T, NH * rc, static_cast<int>(rc),
          static_cast<int>(e), static_cast<int>(i0), static_cast<int>(T));
      check_cuda(cudaGetLastError(), "blockwise attention gradient launch");
      // dV[0, e) += Pᵀ dO;  dQ[i0, i0 + rc) = scale · dS K;  dK[0, e) += scale · dSᵀ Q
      gemm_strided_batched(ctx, Tr, N, e, p.hs, rc, 1.0f, s.data(), e, blk, dyb, C, p.hs, 1.0f,
                           g.data() + 2 * C, 3 * C, p.hs, NH);
      gemm_strided_batched(ctx, N, N, rc, p.hs, e, p.scale, dp.data(), e, blk, k, 3 * C, p.hs, 0.0f,
                           g.data() + i0 * 3 * C, 3 * C, p.hs, NH);
      gemm_strided_batched(ctx, Tr, N, e, p.hs, rc, p.scale, dp.data(), e, blk, q + i0 * 3 * C,
                           3 * C, p.hs, 1.0f, g.data() + C, 3 * C, p.hs, NH);
    }
    cast(ctx, dqkv + b * T * 3 * C, g.data(), T * 3 * C);
  }
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
