//! CUDA flash-style causal attention on CUDA cores, twin of `host/flash_attention.hpp` (same
//! layout, same parameters, fp32 statistics and accumulators, 16-bit memory read and written
//! once): `tiled_flash_attention_forward` / `_backward`. The attention layers run the blockwise
//! path of `blockwise_attention.cuh` instead (same contract, the products on cuBLAS: the first
//! GPU run timed these kernels at ~2 TFLOP/s); they stay as the device form of the host twin's
//! algorithm, tested against it and benchmarked beside the blockwise path.
//!
//! Tiles are 32 query rows by 32 keys; a block of 8 warps owns one tile of one (batch, head), each
//! warp four of its rows (forward, dQ) or four of its keys (dK, dV), the lanes running over the
//! keys (or query rows) of a tile for the scores and over the head dimension for the
//! accumulators. Tiles above the diagonal are never visited. The backward is three launches with
//! no atomics, so every sum has one order and the result is the same run after run: D = rowsum(dO
//! ∘ O) into `delta`, dK and dV per key tile (query tiles from the diagonal down), dQ per query
//! tile (key tiles in ascending order). Head size at most `flash_max_head` (128; GPT-2's is 64):
//! larger heads are refused with a ShapeError. Shared memory: three (forward) or four (backward)
//! tiles of 32 x (hs + 1) floats, opted in past 48 KiB when hs > 124.
// fourway-requires: cuda
#pragma once

#include <cmath>
#include <cstdint>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/host/attention.hpp"

namespace fourway::cuda {

namespace detail {
inline constexpr int flash_rows = 32;  // query rows of a tile = keys of a tile = lanes
inline constexpr int flash_warps = 8;
inline constexpr int flash_rows_per_warp = flash_rows / flash_warps;
inline constexpr int flash_max_head = 128;
inline constexpr int flash_dims_per_lane = flash_max_head / 32;

struct FlashShape {
  int T, C, NH, hs;
  float scale;
};

/// s[r * (hs + 1) + d] = fp32 of row `first + r` (zero past T), dims [0, hs), rows `ld` apart.
template <class E>
__device__ __forceinline__ void flash_load_tile(float* s, const E* src, std::int64_t ld, int first,
                                                const FlashShape& f) {
  for (int e = static_cast<int>(threadIdx.x); e < flash_rows * f.hs;
       e += static_cast<int>(blockDim.x)) {
    const int r = e / f.hs;
    const int d = e % f.hs;
    const int t = first + r;
    s[r * (f.hs + 1) + d] = t < f.T ? load(src + static_cast<std::int64_t>(t) * ld + d) : 0.0f;
  }
}
__device__ __forceinline__ float flash_dot(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s += a[d] * b[d];
  return s;
}
/// acc (dims lane + 32·kk) += Σ_{j < n} w_j · tile[j][dim], w_j the value lane j holds.
__device__ __forceinline__ void flash_accumulate(float (&acc)[flash_dims_per_lane], float w,
                                                 const float* tile, int ld, int n, int hs) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int j = 0; j < n; ++j) {
    const float wj = __shfl_sync(0xffffffffu, w, j);
    for (int kk = 0; kk < flash_dims_per_lane; ++kk) {
      const int d = lane + 32 * kk;
      if (d < hs) acc[kk] += wj * tile[j * ld + d];
    }
  }
}
/// row[dim] = scale · acc (dims lane + 32·kk), rounded to E.
template <class E>
__device__ __forceinline__ void flash_store(E* row, const float (&acc)[flash_dims_per_lane],
                                            float scale, int hs) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int kk = 0; kk < flash_dims_per_lane; ++kk) {
    const int d = lane + 32 * kk;
    if (d < hs) store(row + d, acc[kk] * scale);
  }
}
/// Where this block works: batch b, head h (grid y = b·NH + h), its tile's first row (grid x),
/// and the rows of q|k|v (ld3 apart) and of dout (C apart) of batch b.
template <class E>
struct FlashBlock {
  int bh, b, h, first;
  std::int64_t ld3;
  const E* x;     // qkv of batch b
  const E* dout;  // dout of batch b (null in the forward)
  __device__ FlashBlock(const FlashShape& f, const E* qkv, const E* dout_all)
      : bh(static_cast<int>(blockIdx.y)),
        b(bh / f.NH),
        h(bh % f.NH),
        first(static_cast<int>(blockIdx.x) * flash_rows),
        ld3(3 * static_cast<std::int64_t>(f.C)),
        x(qkv + static_cast<std::int64_t>(b) * f.T * ld3),
        dout(dout_all == nullptr ? nullptr : dout_all + static_cast<std::int64_t>(b) * f.T * f.C) {}
};
/// The recomputed probability p = exp(scale·q·k − L) of one (query, key) pair and its score
/// gradient dS = p·(dO·v − D); rows of the shared tiles.
__device__ __forceinline__ float flash_ds(const float* q, const float* k, const float* dout,
                                          const float* v, const FlashShape& f, float lse,
                                          float delta, float& p) {
  p = expf(flash_dot(q, k, f.hs) * f.scale - lse);
  return p * (flash_dot(dout, v, f.hs) - delta);
}

