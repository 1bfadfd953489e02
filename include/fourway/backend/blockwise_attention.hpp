//! The blockwise causal attention's algorithm, written once for every backend: the CUDA path the
//! attention layers run on a GPU (`cuda/blockwise_attention.cuh`) and its host form
//! (`host/blockwise_attention.hpp`), which CI tests against the host flash twin — so the block
//! loop, the GEMMs' shapes, strides and roundings and the plan are exercised on the host, and a
//! GPU only adds cuBLAS's summation order and the element kernels.
//!
//! The stash is the output and one fp32 log-sum-exp per row, O(T) per head; the backward
//! recomputes the probabilities; blocks above the diagonal are never computed. The products are
//! strided-batched GEMMs, one launch per product over every head of every sequence of a group.
//! One stride has to reach every (sequence, head), so q|k|v and dO are first copied head-major,
//! (NH, T, hs) per sequence (as llm.c and PyTorch permute them), and the output and the gradient
//! copied back:
//!
//!   per block of `rows` query rows [i0, i0 + rc), keys [0, e = i0 + rc), all (sequence, head):
//!   forward   S = Q Kᵀ/√hs (rc × e), P = causal softmax(S) with its log-sum-exp, O = P V
//!   backward  S again, dP = dO Vᵀ, P = exp(S − L) (causal), dS = P ∘ (dP − D),
//!             dV += Pᵀ dO, dQ = dS K/√hs, dK += dSᵀ Q/√hs      (D = rowsum(dO ∘ O))
//!
//! The cut into blocks and groups of sequences is `blockwise_plan`: one block's fp32 scores stay
//! within `attention_score_budget`. It is not online softmax: a block's rows see all their keys
//! at once, so no running-max rescaling is needed.
//!
//! Precision: every product takes its operands in E — q|k|v and dO as stored, P and dS rounded to
//! E once (in 16-bit types the rounding FlashAttention-2 and the materialised kernels make; in
//! fp32 none: P and dS overwrite the fp32 scores and dP in place) — and accumulates in fp32. The
//! scores, the softmax, its log-sum-exp, dP and D are fp32; dQ, dK and dV accumulate in fp32
//! across the blocks and are rounded to E once, as the output is. Every sum runs in one fixed
//! order. Transient workspace (MemTag::workspace, freed on return), per group of `sequences`:
//! forward the head-major q|k|v and output (4 · group · T · C of E), the scores (fp32) and for
//! 16-bit E P (E); backward the head-major q|k|v and dO (E), the fp32 gradient (3 · group · T ·
//! C), the scores and dP (fp32), and for 16-bit E P and dS (E).
//!
//! A backend supplies the kernels as the static members of a policy `K`:
//!   using Backend;
//!   gemm_strided_batched(ctx, …)        the backend's GEMM (`host::` / `cuda::` signature)
//!   permute_heads(ctx, dst, src, nb, T, parts, C, hs, to_heads)
//!       between token-major (nb, T, parts·C) and head-major (parts, nb, NH, T, hs)
//!   block_softmax(ctx, s, p, lse, rows, rc, e, first, T)
//!   block_softmax_grad(ctx, s, dp, p, ds, lse, delta, rows, rc, e, first, T)
//!       row = j · rc + r of a block (j = sequence · NH + head in the group, t = first + r):
//!       P over keys [0, t] and zero past it, the row's L = lse[j · T + t] (written forward, read
//!       backward) and D = delta[j · T + t]; p / ds may be s / dp when E is float
//!   row_delta(ctx, delta, dout, out, B, T, C, NH)   delta (B, NH, T) = rowsum(dO ∘ O)
//!   zero(ctx, float* p, n)
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fourway/backend/blockwise_plan.hpp"
#include "fourway/backend/gemm_types.hpp"
#include "fourway/backend/host/attention.hpp"
#include "fourway/config.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway::blockwise {

