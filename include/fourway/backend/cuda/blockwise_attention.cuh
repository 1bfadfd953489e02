//! CUDA causal attention by query blocks on cuBLAS — what `flash_attention_forward` /
//! `flash_attention_backward` run on a GPU (the Ops entry points of the attention layers).
//!
//! The tiled kernels of `flash_attention.cuh` (the twin of the host's tiled online softmax) do
//! their dot products on CUDA cores from shared memory: the first GPU run measured them at about
//! 2 TFLOP/s, 22 ms for one GPT-2 layer's attention at B = 8, T = 1024, against 0.8 ms for the
//! materialised kernels. This path keeps what makes attention flash-style — the stash is the
//! output and one fp32 log-sum-exp per row, O(T) per head; the backward recomputes the
//! probabilities; blocks above the diagonal are never computed — and runs the products as
//! strided-batched GEMMs, one launch per product over every head of every sequence of a group.
//! For that one stride has to reach every (sequence, head), so q|k|v and dO are first copied
//! head-major, (NH, T, hs) per sequence (as llm.c and PyTorch permute them), and the output and
//! the gradient copied back:
//!
//!   per block of `rows` query rows [i0, i0 + rc), keys [0, e = i0 + rc), all (sequence, head):
//!   forward   S = Q Kᵀ/√hs (rc × e), P = causal softmax(S) with its log-sum-exp, O = P V
//!   backward  S again, dP = dO Vᵀ, P = exp(S − L) (causal), dS = P ∘ (dP − D),
//!             dV += Pᵀ dO, dQ = dS K/√hs, dK += dSᵀ Q/√hs      (D = rowsum(dO ∘ O))
//!
//! The cut into blocks and groups of sequences is `blockwise_plan` (`backend/blockwise_plan.hpp`,
//! host code): one block's fp32 scores stay within `attention_score_budget`.
//!
//! Precision: every product takes its operands in E — q|k|v and dO as stored, P and dS rounded to
//! E once (in 16-bit types the rounding FlashAttention-2 and the materialised kernels make; in
//! fp32 no rounding at all) — and accumulates in fp32 (on the tensor cores for 16-bit E; fp32
//! GEMMs, no TF32 unless the context enables it, for fp32). The scores, the softmax, its
//! log-sum-exp, dP and D are fp32; dQ, dK and dV accumulate in fp32 across the blocks and are
//! rounded to E once, as the output is. Every sum runs in one fixed order, so the result is the
//! same run after run. Transient workspace (MemTag::workspace, freed on return), per group of
//! `sequences`: forward the head-major q|k|v and output (4 · group · T · C of E), the scores
//! (fp32) and for 16-bit E P (E); backward the head-major q|k|v and dO (E), the fp32 gradient
//! (3 · group · T · C), the scores and dP (fp32), and for 16-bit E P and dS (E).
// fourway-requires: cuda
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fourway/backend/blockwise_plan.hpp"
#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/elementwise.cuh"
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

/// Between the token-major layout (nb, T, parts·C) — q|k|v (parts = 3) or dO / O (parts = 1) as
/// the layers store them — and the head-major one (parts, nb, NH, T, hs) the batched GEMMs take
/// with one stride: `to_heads` reads the first and writes the second, else the reverse; each
/// element converted through fp32 once (exact for the same type).
template <class To, class From>
void permute_heads(const Context<Cuda>& ctx, To* dst, const From* src, std::int64_t nb,
                   std::int64_t T, std::int64_t parts, std::int64_t C, std::int64_t hs,
                   bool to_heads) {
  const std::int64_t NH = C / hs, width = parts * C;
  for_each(
      ctx, nb * T * width,
      [=] __device__(std::int64_t i) {
        const std::int64_t b = i / (T * width), r = i % (T * width), t = r / width, c = r % width;
        const std::int64_t p = c / C, h = (c % C) / hs, d = c % hs;
        const std::int64_t at = (((p * nb + b) * NH + h) * T + t) * hs + d;
        if (to_heads) {
          store(dst + at, load(src + i));
        } else {
          store(dst + i, load(src + at));
        }
      },
      "blockwise attention head permute launch");
}

/// Head size, scale and the plan of one call; refuses sizes the kernels' 32-bit indices miss.
struct BlockCall {
  std::int64_t hs;
  float scale;
  BlockwisePlan plan;
};