template <class E>
__global__ void flash_forward_kernel(E* out, float* lse, const E* qkv, FlashShape f) {
  extern __shared__ float smem[];
  const int ld = f.hs + 1;
  float* sq = smem;
  float* sk = sq + flash_rows * ld;
  float* sv = sk + flash_rows * ld;
  const FlashBlock<E> at(f, qkv, nullptr);
  const int b = at.b, h = at.h, bh = at.bh, i0 = at.first;
  const std::int64_t ld3 = at.ld3;
  const E* x = at.x;
  flash_load_tile(sq, x + h * f.hs, ld3, i0, f);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float m[flash_rows_per_warp], l[flash_rows_per_warp];
  float acc[flash_rows_per_warp][flash_dims_per_lane];
  for (int i = 0; i < flash_rows_per_warp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    for (int kk = 0; kk < flash_dims_per_lane; ++kk) acc[i][kk] = 0.0f;
  }
  const int end = min(f.T, i0 + flash_rows);
  for (int j0 = 0; j0 < end; j0 += flash_rows) {  // key tiles up to the diagonal
    __syncthreads();
    flash_load_tile(sk, x + f.C + h * f.hs, ld3, j0, f);
    flash_load_tile(sv, x + 2 * f.C + h * f.hs, ld3, j0, f);
    __syncthreads();
    for (int i = 0; i < flash_rows_per_warp; ++i) {
      const int r = warp * flash_rows_per_warp + i;
      const int t = i0 + r;
      if (t >= f.T) continue;  // warp-uniform
      const bool visible = j0 + lane <= t;
      const float s = visible ? flash_dot(sq + r * ld, sk + lane * ld, f.hs) * f.scale : -INFINITY;
      const float mx = fmaxf(m[i], warp_max(s));  // key j0 <= t is always visible
      const float p = visible ? expf(s - mx) : 0.0f;
      const float corr = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
      l[i] = l[i] * corr + warp_sum(p);
      m[i] = mx;
      for (int kk = 0; kk < flash_dims_per_lane; ++kk) acc[i][kk] *= corr;
      flash_accumulate(acc[i], p, sv, ld, min(flash_rows, t - j0 + 1), f.hs);
    }
  }
  for (int i = 0; i < flash_rows_per_warp; ++i) {
    const int t = i0 + warp * flash_rows_per_warp + i;
    if (t >= f.T) continue;
    flash_store(out + (static_cast<std::int64_t>(b) * f.T + t) * f.C + h * f.hs, acc[i],
                1.0f / l[i], f.hs);
    if (lane == 0) lse[static_cast<std::int64_t>(bh) * f.T + t] = m[i] + logf(l[i]);
  }
}

/// delta[(b, h, t)] = Σ_d dout[b, t, h·hs + d] · out[b, t, h·hs + d]; one warp a row.
template <class E>
__global__ void flash_delta_kernel(float* delta, const E* dout, const E* out, std::int64_t rows,
                                   FlashShape f) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * flash_warps + static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= rows) return;
  const std::int64_t t = row % f.T;
  const std::int64_t bh = row / f.T;
  const std::int64_t b = bh / f.NH;
  const std::int64_t h = bh % f.NH;
  const std::int64_t at = (b * f.T + t) * f.C + h * f.hs;
  float s = 0.0f;
  for (int d = lane; d < f.hs; d += 32) s += load(dout + at + d) * load(out + at + d);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

/// D = rowsum(dO ∘ O) of every (b, h, t) row into `delta` (B, NH, T): the first pass of both
/// CUDA backwards (the tiled one here, the blockwise one).
template <class E>
void launch_flash_delta(const Context<Cuda>& ctx, float* delta, const E* dout, const E* out,
                        std::int64_t B, const FlashShape& f) {
  const std::int64_t rows = B * f.NH * f.T;
  flash_delta_kernel<E><<<blocks_for(rows, flash_warps), flash_warps * 32, 0, ctx.stream()>>>(
      delta, dout, out, rows, f);
  check_cuda(cudaGetLastError(), "flash attention delta launch");
}

