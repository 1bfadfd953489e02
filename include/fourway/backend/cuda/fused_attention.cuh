//! CUDA flash attention fused into single kernels on the tensor cores (16-bit types): the scores
//! of a tile never leave the chip. Same contract as the other CUDA attentions (`qkv (B, T, 3C)`
//! in, `out (B, T, C)` and `lse (B, NH, T)` out, causal, scale 1/sqrt(hs); the backward writes
//! `dqkv` with `=` and leaves D = rowsum(dO ∘ O) in `delta`), and the algorithm of the host twin
//! (`host/flash_attention.hpp`): online softmax over key tiles, the tiles above the diagonal
//! never visited, P recomputed from `lse` in the backward.
//!
//! Tiles are 64 query rows by 64 keys; a block of four warps owns one tile of one (batch, head)
//! and each warp 16 of its rows (or keys). Products run as 16 x 16 x 16 WMMA tiles with fp32
//! accumulation from 16-bit tiles in shared memory; the warp stages its fp32 scores in shared
//! memory, where two lanes a row take the softmax (or the gradient's element pass) and write P
//! (dS) back in the element type, as the blockwise path rounds them. In the diagonal tile a warp
//! skips the 16 x 16 blocks wholly above the diagonal.
//!   - forward: per query tile, key tiles in ascending order; the running max, sum and the fp32
//!     output accumulator (in shared memory, rescaled by exp(m_old − m_new)) per row.
//!   - backward: D by the flash delta kernel, then dK and dV per key tile (query tiles from the
//!     diagonal down, S and dP recomputed transposed, the accumulators in registers) and dQ per
//!     query tile (key tiles in ascending order). No atomics: every sum has one order, so the
//!     result is the same run after run; S and dP are computed twice (seven products against
//!     FlashAttention-2's five), the price of that.
//!
//! Taken only where `fused_attention_supports` holds: bf16 or fp16, head size 16, 32, 64 or 128,
//! every pointer on a 16-byte boundary, B·NH <= 65535, a GPU of compute capability 8.0 or later
//! running code built for it and letting a block have the shared memory the head size needs
//! (head size 128 needs 152.5 KiB: not on compute capability 8.6 / 8.9, which allow 99 KiB). The
//! layers select it with `Context<Cuda>::set_fused_attention`
//! (`cuda/attention_select.cuh`); elsewhere they run the blockwise path.
// fourway-requires: cuda
#pragma once

#include <mma.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/flash_attention.cuh"
#include "fourway/backend/host/attention.hpp"

namespace fourway::cuda {

namespace detail {

inline constexpr int fused_rows = 64;  // query rows of a tile = keys of a tile
inline constexpr int fused_warps = 4;  // 16 rows (or keys) each
inline constexpr int fused_threads = fused_warps * 32;

constexpr std::size_t fused_round(std::size_t bytes) { return (bytes + 127) / 128 * 128; }

/// Shared-memory shapes for head size HS: 16-bit tiles of 64 rows (`ldt` apart), per-warp fp32
/// staging of 16 rows (`ldf` apart) and per-warp 16-bit P / dS of 16 rows (`ldp` apart). The
/// leading dimensions are multiples of 8 (16-bit) and 4 (fp32), as WMMA asks, and padded off
/// multiples of 32 banks.
template <class E, int HS>
struct FusedLayout {
  static_assert(HS % 16 == 0 && HS <= 128,
                "fourway: the fused attention takes head sizes that "
                "are multiples of 16 up to 128");
  static constexpr int ldt = HS + 8;
  static constexpr int ldp = fused_rows + 8;
  static constexpr int ldf = (HS > fused_rows ? HS : fused_rows) + 4;
  static constexpr std::size_t tile = fused_round(fused_rows * ldt * sizeof(E));
  static constexpr std::size_t f32 = fused_round(fused_warps * 16 * ldf * sizeof(float));
  static constexpr std::size_t e16 = fused_round(fused_warps * 16 * ldp * sizeof(E));
  static constexpr std::size_t stats = fused_round(2 * fused_rows * sizeof(float));
  /// Bytes of `tiles` 16-bit tiles, `f32s` and `e16s` per-warp regions and `stat` row vectors.
  static constexpr std::size_t bytes(int tiles, int f32s, int e16s, int stat) {
    return tiles * tile + f32s * f32 + e16s * e16 + stat * stats;
  }
};
inline constexpr int fused_forward_regions[] = {3, 2, 1, 0};  // q k v | scores, O | P
inline constexpr int fused_dkdv_regions[] = {4, 2, 2, 1};  // k v q dO | Sᵀ, dPᵀ | Pᵀ, dSᵀ | L, D
inline constexpr int fused_dq_regions[] = {4, 2, 1, 0};  // q dO k v | S, dP | dS

/// Hands out the regions of a fused kernel's dynamic shared memory in the order of `bytes`.
template <class E, int HS>
struct FusedCarve {
  using L = FusedLayout<E, HS>;
  unsigned char* at;
  __device__ E* tile() { return take<E>(L::tile); }
  __device__ float* f32(int warp) { return take<float>(L::f32) + warp * 16 * L::ldf; }
  __device__ E* e16(int warp) { return take<E>(L::e16) + warp * 16 * L::ldp; }
  __device__ float* stats() { return take<float>(L::stats); }