/// Head size, scale and the plan of one call; refuses sizes the kernels' 32-bit indices miss.
struct Call {
  std::int64_t hs;
  float scale;
  BlockwisePlan plan;
};

inline Call plan_call(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                      std::int64_t chunk, std::int64_t budget) {
  const std::int64_t hs = host::detail::head_size(C, NH);
  check<ShapeError>(T <= INT_MAX / 4, "fourway: blockwise attention: T=", T, " exceeds ",
                    INT_MAX / 4);
  const BlockwisePlan plan = blockwise_plan(B, T, NH, chunk, budget);
  check<ShapeError>(plan.sequences * NH <= INT_MAX,
                    "fourway: blockwise attention: ", plan.sequences, " sequences x ", NH,
                    " heads exceed one launch's 32-bit batch");
  return {hs, 1.0f / std::sqrt(static_cast<float>(hs)), plan};
}

/// Where element i of the token-major layout (nb, T, parts·C) — q|k|v (parts = 3) or dO / O
/// (parts = 1) as the layers store them — sits in the head-major one (parts, nb, NH, T, hs) the
/// GEMMs take with one stride. Every backend's `permute_heads` moves elements by this map.
FOURWAY_HOST_DEVICE constexpr std::int64_t head_major_at(std::int64_t i, std::int64_t nb,
                                                         std::int64_t T, std::int64_t parts,
                                                         std::int64_t C, std::int64_t hs) {
  const std::int64_t width = parts * C, b = i / (T * width), r = i % (T * width);
  const std::int64_t t = r / width, c = r % width;
  return (((c / C * nb + b) * (C / hs) + c % C / hs) * T + t) * hs + c % hs;
}

/// A buffer of E for P or dS beside an fp32 one, or the fp32 one itself when E is float.
template <class E, class Bk>
E* rounded_buffer(Tensor<E, Bk>& own, Tensor<float, Bk>& fp32, const Context<Bk>& ctx) {
  if constexpr (std::is_same_v<E, float>) {
    (void)ctx;
    (void)own;
    return fp32.data();
  } else {
    own = Tensor<E, Bk>({fp32.numel()}, MemTag::workspace, ctx.memory());
    return own.data();
  }
}

/// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); causal, scale 1/sqrt(hs); at most
/// `chunk` query rows per block and `budget` fp32 scores per block.
template <class K, floating_dtype E>
void forward(const Context<typename K::Backend>& ctx, E* out, float* lse, const E* qkv,
             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t chunk,
             std::int64_t budget) {
  using Bk = typename K::Backend;
  const Call call = plan_call(B, T, C, NH, chunk, budget);
  if (B * T == 0) return;
  const std::int64_t hs = call.hs, group = call.plan.sequences, head = T * hs;
  Tensor<E, Bk> xh({3 * group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<E, Bk> oh({group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Bk> s({call.plan.scores(T, NH)}, MemTag::workspace, ctx.memory());
  Tensor<E, Bk> p_own;
  E* p = rounded_buffer(p_own, s, ctx);
  const Trans N = Trans::none, Tr = Trans::transpose;
  for (std::int64_t b0 = 0; b0 < B; b0 += group) {
    const std::int64_t nb = std::min(group, B - b0), n = nb * NH;
    K::permute_heads(ctx, xh.data(), qkv + b0 * T * 3 * C, nb, T, 3, C, hs, true);
    const E* q = xh.data();  // (n, T, hs) each, head after head
    const E* k = q + nb * T * C;
    const E* v = k + nb * T * C;
    for (std::int64_t i0 = 0; i0 < T; i0 += call.plan.rows) {
      const std::int64_t rc = std::min(call.plan.rows, T - i0), e = i0 + rc, blk = rc * e;
      K::gemm_strided_batched(ctx, N, Tr, rc, e, hs, call.scale, q + i0 * hs, hs, head, k, hs, head,
                              0.0f, s.data(), e, blk, n);  // S = scale · Q Kᵀ
      K::block_softmax(ctx, s.data(), p, lse + b0 * NH * T, n * rc, rc, e, i0, T);
      K::gemm_strided_batched(ctx, N, N, rc, hs, e, 1.0f, static_cast<const E*>(p), e, blk, v, hs,
                              head, 0.0f, oh.data() + i0 * hs, hs, head, n);  // O = P V
    }
    K::permute_heads(ctx, out + b0 * T * C, static_cast<const E*>(oh.data()), nb, T, 1, C, hs,
                     false);
  }
}

/// dqkv (B, T, 3C) (`=`); `delta` (B, NH, T) is scratch and ends holding rowsum(dO ∘ O).
template <class K, floating_dtype E>
void backward(const Context<typename K::Backend>& ctx, E* dqkv, float* delta, const E* dout,
              const E* qkv, const E* out, const float* lse, std::int64_t B, std::int64_t T,
              std::int64_t C, std::int64_t NH, std::int64_t chunk, std::int64_t budget) {
  using Bk = typename K::Backend;
  const Call call = plan_call(B, T, C, NH, chunk, budget);
  if (B * T == 0) return;
  const std::int64_t hs = call.hs, group = call.plan.sequences, head = T * hs;
  K::row_delta(ctx, delta, dout, out, B, T, C, NH);
  const std::int64_t scores = call.plan.scores(T, NH);
  Tensor<E, Bk> xh({3 * group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<E, Bk> dyh({group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Bk> g({3 * group * T * C}, MemTag::workspace, ctx.memory());
  Tensor<float, Bk> s({scores}, MemTag::workspace, ctx.memory());
  Tensor<float, Bk> dp({scores}, MemTag::workspace, ctx.memory());
  Tensor<E, Bk> p_own, ds_own;
  E* p = rounded_buffer(p_own, s, ctx);
  E* ds = rounded_buffer(ds_own, dp, ctx);
  const E* pr = p;
  const E* dsr = ds;
  const Trans N = Trans::none, Tr = Trans::transpose;
  for (std::int64_t b0 = 0; b0 < B; b0 += group) {
    const std::int64_t nb = std::min(group, B - b0), n = nb * NH;
    K::permute_heads(ctx, xh.data(), qkv + b0 * T * 3 * C, nb, T, 3, C, hs, true);
    K::permute_heads(ctx, dyh.data(), dout + b0 * T * C, nb, T, 1, C, hs, true);
    K::zero(ctx, g.data(), 3 * nb * T * C);
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
      K::gemm_strided_batched(ctx, N, Tr, rc, e, hs, call.scale, qb, hs, head, k, hs, head, 0.0f,
                              s.data(), e, blk, n);  // S
      K::gemm_strided_batched(ctx, N, Tr, rc, e, hs, 1.0f, dyb, hs, head, v, hs, head, 0.0f,
                              dp.data(), e, blk, n);  // dP = dO Vᵀ
      K::block_softmax_grad(ctx, s.data(), dp.data(), p, ds, lse + b0 * NH * T, delta + b0 * NH * T,
                            n * rc, rc, e, i0, T);
      // dV[0, e) += Pᵀ dO;  dQ[i0, i0 + rc) = scale · dS K;  dK[0, e) += scale · dSᵀ Q
      K::gemm_strided_batched(ctx, Tr, N, e, hs, rc, 1.0f, pr, e, blk, dyb, hs, head, 1.0f, gv, hs,
                              head, n);
      K::gemm_strided_batched(ctx, N, N, rc, hs, e, call.scale, dsr, e, blk, k, hs, head, 0.0f,
                              gq + i0 * hs, hs, head, n);
      K::gemm_strided_batched(ctx, Tr, N, e, hs, rc, call.scale, dsr, e, blk, qb, hs, head, 1.0f,
                              gk, hs, head, n);
    }
    K::permute_heads(ctx, dqkv + b0 * T * 3 * C, static_cast<const float*>(g.data()), nb, T, 3, C,
                     hs, false);
  }
}

}  // namespace fourway::blockwise