inline BlockCall block_call(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                            std::int64_t chunk, std::int64_t budget) {
  check<ShapeError>(T <= INT_MAX / 4, "fourway: blockwise attention: T=", T, " exceeds ",
                    INT_MAX / 4);
  const std::int64_t hs = host::detail::head_size(C, NH);
  const BlockwisePlan plan = blockwise_plan(B, T, NH, chunk, budget);
  check<ShapeError>(plan.sequences * NH <= INT_MAX,
                    "fourway: blockwise attention: ", plan.sequences, " sequences x ", NH,
                    " heads exceed one launch's 32-bit batch");
  return {hs, 1.0f / std::sqrt(static_cast<float>(hs)), plan};
}

inline unsigned block_rows_grid(std::int64_t rows) { return blocks_for(rows, softmax_warps); }

/// A 16-bit E buffer for P or dS beside an fp32 one, or the fp32 one itself when E is float.
template <class E>
E* rounded_buffer(Tensor<E, Cuda>& own, Tensor<float, Cuda>& fp32, const Context<Cuda>& ctx) {
  if constexpr (std::is_same_v<E, float>) {
    (void)ctx;
    (void)own;
    return fp32.data();
  } else {
    own = Tensor<E, Cuda>({fp32.numel()}, MemTag::workspace, ctx.memory());
    return own.data();
  }
}

}  // namespace detail

/// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); causal, scale 1/sqrt(hs); at most
/// `chunk` query rows per block and `budget` fp32 scores per block (`blockwise_plan`).
template <floating_dtype E>
void blockwise_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                                 std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                                 std::int64_t chunk = attention_query_chunk,
                                 std::int64_t budget = attention_score_budget) {
  const detail::BlockCall call = detail::block_call(B, T, C, NH, chunk, budget);
  if (B * T == 0) return;
  const std::int64_t hs = call.hs, group = call.plan.sequences, head = T * hs;
  Tensor<E, Cuda> xh({3 * group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<E, Cuda> oh({group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> s({call.plan.scores(T, NH)}, MemTag::workspace, ctx.memory());
  Tensor<E, Cuda> p_own;
  E* p = detail::rounded_buffer(p_own, s, ctx);
  const Trans N = Trans::none, Tr = Trans::transpose;
  for (std::int64_t b0 = 0; b0 < B; b0 += group) {
    const std::int64_t nb = std::min(group, B - b0), n = nb * NH;
    detail::permute_heads(ctx, xh.data(), qkv + b0 * T * 3 * C, nb, T, 3, C, hs, true);
    const E* q = xh.data();  // (n, T, hs) each, head after head
    const E* k = q + nb * T * C;
    const E* v = k + nb * T * C;
    for (std::int64_t i0 = 0; i0 < T; i0 += call.plan.rows) {
      const std::int64_t rc = std::min(call.plan.rows, T - i0), e = i0 + rc, blk = rc * e;
      gemm_strided_batched(ctx, N, Tr, rc, e, hs, call.scale, q + i0 * hs, hs, head, k, hs, head,
                           0.0f, s.data(), e, blk, n);  // S = scale · Q Kᵀ
      detail::block_softmax_kernel<E>
          <<<detail::block_rows_grid(n * rc), detail::softmax_warps * 32, 0, ctx.stream()>>>(
              s.data(), p, lse + b0 * NH * T, n * rc, static_cast<int>(rc), static_cast<int>(e),
              static_cast<int>(i0), static_cast<int>(T));
      check_cuda(cudaGetLastError(), "blockwise attention softmax launch");
      gemm_strided_batched(ctx, N, N, rc, hs, e, 1.0f, static_cast<const E*>(p), e, blk, v, hs,
                           head, 0.0f, oh.data() + i0 * hs, hs, head, n);  // O = P V
    }
    detail::permute_heads(ctx, out + b0 * T * C, oh.data(), nb, T, 1, C, hs, false);
  }
}

/// dqkv (B, T, 3C) (`=`); `delta` (B, NH, T) is scratch and ends holding rowsum(dO ∘ O).
template <floating_dtype E>
void blockwise_attention_backward(const Context<Cuda>& ctx, E* dqkv, float* delta, const E* dout,
                                  const E* qkv, const E* out, const float* lse, std::int64_t B,
                                  std::int64_t T, std::int64_t C, std::int64_t NH,
                                  std::int64_t chunk = attention_query_chunk,
                                  std::int64_t budget = attention_score_budget) {
  const detail::BlockCall call = detail::block_call(B, T, C, NH, chunk, budget);
  if (B * T == 0) return;
  const std::int64_t hs = call.hs, group = call.plan.sequences, head = T * hs;
  const detail::FlashShape f{static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH),
                             static_cast<int>(hs), call.scale};
  detail::launch_flash_delta(ctx, delta, dout, out, B, f);
  const std::int64_t scores = call.plan.scores(T, NH);
  Tensor<E, Cuda> xh({3 * group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<E, Cuda> dyh({group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> g({3 * group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> s({scores}, MemTag::workspace, ctx.memory());
  Tensor<float, Cuda> dp({scores}, MemTag::workspace, ctx.memory());
  Tensor<E, Cuda> p_own, ds_own;
  E* p = detail::rounded_buffer(p_own, s, ctx);
  E* ds = detail::rounded_buffer(ds_own, dp, ctx);
  const E* pr = p;
  const E* dsr = ds;
  const Trans N = Trans::none, Tr = Trans::transpose;
  for (std::int64_t b0 = 0; b0 < B; b0 += group) {
    const std::int64_t nb = std::min(group, B - b0), n = nb * NH;
    detail::permute_heads(ctx, xh.data(), qkv + b0 * T * 3 * C, nb, T, 3, C, hs, true);
    detail::permute_heads(ctx, dyh.data(), dout + b0 * T * C, nb, T, 1, C, hs, true);
    check_cuda(
        cudaMemsetAsync(g.data(), 0, static_cast<std::size_t>(3 * nb * T * C) * sizeof(float),
                        ctx.stream()),
        "blockwise attention: clearing the gradient");
    const E* q = xh.data();  // (n, T, hs) each, head after head; so are dO and the gradients
    const E* k = q + nb * T * C;
    const E* v = k + nb * T * C;
    const E* dy = dyh.data();
    float* gq = g.data();
    float* gk = gq + nb * T * C;
    float* gv = gk + nb * T * C;
    for (std::int64_t i0 = 0; i0 < T; i0 += call.plan.rows) {
      const std::int64_t rc = std::min(call.plan.rows, T - i0), e = i0 + rc, blk = rc * e;
      const E* qb = q + i0 * hs;  // the block's query rows, and their dO
      const E* dyb = dy + i0 * hs;
      gemm_strided_batched(ctx, N, Tr, rc, e, hs, call.scale, qb, hs, head, k, hs, head, 0.0f,
                           s.data(), e, blk, n);  // S
      gemm_strided_batched(ctx, N, Tr, rc, e, hs, 1.0f, dyb, hs, head, v, hs, head, 0.0f, dp.data(),
                           e, blk, n);  // dP = dO Vᵀ
      detail::block_softmax_grad_kernel<E>
          <<<detail::block_rows_grid(n * rc), detail::softmax_warps * 32, 0, ctx.stream()>>>(
              s.data(), dp.data(), p, ds, lse + b0 * NH * T, delta + b0 * NH * T, n * rc,
              static_cast<int>(rc), static_cast<int>(e), static_cast<int>(i0), static_cast<int>(T));
      check_cuda(cudaGetLastError(), "blockwise attention gradient launch");
      // dV[0, e) += Pᵀ dO;  dQ[i0, i0 + rc) = scale · dS K;  dK[0, e) += scale · dSᵀ Q
      gemm_strided_batched(ctx, Tr, N, e, hs, rc, 1.0f, pr, e, blk, dyb, hs, head, 1.0f, gv, hs,
                           head, n);
      gemm_strided_batched(ctx, N, N, rc, hs, e, call.scale, dsr, e, blk, k, hs, head, 0.0f,
                           gq + i0 * hs, hs, head, n);
      gemm_strided_batched(ctx, Tr, N, e, hs, rc, call.scale, dsr, e, blk, qb, hs, head, 1.0f, gk,
                           hs, head, n);
    }
    detail::permute_heads(ctx, dqkv + b0 * T * 3 * C, g.data(), nb, T, 3, C, hs, false);
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