 private:
  template <class T>
  __device__ T* take(std::size_t bytes) {
    T* p = reinterpret_cast<T*>(at);
    at += bytes;
    return p;
  }
};

/// The element types the fused kernels run in.
template <class E>
inline constexpr bool fused_element = std::is_same_v<E, bf16> || std::is_same_v<E, fp16>;
template <class E>
using WmmaElement = std::conditional_t<std::is_same_v<E, bf16>, __nv_bfloat16, __half>;
using FusedAcc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

/// acc += A · B over `kb` steps of 16: A is 16 rows, row-major from `a` (lda apart); B is 16
/// columns, row-major (B(k, n) = b[k·ldb + n]) or, with `Bt`, stored as the rows of Bᵀ
/// (B(k, n) = b[n·ldb + k]). One warp, all lanes.
template <bool Bt, class E>
__device__ __forceinline__ void fused_mma(FusedAcc& acc, const E* a, int lda, const E* b, int ldb,
                                          int kb) {
  namespace wmma = nvcuda::wmma;
  using W = WmmaElement<E>;
  using LayoutB = std::conditional_t<Bt, wmma::col_major, wmma::row_major>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, W, LayoutB> fb;
  for (int k = 0; k < kb; ++k) {
    wmma::load_matrix_sync(fa, reinterpret_cast<const W*>(a + 16 * k), lda);
    wmma::load_matrix_sync(fb, reinterpret_cast<const W*>(Bt ? b + 16 * k : b + 16 * k * ldb), ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

/// out[16 × 16·nb blocks from `first`] = A · B over HS/16 steps, into fp32 rows `ldo` apart.
template <class E, int HS>
__device__ __forceinline__ void fused_scores(float* out, int ldo, const E* a, const E* bt,
                                             int first, int nb) {
  constexpr int ldt = FusedLayout<E, HS>::ldt;
  for (int n = first; n < nb; ++n) {
    FusedAcc acc;
    nvcuda::wmma::fill_fragment(acc, 0.0f);
    fused_mma<true>(acc, a, ldt, bt + 16 * n * ldt, ldt, HS / 16);
    nvcuda::wmma::store_matrix_sync(out + 16 * n, acc, ldo, nvcuda::wmma::mem_row_major);
  }
}

/// dst[r · ldt + d] = row `first + r` of src (rows `ld` apart), d < HS, zero past row T; 16
/// bytes a thread per step (src rows and base on 16-byte boundaries: the caller checks).
template <class E, int HS>
__device__ __forceinline__ void fused_load_tile(E* dst, const E* src, std::int64_t ld, int first,
                                                int T) {
  constexpr int per_row = HS * static_cast<int>(sizeof(E)) / 16;
  constexpr int ldt = FusedLayout<E, HS>::ldt;
  for (int e = static_cast<int>(threadIdx.x); e < fused_rows * per_row; e += fused_threads) {
    const int r = e / per_row;
    const int c = (e % per_row) * 8;
    const int t = first + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (t < T) v = *reinterpret_cast<const uint4*>(src + static_cast<std::int64_t>(t) * ld + c);
    *reinterpret_cast<uint4*>(dst + r * ldt + c) = v;
  }
}

/// dst[c] = scale · src[c] in E for this lane's half of HS columns (lanes 2r and 2r + 1 share a
/// row), eight elements a store.
template <class E, int HS>
__device__ __forceinline__ void fused_store_row(E* dst, const float* src, float scale, int half) {
  constexpr int n = HS / 2;
  for (int c = half * n; c < half * n + n; c += 8) {
    Run<E, 8> run;
#pragma unroll
    for (int j = 0; j < 8; ++j) store(&run.v[j], src[c + j] * scale);
    *reinterpret_cast<Run<E, 8>*>(dst + c) = run;
  }
}

/// One call's sizes, as the kernels take them.
struct FusedShape {
  int T, C, NH;
  float scale;
  [[nodiscard]] __host__ __device__ int tiles() const { return (T + fused_rows - 1) / fused_rows; }
};

/// Where a block of a fused kernel works: batch b and head h (grid y = b·NH + h), its warp and
/// lane, the row of a warp's 16 this lane keeps (lanes 2r and 2r + 1) and its half of the row,
/// and head h's columns of q (k and v C and 2C further, rows 3C apart) of batch b.
template <class E, int HS>
struct FusedBlock {
  int warp, lane, r, half, bh, b, h;
  std::int64_t ld3;
  const E* x;
  __device__ FusedBlock(const FusedShape& f, const E* qkv)
      : warp(static_cast<int>(threadIdx.x) / 32),
        lane(static_cast<int>(threadIdx.x) % 32),
        r(lane / 2),
        half(lane % 2),
        bh(static_cast<int>(blockIdx.y)),
        b(bh / f.NH),
        h(bh % f.NH),
        ld3(3 * static_cast<std::int64_t>(f.C)),
        x(qkv + static_cast<std::int64_t>(b) * f.T * ld3 + h * HS) {}
  /// Head h's columns of row 0 of batch b in a (B, T, C) tensor (out, dout).
  template <class P>
  __device__ __forceinline__ P* rows_of(P* btc, const FusedShape& f) const {
    return btc + static_cast<std::int64_t>(b) * f.T * f.C + h * HS;
  }
  /// Head h's q columns of token t in dqkv (B, T, 3C).
  __device__ __forceinline__ E* qkv_row(E* dqkv, const FusedShape& f, int t) const {
    return dqkv + (static_cast<std::int64_t>(b) * f.T + t) * ld3 + h * HS;
  }
  /// The key and value tiles from key j0 into sk and sv, between barriers (the previous tile's
  /// readers done before, every thread's loads landed after).
  __device__ __forceinline__ void next_keys(E* sk, E* sv, const FusedShape& f, int j0) const {
    __syncthreads();
    fused_load_tile<E, HS>(sk, x + f.C, ld3, j0, f.T);
    fused_load_tile<E, HS>(sv, x + 2 * f.C, ld3, j0, f.T);
    __syncthreads();
  }
  /// dst's HS columns = scale · acc (the warp's 16 rows), for this lane's row when `keep`:
  /// staged through the warp's fp32 rows `stage`.
  __device__ __forceinline__ void store_acc(float* stage, FusedAcc (&acc)[HS / 16], E* dst,
                                            float scale, bool keep) const {
    constexpr int ldf = FusedLayout<E, HS>::ldf;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      nvcuda::wmma::store_matrix_sync(stage + 16 * n, acc[n], ldf, nvcuda::wmma::mem_row_major);
    }
    __syncwarp();
    if (keep) fused_store_row<E, HS>(dst, stage + r * ldf, scale, half);
  }
};

template <class E, int HS>
__global__ void __launch_bounds__(fused_threads)
    fused_forward_kernel(E* out, float* lse, const E* qkv, FusedShape f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = FusedLayout<E, HS>;
  extern __shared__ __align__(128) unsigned char fused_smem[];
  const FusedBlock<E, HS> at(f, qkv);
  const int warp = at.warp, r = at.r, half = at.half;
  FusedCarve<E, HS> carve{fused_smem};
  E* sq = carve.tile();
  E* sk = carve.tile();
  E* sv = carve.tile();
  float* ss = carve.f32(warp);  // this warp's scores, then its P · V
  float* so = carve.f32(warp);  // this warp's output accumulator
  E* sp = carve.e16(warp);
  const int it = f.tiles() - 1 - static_cast<int>(blockIdx.x);  // the longest rows first
  const int i0 = it * fused_rows;
  fused_load_tile<E, HS>(sq, at.x, at.ld3, i0, f.T);
  for (int e = at.lane; e < 16 * L::ldf; e += 32) so[e] = 0.0f;
  const int t = i0 + 16 * warp + r;
  float* srow = ss + r * L::ldf;
  float* orow = so + r * L::ldf;
  float m = -INFINITY, l = 0.0f;
  for (int jt = 0; jt <= it; ++jt) {
    const int j0 = jt * fused_rows;
    const int nb = jt == it ? warp + 1 : fused_rows / 16;  // key blocks this warp's rows see
    at.next_keys(sk, sv, f, j0);
    fused_scores<E, HS>(ss, L::ldf, sq + 16 * warp * L::ldt, sk, 0, nb);
    __syncwarp();
    // keys j0 + c <= t only (never a block that was skipped: those are past every row's t)
    float mx = -INFINITY;
    for (int c = half; c < fused_rows; c += 2) {
      if (j0 + c <= t) mx = fmaxf(mx, srow[c] * f.scale);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);  // finite: key j0 <= i0 <= t is always visible
    float sum = 0.0f;
    for (int c = half; c < fused_rows; c += 2) {
      const float p = j0 + c <= t ? expf(srow[c] * f.scale - m_new) : 0.0f;
      sum += p;
      store(sp + r * L::ldp + c, p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    l = l * alpha + sum;
    m = m_new;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      FusedAcc acc;
      nvcuda::wmma::fill_fragment(acc, 0.0f);
      fused_mma<false>(acc, sp, L::ldp, sv + 16 * n, L::ldt, nb);
      nvcuda::wmma::store_matrix_sync(ss + 16 * n, acc, L::ldf, nvcuda::wmma::mem_row_major);
    }
    __syncwarp();
    for (int c = half; c < HS; c += 2) orow[c] = orow[c] * alpha + srow[c];
    __syncwarp();
  }
  if (t < f.T) {
    fused_store_row<E, HS>(at.rows_of(out, f) + static_cast<std::int64_t>(t) * f.C, orow, 1.0f / l,
                           half);
    if (half == 0) lse[static_cast<std::int64_t>(at.bh) * f.T + t] = m + logf(l);
  }
#else
  __trap();  // fused_attention_supports refuses code built for an older GPU
#endif
}

/// dK and dV of one key tile (grid x), the query tiles from the diagonal down; warp w owns keys
/// 16w.. of the tile and computes Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for them, so Pᵀ and dSᵀ come out in
/// its own rows and dV += Pᵀ dO, dK += dSᵀ Q accumulate in its registers.
template <class E, int HS>
__global__ void __launch_bounds__(fused_threads)
    fused_dkdv_kernel(E* dqkv, const E* dout, const E* qkv, const float* lse, const float* delta,
                      FusedShape f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = FusedLayout<E, HS>;
  extern __shared__ __align__(128) unsigned char fused_smem[];
  const FusedBlock<E, HS> at(f, qkv);
  const int warp = at.warp, rk = at.r, half = at.half;
  FusedCarve<E, HS> carve{fused_smem};
  E* sk = carve.tile();
  E* sv = carve.tile();
  E* sq = carve.tile();
  E* sdo = carve.tile();
  float* st = carve.f32(warp);
  float* sdp = carve.f32(warp);
  E* sp = carve.e16(warp);
  E* sds = carve.e16(warp);
  float* sl = carve.stats();
  float* sd = sl + fused_rows;
  const int jt = static_cast<int>(blockIdx.x);  // the first key tiles have the most query tiles
  const int j0 = jt * fused_rows;
  const E* dob = at.rows_of(dout, f);
  const float* lse_h = lse + static_cast<std::int64_t>(at.bh) * f.T;
  const float* d_h = delta + static_cast<std::int64_t>(at.bh) * f.T;
  fused_load_tile<E, HS>(sk, at.x + f.C, at.ld3, j0, f.T);
  fused_load_tile<E, HS>(sv, at.x + 2 * f.C, at.ld3, j0, f.T);
  FusedAcc dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) {
    nvcuda::wmma::fill_fragment(dk[n], 0.0f);
    nvcuda::wmma::fill_fragment(dv[n], 0.0f);
  }
  const int key = j0 + 16 * warp + rk;
  for (int it = jt; it < f.tiles(); ++it) {
    const int i0 = it * fused_rows;
    const int first = it == jt ? warp : 0;  // query blocks wholly before this warp's keys: skipped
    __syncthreads();
    fused_load_tile<E, HS>(sq, at.x, at.ld3, i0, f.T);
    fused_load_tile<E, HS>(sdo, dob, f.C, i0, f.T);
    for (int e = static_cast<int>(threadIdx.x); e < fused_rows; e += fused_threads) {
      const int t = i0 + e;
      sl[e] = t < f.T ? lse_h[t] : 0.0f;
      sd[e] = t < f.T ? d_h[t] : 0.0f;
    }
    __syncthreads();
    fused_scores<E, HS>(st, L::ldf, sk + 16 * warp * L::ldt, sq, first, fused_rows / 16);
    fused_scores<E, HS>(sdp, L::ldf, sv + 16 * warp * L::ldt, sdo, first, fused_rows / 16);
    __syncwarp();
    // queries t >= key only (the skipped blocks hold queries before every key of this warp)
    for (int c = half; c < fused_rows; c += 2) {
      const int t = i0 + c;
      float p = 0.0f, ds = 0.0f;
      if (t >= key && t < f.T) {
        p = expf(st[rk * L::ldf + c] * f.scale - sl[c]);
        ds = p * (sdp[rk * L::ldf + c] - sd[c]);
      }
      store(sp + rk * L::ldp + c, p);
      store(sds + rk * L::ldp + c, ds);
    }
    __syncwarp();
    const int kb = fused_rows / 16 - first;
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      fused_mma<false>(dv[n], sp + 16 * first, L::ldp, sdo + 16 * first * L::ldt + 16 * n, L::ldt,
                       kb);
      fused_mma<false>(dk[n], sds + 16 * first, L::ldp, sq + 16 * first * L::ldt + 16 * n, L::ldt,
                       kb);
    }
  }
  E* row = at.qkv_row(dqkv, f, min(key, f.T - 1));
  at.store_acc(st, dk, row + f.C, f.scale, key < f.T);
  at.store_acc(sdp, dv, row + 2 * f.C, 1.0f, key < f.T);
#else
  __trap();
#endif
}

/// dQ of one query tile (grid x, longest first), the key tiles up to the diagonal in ascending
/// order: S and dP recomputed, dS = P ∘ (dP − D) in E, dQ += dS K in the warp's registers.
template <class E, int HS>
__global__ void __launch_bounds__(fused_threads)
    fused_dq_kernel(E* dqkv, const E* dout, const E* qkv, const float* lse, const float* delta,
                    FusedShape f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = FusedLayout<E, HS>;
  extern __shared__ __align__(128) unsigned char fused_smem[];
  const FusedBlock<E, HS> at(f, qkv);
  const int warp = at.warp, r = at.r, half = at.half;
  FusedCarve<E, HS> carve{fused_smem};
  E* sq = carve.tile();
  E* sdo = carve.tile();
  E* sk = carve.tile();
  E* sv = carve.tile();
  float* ss = carve.f32(warp);
  float* sdp = carve.f32(warp);
  E* sds = carve.e16(warp);
  const int it = f.tiles() - 1 - static_cast<int>(blockIdx.x);
  const int i0 = it * fused_rows;
  fused_load_tile<E, HS>(sq, at.x, at.ld3, i0, f.T);
  fused_load_tile<E, HS>(sdo, at.rows_of(dout, f), f.C, i0, f.T);
  const int t = i0 + 16 * warp + r;
  const float Lt = t < f.T ? lse[static_cast<std::int64_t>(at.bh) * f.T + t] : 0.0f;
  const float Dt = t < f.T ? delta[static_cast<std::int64_t>(at.bh) * f.T + t] : 0.0f;
  FusedAcc dq[HS / 16];
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) nvcuda::wmma::fill_fragment(dq[n], 0.0f);
  for (int jt = 0; jt <= it; ++jt) {
    const int j0 = jt * fused_rows;
    const int nb = jt == it ? warp + 1 : fused_rows / 16;
    at.next_keys(sk, sv, f, j0);
    fused_scores<E, HS>(ss, L::ldf, sq + 16 * warp * L::ldt, sk, 0, nb);
    fused_scores<E, HS>(sdp, L::ldf, sdo + 16 * warp * L::ldt, sv, 0, nb);
    __syncwarp();
    for (int c = half; c < fused_rows; c += 2) {
      float ds = 0.0f;
      if (j0 + c <= t && t < f.T) {
        const float p = expf(ss[r * L::ldf + c] * f.scale - Lt);
        ds = p * (sdp[r * L::ldf + c] - Dt);
      }
      store(sds + r * L::ldp + c, ds);
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) fused_mma<false>(dq[n], sds, L::ldp, sk + 16 * n, L::ldt, nb);
  }
  at.store_acc(ss, dq, at.qkv_row(dqkv, f, min(t, f.T - 1)), f.scale, t < f.T);
#else
  __trap();
#endif
}

/// Dynamic shared memory of a fused kernel with `regions` (tiles, fp32, 16-bit, row vectors),
/// opted in past the 48 KiB default.
template <class E, int HS, class Kernel>
std::size_t fused_shared_bytes(Kernel kernel, const int (&regions)[4]) {
  const std::size_t bytes =
      FusedLayout<E, HS>::bytes(regions[0], regions[1], regions[2], regions[3]);
  if (bytes > 48 * 1024) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)),
               "cudaFuncSetAttribute (fused attention shared memory)");
  }
  return bytes;
}