/// dK and dV of one key tile: the query tiles from the diagonal down.
template <class E>
__global__ void flash_dkdv_kernel(E* dqkv, const E* dout, const E* qkv, const float* lse,
                                  const float* delta, FlashShape f) {
  extern __shared__ float smem[];
  const int ld = f.hs + 1;
  float* sk = smem;
  float* sv = sk + flash_rows * ld;
  float* sq = sv + flash_rows * ld;
  float* sdo = sq + flash_rows * ld;
  const FlashBlock<E> at(f, qkv, dout);
  const int b = at.b, h = at.h, bh = at.bh, j0 = at.first;
  const std::int64_t ld3 = at.ld3;
  const E* x = at.x;
  const E* dob = at.dout;
  const float* lse_h = lse + static_cast<std::int64_t>(bh) * f.T;
  const float* d_h = delta + static_cast<std::int64_t>(bh) * f.T;
  flash_load_tile(sk, x + f.C + h * f.hs, ld3, j0, f);
  flash_load_tile(sv, x + 2 * f.C + h * f.hs, ld3, j0, f);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float dk[flash_rows_per_warp][flash_dims_per_lane];
  float dv[flash_rows_per_warp][flash_dims_per_lane];
  for (int i = 0; i < flash_rows_per_warp; ++i) {
    for (int kk = 0; kk < flash_dims_per_lane; ++kk) dk[i][kk] = dv[i][kk] = 0.0f;
  }
  for (int i0 = j0; i0 < f.T; i0 += flash_rows) {  // query tiles on and below the diagonal
    __syncthreads();
    flash_load_tile(sq, x + h * f.hs, ld3, i0, f);
    flash_load_tile(sdo, dob + h * f.hs, f.C, i0, f);
    __syncthreads();
    const int t = i0 + lane;
    const float lt = t < f.T ? lse_h[t] : 0.0f;
    const float dt = t < f.T ? d_h[t] : 0.0f;
    const int rows = min(flash_rows, f.T - i0);
    for (int i = 0; i < flash_rows_per_warp; ++i) {
      const int jj = warp * flash_rows_per_warp + i;
      const int key = j0 + jj;
      if (key >= f.T) continue;  // warp-uniform
      float p = 0.0f, ds = 0.0f;
      if (t < f.T && t >= key) {
        ds = flash_ds(sq + lane * ld, sk + jj * ld, sdo + lane * ld, sv + jj * ld, f, lt, dt, p);
      }
      flash_accumulate(dv[i], p, sdo, ld, rows, f.hs);
      flash_accumulate(dk[i], ds, sq, ld, rows, f.hs);
    }
  }
  for (int i = 0; i < flash_rows_per_warp; ++i) {
    const int key = j0 + warp * flash_rows_per_warp + i;
    if (key >= f.T) continue;
    E* row = dqkv + (static_cast<std::int64_t>(b) * f.T + key) * ld3 + h * f.hs;
    flash_store(row + f.C, dk[i], f.scale, f.hs);
    flash_store(row + 2 * f.C, dv[i], 1.0f, f.hs);
  }
}

/// dQ of one query tile: the key tiles up to the diagonal, in ascending order.
template <class E>
__global__ void flash_dq_kernel(E* dqkv, const E* dout, const E* qkv, const float* lse,
                                const float* delta, FlashShape f) {
  extern __shared__ float smem[];
  const int ld = f.hs + 1;
  float* sq = smem;
  float* sdo = sq + flash_rows * ld;
  float* sk = sdo + flash_rows * ld;
  float* sv = sk + flash_rows * ld;
  const FlashBlock<E> at(f, qkv, dout);
  const int b = at.b, h = at.h, bh = at.bh, i0 = at.first;
  const std::int64_t ld3 = at.ld3;
  const E* x = at.x;
  flash_load_tile(sq, x + h * f.hs, ld3, i0, f);
  flash_load_tile(sdo, at.dout + h * f.hs, f.C, i0, f);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float dq[flash_rows_per_warp][flash_dims_per_lane];
  float lt[flash_rows_per_warp], dt[flash_rows_per_warp];
  for (int i = 0; i < flash_rows_per_warp; ++i) {
    const int t = i0 + warp * flash_rows_per_warp + i;
    lt[i] = t < f.T ? lse[static_cast<std::int64_t>(bh) * f.T + t] : 0.0f;
    dt[i] = t < f.T ? delta[static_cast<std::int64_t>(bh) * f.T + t] : 0.0f;
    for (int kk = 0; kk < flash_dims_per_lane; ++kk) dq[i][kk] = 0.0f;
  }
  const int end = min(f.T, i0 + flash_rows);
  for (int j0 = 0; j0 < end; j0 += flash_rows) {
    __syncthreads();
    flash_load_tile(sk, x + f.C + h * f.hs, ld3, j0, f);
    flash_load_tile(sv, x + 2 * f.C + h * f.hs, ld3, j0, f);
    __syncthreads();
    for (int i = 0; i < flash_rows_per_warp; ++i) {
      const int r = warp * flash_rows_per_warp + i;
      const int t = i0 + r;
      if (t >= f.T) continue;  // warp-uniform
      float ds = 0.0f;
      if (j0 + lane <= t) {
        float p = 0.0f;
        ds =
            flash_ds(sq + r * ld, sk + lane * ld, sdo + r * ld, sv + lane * ld, f, lt[i], dt[i], p);
      }
      flash_accumulate(dq[i], ds, sk, ld, min(flash_rows, t - j0 + 1), f.hs);
    }
  }
  for (int i = 0; i < flash_rows_per_warp; ++i) {
    const int t = i0 + warp * flash_rows_per_warp + i;
    if (t >= f.T) continue;
    flash_store(dqkv + (static_cast<std::int64_t>(b) * f.T + t) * ld3 + h * f.hs, dq[i], f.scale,
                f.hs);
  }
}

