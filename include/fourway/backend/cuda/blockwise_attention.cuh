//! CUDA causal attention by query blocks on cuBLAS — what `flash_attention_forward` /
//! `flash_attention_backward` run on a GPU by default (`cuda/attention_select.cuh`): the
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

/// Visits columns [0, n) of one fp32 row x (and of y, when given) across a warp: f(c, k, a, b)
/// gets k columns from c on, a[j] = x[c + j] and b[j] = y[c + j]. With `packed` (the rows start
/// on 16-byte boundaries and so do the outputs' rows at four columns: the caller checks) a lane
/// takes four consecutive columns per access (k = 4), so a warp has 512 bytes of each row in
/// flight per load and can store its four results as one access; the rest (and every column when
/// not packed) one a lane (k = 1).
template <class F, class... Rows>
__device__ __forceinline__ void warp_row(int n, bool packed, int lane, F&& f, const Rows*... x) {
  constexpr std::size_t last = sizeof...(Rows) - 1;
  int c0 = 0;
  if (packed) {
    const int packs = n / 4;
    for (int q = lane; q < packs; q += 32) {
      const float4 v[] = {reinterpret_cast<const float4*>(x)[q]...};
      const float a[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
      const float b[4] = {v[last].x, v[last].y, v[last].z, v[last].w};
      f(4 * q, 4, a, b);
    }
    c0 = 4 * packs;
  }
  for (int c = c0 + lane; c < n; c += 32) {
    const float v[] = {x[c]...};
    const float a[4] = {v[0]}, b[4] = {v[last]};
    f(c, 1, a, b);
  }
}

/// y[0, k) = val[0, k) in E: one access for a run of four (y on a boundary of four elements).
template <class E>
__device__ __forceinline__ void store_run(E* y, int k, const float (&val)[4]) {
  if (k == 4) {
    Run<E, 4> r;
#pragma unroll
    for (int j = 0; j < 4; ++j) store(&r.v[j], val[j]);
    *reinterpret_cast<Run<E, 4>*>(y) = r;
  } else {
    for (int j = 0; j < k; ++j) store(y + j, val[j]);
  }
}

/// Row `row` = (j, r) of a block whose first query is `first`, j = sequence · NH + head of the
/// group: p[row, :t + 1) becomes the softmax of the (already scaled) fp32 scores s[row, :t + 1),
/// p[row, t + 1:e) zero, lse[j · T + t] its log-sum-exp (t = first + r). p may be s (fp32): a
/// lane reads its columns before it writes them. Two reads of the row: the maximum and the sum
/// of exponentials together (online, as the cross-entropy), then the write.
template <class E>
__global__ void block_softmax_kernel(const float* s, E* p, float* lse, std::int64_t rows, int rc,
                                     int e, int first, int T, bool packed) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * softmax_warps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  const std::int64_t j = row / rc;
  const int t = first + static_cast<int>(row % rc);
  const float* x = s + row * e;
  E* y = p + row * e;
  float m = -INFINITY, sum = 0.0f;
  warp_row(
      t + 1, packed, lane,
      [&](int, int k, const float(&a)[4], const float(&)[4]) {
        for (int i = 0; i < k; ++i) {
          if (a[i] > m) {
            sum = sum * expf(m - a[i]) + 1.0f;
            m = a[i];
          } else {
            sum += expf(a[i] - m);
          }
        }
      },
      x);
  const float mx = warp_max(m);
  sum = warp_sum(sum * expf(m - mx));
  const float inv = 1.0f / sum;
  warp_row(
      e, packed, lane,
      [&](int c, int k, const float(&a)[4], const float(&)[4]) {
        float val[4];
        for (int i = 0; i < 4; ++i) val[i] = c + i <= t ? expf(a[i] - mx) * inv : 0.0f;
        store_run(y + c, k, val);
      },
      x);
  if (lane == 0) lse[j * T + t] = mx + logf(sum);
}

/// The backward's element pass over a block: P = exp(s − L) up to the diagonal and zero past it
/// into p, dS = P ∘ (dP − D) into ds (P in fp32 here; each rounded to E once). p may be s and
/// ds may be dp (fp32): every element is read before it is written, by the same thread.
template <class E>
__global__ void block_softmax_grad_kernel(const float* s, const float* dp, E* p, E* ds,
                                          const float* lse, const float* delta, std::int64_t rows,
                                          int rc, int e, int first, int T, bool packed) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * softmax_warps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  const std::int64_t at = (row / rc) * T + first + row % rc;  // (j, t)
  const int t = first + static_cast<int>(row % rc);
  const float L = lse[at];
  const float D = delta[at];
  const std::int64_t o = row * e;
  warp_row(
      e, packed, lane,
      [&](int c, int k, const float(&sv)[4], const float(&g)[4]) {
        float pv[4], d[4];
        for (int i = 0; i < 4; ++i) {
          pv[i] = c + i <= t ? expf(sv[i] - L) : 0.0f;
          d[i] = pv[i] * (g[i] - D);
        }
        store_run(p + o + c, k, pv);
        store_run(ds + o + c, k, d);
      },
      s + o, dp + o);
}