/// Calls f(std::integral_constant<int, HS>) for the head sizes the fused kernels are built for;
/// false for any other.
template <class F>
bool fused_head_dispatch(std::int64_t hs, F&& f) {
  switch (hs) {
    case 16: f(std::integral_constant<int, 16>{}); return true;
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

/// Dynamic shared memory a block of the largest fused kernel takes at head size HS (the dK/dV
/// kernel's, at every head size).
template <class E, int HS>
constexpr std::size_t fused_shared_need() {
  using L = FusedLayout<E, HS>;
  std::size_t need = 0;
  for (const auto& r : {fused_forward_regions, fused_dkdv_regions, fused_dq_regions}) {
    const std::size_t b = L::bytes(r[0], r[1], r[2], r[3]);
    need = b > need ? b : need;
  }
  return need;
}

/// Why the fused kernels refuse a call: a fixed reason, or the shared memory a block needs
/// against what the GPU allows; empty when they take it. Made without allocating (the layers
/// ask at every call); `text()` writes the message when one is shown.
struct FusedRefusal {
  const char* why = nullptr;
  std::size_t need = 0;  // with `why` null and need > 0: short of shared memory
  std::int64_t hs = 0, optin = 0;
  FusedRefusal() = default;
  FusedRefusal(const char* reason) : why(reason) {}  // NOLINT(google-explicit-constructor)
  [[nodiscard]] bool empty() const { return why == nullptr && need == 0; }
  [[nodiscard]] std::string text() const {
    if (why != nullptr) return why;
    if (need == 0) return {};
    return fourway::detail::cat("the kernels need ", need,
                                " bytes of shared memory a block at head size ", hs,
                                " and this GPU allows ", optin);
  }
};

/// Whether a GPU that lets a block opt in to `optin` bytes of shared memory runs the fused
/// kernels at head size hs: refused, naming both sizes, when it is short. Compute capability
/// 8.6 and 8.9 allow 99 KiB, below what head size 128 needs; 8.0 allows 163 KiB and 9.0 227 KiB.
template <class E>
FusedRefusal fused_shared_refusal(std::int64_t hs, std::int64_t optin) {
  std::size_t need = 0;
  fused_head_dispatch(hs, [&](auto head) { need = fused_shared_need<E, decltype(head)::value>(); });
  if (need <= static_cast<std::size_t>(optin)) return {};
  FusedRefusal r;
  r.need = need;
  r.hs = hs;
  r.optin = optin;
  return r;
}

/// Why this device cannot run the fused kernels of E for head size hs, or empty: compute
/// capability 8.0 or later, a binary built for 8.0 or later (the kernels' bodies need WMMA in
/// 16-bit types), and the shared memory a block opts in to.
template <class E>
FusedRefusal fused_device_refusal(const Context<Cuda>& ctx, std::int64_t hs) {
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.device()),
             "cudaDeviceGetAttribute (compute capability)");
  const char* const old = "the GPU (or the code built for it) is older than compute capability 8.0";
  if (major < 8) return old;  // asked first: an older GPU may have no image of the kernels at all
  int built = 0;
  fused_head_dispatch(hs, [&](auto head) {
    // the binary's version is one per process: asked once (the layers ask at every call)
    static const int version = [] {
      cudaFuncAttributes attr{};
      check_cuda(cudaFuncGetAttributes(&attr, fused_forward_kernel<E, decltype(head)::value>),
                 "cudaFuncGetAttributes (fused attention)");
      return attr.binaryVersion;
    }();
    built = version;
  });
  if (built < 80) return old;
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device()),
             "cudaDeviceGetAttribute (shared memory a block opts in to)");
  return fused_shared_refusal<E>(hs, optin);
}