inline FlashShape flash_shape(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  const std::int64_t hs = host::detail::head_size(C, NH);
  check<ShapeError>(hs <= flash_max_head, "fourway: the CUDA flash attention takes head sizes up ",
                    "to ", flash_max_head, ", got C=", C, " / NH=", NH, " = ", hs,
                    "; use more heads");
  check<ShapeError>(B * NH <= 65535 && T <= 0x7fffffff / (3 * C), "fourway: flash attention ",
                    "grid too large: B*NH=", B * NH, " (at most 65535), T=", T, ", C=", C);
  return FlashShape{static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH),
                    static_cast<int>(hs), 1.0f / std::sqrt(static_cast<float>(hs))};
}
/// Dynamic shared memory of `tiles` fp32 tiles, opted in past the 48 KiB default for `kernel`.
template <class Kernel>
std::size_t flash_shared_bytes(Kernel kernel, int tiles, const FlashShape& f) {
  const std::size_t bytes =
      static_cast<std::size_t>(tiles) * flash_rows * static_cast<std::size_t>(f.hs + 1) * 4;
  if (bytes > 48 * 1024) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)),
               "cudaFuncSetAttribute (flash attention shared memory)");
  }
  return bytes;
}
}  // namespace detail

/// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); causal, scale 1/sqrt(hs).
template <floating_dtype E>
void tiled_flash_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                                   std::int64_t B, std::int64_t T, std::int64_t C,
                                   std::int64_t NH) {
  const detail::FlashShape f = detail::flash_shape(B, T, C, NH);
  if (B * T == 0) return;
  const dim3 grid(static_cast<unsigned>((T + detail::flash_rows - 1) / detail::flash_rows),
                  static_cast<unsigned>(B * NH));
  const std::size_t smem = detail::flash_shared_bytes(detail::flash_forward_kernel<E>, 3, f);
  detail::flash_forward_kernel<E>
      <<<grid, detail::flash_warps * 32, smem, ctx.stream()>>>(out, lse, qkv, f);
  check_cuda(cudaGetLastError(), "flash attention forward launch");
}

/// dqkv (B, T, 3C) (`=`); `delta` (B, NH, T) is scratch and ends holding rowsum(dO ∘ O).
template <floating_dtype E>
void tiled_flash_attention_backward(const Context<Cuda>& ctx, E* dqkv, float* delta, const E* dout,
                                    const E* qkv, const E* out, const float* lse, std::int64_t B,
                                    std::int64_t T, std::int64_t C, std::int64_t NH) {
  const detail::FlashShape f = detail::flash_shape(B, T, C, NH);
  if (B * T == 0) return;
  detail::launch_flash_delta(ctx, delta, dout, out, B, f);
  const dim3 grid(static_cast<unsigned>((T + detail::flash_rows - 1) / detail::flash_rows),
                  static_cast<unsigned>(B * NH));
  const std::size_t smem = detail::flash_shared_bytes(detail::flash_dkdv_kernel<E>, 4, f);
  detail::flash_dkdv_kernel<E>
      <<<grid, detail::flash_warps * 32, smem, ctx.stream()>>>(dqkv, dout, qkv, lse, delta, f);
  check_cuda(cudaGetLastError(), "flash attention dK/dV launch");
  (void)detail::flash_shared_bytes(detail::flash_dq_kernel<E>, 4, f);
  detail::flash_dq_kernel<E>
      <<<grid, detail::flash_warps * 32, smem, ctx.stream()>>>(dqkv, dout, qkv, lse, delta, f);
  check_cuda(cudaGetLastError(), "flash attention dQ launch");
}

}  // namespace fourway::cuda