/// The head permute over rows of hs elements, which both layouts keep whole: a thread moves V
/// elements of one row (chunk k of row r in the token-major order (nb, T, parts, NH), so reads or
/// writes on that side are consecutive). Indices split in 32 bits, four divisions per V elements
/// (the element-wise map did five 64-bit ones per element: 180 µs for GPT-2's q|k|v at B 8,
/// ~8× the copy's time).
template <int V, class To, class From>
__global__ void permute_heads_kernel(To* __restrict__ dst, const From* __restrict__ src,
                                     std::uint32_t chunks, std::uint32_t per_row,
                                     std::uint32_t parts_nh, std::uint32_t nh, std::uint32_t T,
                                     std::uint32_t nb, std::int64_t hs, bool to_heads) {
  const std::uint32_t g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= chunks) return;
  const std::uint32_t row = g / per_row, k = g - row * per_row;
  const std::uint32_t tok = row / parts_nh, q = row - tok * parts_nh;
  const std::uint32_t b = tok / T, t = tok - b * T;
  const std::uint32_t part = q / nh, h = q - part * nh;
  const std::int64_t token_major = static_cast<std::int64_t>(row) * hs + std::int64_t{k} * V;
  const std::int64_t head_major =
      (((std::int64_t{part} * nb + b) * nh + h) * T + t) * hs + std::int64_t{k} * V;
  const std::int64_t from = to_heads ? token_major : head_major;
  const std::int64_t to = to_heads ? head_major : token_major;
  const Run<From, V> in = *reinterpret_cast<const Run<From, V>*>(src + from);
  Run<To, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j) store(&out.v[j], load(&in.v[j]));
  *reinterpret_cast<Run<To, V>*>(dst + to) = out;
}

template <int V, class To, class From>
bool permute_heads_runs(const Context<Cuda>& ctx, To* dst, const From* src, std::int64_t nb,
                        std::int64_t T, std::int64_t parts, std::int64_t C, std::int64_t hs,
                        bool to_heads) {
  const auto fits = [](const auto* p) {
    return reinterpret_cast<std::uintptr_t>(p) % (sizeof(*p) * V) == 0;
  };
  const std::int64_t chunks = nb * T * parts * C / V;
  if (hs % V != 0 || !fits(dst) || !fits(src) || chunks > std::int64_t{UINT32_MAX}) return false;
  const unsigned grid = blocks_for(chunks);
  permute_heads_kernel<V><<<grid, block_threads, 0, ctx.stream()>>>(
      dst, src, static_cast<std::uint32_t>(chunks), static_cast<std::uint32_t>(hs / V),
      static_cast<std::uint32_t>(parts * (C / hs)), static_cast<std::uint32_t>(C / hs),
      static_cast<std::uint32_t>(T), static_cast<std::uint32_t>(nb), hs, to_heads);
  check_cuda(cudaGetLastError(), "blockwise attention head permute launch");
  return true;
}

/// Token-major ↔ head-major (`blockwise::head_major_at`): `to_heads` reads the first and writes
/// the second, else the reverse; each element converted through fp32 once (exact for one type).
/// Runs of 8, 4, 2 or 1 elements a thread, the longest that divides hs and keeps both pointers
/// aligned; past 2^32 runs, the element-wise map.
template <class To, class From>
void permute_heads(const Context<Cuda>& ctx, To* dst, const From* src, std::int64_t nb,
                   std::int64_t T, std::int64_t parts, std::int64_t C, std::int64_t hs,
                   bool to_heads) {
  if (nb * T * parts * C <= 0) return;
  if (permute_heads_runs<8>(ctx, dst, src, nb, T, parts, C, hs, to_heads) ||
      permute_heads_runs<4>(ctx, dst, src, nb, T, parts, C, hs, to_heads) ||
      permute_heads_runs<2>(ctx, dst, src, nb, T, parts, C, hs, to_heads) ||
      permute_heads_runs<1>(ctx, dst, src, nb, T, parts, C, hs, to_heads)) {
    return;
  }
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

/// Whether rows of e columns from these bases all start on a boundary of four elements that is
/// also one of 16 bytes for the fp32 rows read as float4: e a multiple of four and each base on a
/// 16-byte boundary (four elements of 4 bytes or fewer fit in 16).
template <class... P>
bool rows_packed(std::int64_t e, const P*... base) {
  return e % 4 == 0 && (aligned16(base) && ...);
}

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
        static_cast<int>(T), rows_packed(e, s, p));
    check_cuda(cudaGetLastError(), "blockwise attention softmax launch");
  }
  template <class E>
  static void block_softmax_grad(const Context<Cuda>& ctx, const float* s, const float* dp, E* p,
                                 E* ds, const float* lse, const float* delta, std::int64_t rows,
                                 std::int64_t rc, std::int64_t e, std::int64_t first,
                                 std::int64_t T) {
    block_softmax_grad_kernel<E><<<block_rows_grid(rows), softmax_warps * 32, 0, ctx.stream()>>>(
        s, dp, p, ds, lse, delta, rows, static_cast<int>(rc), static_cast<int>(e),
        static_cast<int>(first), static_cast<int>(T), rows_packed(e, s, dp, p, ds));
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

}  // namespace fourway::cuda