/// The checks past the element type (E bf16 or fp16): the device is asked last, so shapes are
/// refused without a GPU.
template <class E, class... Ptr>
FusedRefusal fused_shape_refusal(const Context<Cuda>* ctx, std::int64_t B, std::int64_t T,
                                 std::int64_t C, std::int64_t NH, const Ptr*... ptrs) {
  if (NH <= 0 || C % NH != 0) return "C is not a multiple of NH";
  const std::int64_t hs = C / NH;
  if (hs != 16 && hs != 32 && hs != 64 && hs != 128)
    return "the head size is not 16, 32, 64 or 128";
  if (!(aligned16(ptrs) && ...)) return "a pointer is not on a 16-byte boundary";
  if (B * NH > 65535) return "B * NH is over 65535 (the grid's y)";
  if (T > INT_MAX / (3 * C)) return "T * 3C does not fit 32 bits";
  return ctx == nullptr ? FusedRefusal{} : fused_device_refusal<E>(*ctx, hs);
}

/// Why the fused kernels refuse this call (a message), or empty when they take it.
template <class E, class... Ptr>
FusedRefusal fused_refusal(const Context<Cuda>* ctx, std::int64_t B, std::int64_t T, std::int64_t C,
                           std::int64_t NH, const Ptr*... ptrs) {
  if constexpr (!fused_element<E>) {
    return "the element type is not bf16 or fp16";
  } else {
    return fused_shape_refusal<E>(ctx, B, T, C, NH, ptrs...);
  }
}

inline FusedShape fused_shape(std::int64_t T, std::int64_t C, std::int64_t NH) {
  return FusedShape{static_cast<int>(T), static_cast<int>(C), static_cast<int>(NH),
                    1.0f / std::sqrt(static_cast<float>(C / NH))};
}

/// Throws the ShapeError naming why the fused kernels refuse a call (`why` from fused_refusal).
inline void refuse_fused(const FusedRefusal& why, const char* entry, std::int64_t B, std::int64_t T,
                         std::int64_t C, std::int64_t NH) {
  throw ShapeError(fourway::detail::cat(
      "fourway: the fused attention cannot take B=", B, ", T=", T, ", C=", C, ", NH=", NH, ": ",
      why.text(), "; run the blockwise path (", entry, " without set_fused_attention)"));
}

/// One fused kernel on the context's stream: its shared memory (`regions`) opted in, a block per
/// tile of f and (batch, head) of the B·NH, the launch checked (`what` names it).
template <class E, int HS, class Kernel, class... Args>
void fused_run(const Context<Cuda>& ctx, Kernel kernel, const int (&regions)[4],
               const FusedShape& f, std::int64_t BNH, const char* what, Args... args) {
  const dim3 grid(static_cast<unsigned>(f.tiles()), static_cast<unsigned>(BNH));
  const std::size_t smem = fused_shared_bytes<E, HS>(kernel, regions);
  kernel<<<grid, fused_threads, smem, ctx.stream()>>>(args...);
  check_cuda(cudaGetLastError(), what);
}

/// The forward's launch, for a call fused_refusal has taken.
template <class E>
void fused_forward_launch(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                          std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  if (B * T == 0) return;
  const FusedShape f = fused_shape(T, C, NH);
  fused_head_dispatch(C / NH, [&](auto head) {
    constexpr int HS = decltype(head)::value;
    fused_run<E, HS>(ctx, fused_forward_kernel<E, HS>, fused_forward_regions, f, B * NH,
                     "fused attention forward launch", out, lse, qkv, f);
  });
}

/// The backward's launches (D, then dK/dV, then dQ), for a call fused_refusal has taken.
template <class E>
void fused_backward_launch(const Context<Cuda>& ctx, E* dqkv, float* delta, const E* dout,
                           const E* qkv, const E* out, const float* lse, std::int64_t B,
                           std::int64_t T, std::int64_t C, std::int64_t NH) {
  if (B * T == 0) return;
  launch_flash_delta(ctx, delta, dout, out, B, flash_shape(B, T, C, NH));
  const FusedShape f = fused_shape(T, C, NH);
  fused_head_dispatch(C / NH, [&](auto head) {
    constexpr int HS = decltype(head)::value;
    fused_run<E, HS>(ctx, fused_dkdv_kernel<E, HS>, fused_dkdv_regions, f, B * NH,
                     "fused attention dK/dV launch", dqkv, dout, qkv, lse, delta, f);
    fused_run<E, HS>(ctx, fused_dq_kernel<E, HS>, fused_dq_regions, f, B * NH,
                     "fused attention dQ launch", dqkv, dout, qkv, lse, delta, f);
  });
}
}  // namespace detail

/// Whether `fused_attention_forward` / `_backward` take this call (see the file comment); the
/// backward passes its six pointers, the forward its three.
template <class E, class... Ptr>
bool fused_attention_supports(const Context<Cuda>& ctx, std::int64_t B, std::int64_t T,
                              std::int64_t C, std::int64_t NH, const Ptr*... ptrs) {
  return detail::fused_refusal<E>(&ctx, B, T, C, NH, ptrs...).empty();
}

/// out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C); causal, scale 1/sqrt(hs). Throws
/// ShapeError naming the reason where `fused_attention_supports` does not hold.
template <floating_dtype E>
void fused_attention_forward(const Context<Cuda>& ctx, E* out, float* lse, const E* qkv,
                             std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  static_assert(detail::fused_element<E>,
                "fourway: the fused attention runs in bf16 or fp16; fp32 "
                "runs the blockwise path");
  if (const auto why = detail::fused_refusal<E>(&ctx, B, T, C, NH, out, qkv); !why.empty()) {
    detail::refuse_fused(why, "flash_attention_forward", B, T, C, NH);
  }
  detail::fused_forward_launch(ctx, out, lse, qkv, B, T, C, NH);
}

/// dqkv (B, T, 3C) (`=`) from dout, qkv, out and lse of the forward; `delta` (B, NH, T) is
/// scratch and ends holding rowsum(dO ∘ O).
template <floating_dtype E>
void fused_attention_backward(const Context<Cuda>& ctx, E* dqkv, float* delta, const E* dout,
                              const E* qkv, const E* out, const float* lse, std::int64_t B,
                              std::int64_t T, std::int64_t C, std::int64_t NH) {
  static_assert(detail::fused_element<E>,
                "fourway: the fused attention runs in bf16 or fp16; fp32 "
                "runs the blockwise path");
  if (const auto why = detail::fused_refusal<E>(&ctx, B, T, C, NH, dqkv, dout, qkv, out);
      !why.empty()) {
    detail::refuse_fused(why, "flash_attention_backward", B, T, C, NH);
  }
  detail::fused_backward_launch(ctx, dqkv, delta, dout, qkv, out, lse, B, T, C, NH);
}

}  // namespace fourway::cuda
