//! CUDA fused softmax + cross-entropy and its vocabulary-sharded pieces, twins of
//! `host/cross_entropy.hpp` (see there for the all-reduce sequence). One 256-thread block per
//! row, block reductions in a fixed order, fp32. The row is read in 16-byte packs; the fused
//! forward reads it once (maximum and sum of exponentials together, online), the fused backward
//! twice (that, then the gradient written in place).
//!
//! A target outside the vocabulary cannot throw from a kernel; it yields a NaN loss (and NaN
//! gradients for that row), which `has_inf_nan` and the loss scaler see — never a silent value.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/host/cross_entropy.hpp"

namespace fourway::cuda {

namespace detail {
inline constexpr int ce_threads = 256;

/// f(c, x[c]) for this thread's share of the row x[0, n) — and out[c] = that value when f returns
/// one: 16-byte packs (8 bf16 / fp16 or 4 fp32 values a load or store) when the row (and out)
/// start on a 16-byte boundary, thread after thread along the row so a warp reads 512 contiguous
/// bytes; the last n mod pack columns (or a misaligned row) one element a thread. Each thread
/// writes only the columns it read, so out may be x.
template <class T, class F>
__device__ __forceinline__ void row_for_each(const T* x, std::int64_t n, F&& f, T* out = nullptr) {
  constexpr bool writes = !std::is_void_v<std::invoke_result_t<F&, std::int64_t, float>>;
  constexpr int P = Pack<T>::size;
  auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  std::int64_t done = 0;
  if (aligned(x) && (!writes || aligned(out))) {
    const std::int64_t packs = n / P;
    const auto* px = reinterpret_cast<const Pack<T>*>(x);
    for (std::int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      const Pack<T> v = px[i];
      if constexpr (writes) {
        Pack<T> y;
#pragma unroll
        for (int k = 0; k < P; ++k) store(&y.v[k], f(i * P + k, load(&v.v[k])));
        reinterpret_cast<Pack<T>*>(out)[i] = y;
      } else {
#pragma unroll
        for (int k = 0; k < P; ++k) f(i * P + k, load(&v.v[k]));
      }
    }
    done = packs * P;
  }
  for (std::int64_t c = done + threadIdx.x; c < n; c += blockDim.x) {
    if constexpr (writes) {
      store(out + c, f(c, load(x + c)));
    } else {
      f(c, load(x + c));
    }
  }
}

template <class T>
__device__ float block_row_max(const T* x, std::int64_t n, float* shared) {
  float mx = -3.4e38f;
  row_for_each(x, n, [&](std::int64_t, float v) { mx = fmaxf(mx, v); });
  return block_max(mx, shared);
}
template <class T>
__device__ float block_row_sumexp(const T* x, std::int64_t n, float mx, float* shared) {
  float s = 0.0f;
  row_for_each(x, n, [&](std::int64_t, float v) { s += expf(v - mx); });
  return block_sum(s, shared);
}

struct RowMaxSum {
  float max, sum;  ///< the row's maximum and Σ exp(x − max)
};
/// The row's maximum and its sum of exponentials in one read of the row (the online softmax of
/// Milakov & Gimelshein 2018): each thread keeps a running maximum and rescales its sum when the
/// maximum rises; the block then rescales every thread's sum to the block maximum and adds them
/// in a fixed order.
template <class T>
__device__ RowMaxSum block_row_max_sum(const T* x, std::int64_t n, float* shared) {
  float m = -3.4e38f, s = 0.0f;
  row_for_each(x, n, [&](std::int64_t, float v) {
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  });
  const float mx = block_max(m, shared);
  const float sum = block_sum(s * expf(m - mx), shared);
  return {mx, sum};
}

/// dx[0, n) = dloss * (exp(x - mx) / sum - [c == target_local]); in place allowed.
template <class T>
__device__ void block_row_grad(T* dx, const T* x, std::int64_t n, float mx, float sum,
                               std::int64_t target_local, float dloss) {
  const float inv = 1.0f / sum;
  row_for_each(
      x, n,
      [&](std::int64_t c, float v) {
        return dloss * (expf(v - mx) * inv - (c == target_local ? 1.0f : 0.0f));
      },
      dx);
}

template <class T>
__global__ void cross_entropy_forward_kernel(float* losses, const T* logits,
                                             const std::int32_t* targets, std::int64_t V,
                                             std::int64_t ld) {
  __shared__ float shared[32];
  const std::int64_t r = blockIdx.x;
  const T* x = logits + r * ld;
  const RowMaxSum ms = block_row_max_sum(x, V, shared);
  if (threadIdx.x == 0) {
    const std::int32_t t = targets[r];
    losses[r] = (t >= 0 && t < V) ? logf(ms.sum) + ms.max - load(x + t) : nanf("");
  }
}

template <class T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits,
                                              const std::int32_t* targets, std::int64_t V,
                                              float dloss, std::int64_t ld) {
  __shared__ float shared[32];
  const std::int64_t r = blockIdx.x;
  const T* x = logits + r * ld;
  const RowMaxSum ms = block_row_max_sum(x, V, shared);
  __syncthreads();  // every thread has read the row before any writes it (in-place use)
  const std::int32_t t = targets[r];
  block_row_grad(dlogits + r * ld, x, V, ms.max, (t >= 0 && t < V) ? ms.sum : nanf(""), t, dloss);
  for (std::int64_t c = V + threadIdx.x; c < ld; c += blockDim.x) store(dlogits + r * ld + c, 0.0f);
}

template <class T>
__global__ void vocab_local_max_kernel(float* maxes, const T* logits, std::int64_t Vlocal) {
  __shared__ float shared[32];
  const std::int64_t r = blockIdx.x;
  const float mx = block_row_max(logits + r * Vlocal, Vlocal, shared);
  if (threadIdx.x == 0) maxes[r] = mx;
}

template <class T>
__global__ void vocab_local_sumexp_kernel(float* sumexp, const T* logits, const float* maxes,
                                          std::int64_t Vlocal) {
  __shared__ float shared[32];
  const std::int64_t r = blockIdx.x;
  const float s = block_row_sumexp(logits + r * Vlocal, Vlocal, maxes[r], shared);
  if (threadIdx.x == 0) sumexp[r] = s;
}

template <class T>
__global__ void vocab_local_grad_kernel(T* dlogits, const T* logits, const std::int32_t* targets,
                                        const float* maxes, const float* sumexp,
                                        std::int64_t Vlocal, std::int64_t vocab_start,
                                        float dloss) {
  const std::int64_t r = blockIdx.x;
  block_row_grad(dlogits + r * Vlocal, logits + r * Vlocal, Vlocal, maxes[r], sumexp[r],
                 targets[r] - vocab_start, dloss);
}

inline unsigned int row_blocks(std::int64_t rows) {
  check<ShapeError>(rows <= 0x7fffffff, "fourway: cross-entropy rows=", rows, " exceed 2^31 - 1");
  return static_cast<unsigned int>(rows);
}
}  // namespace detail

/// losses (rows) = -log softmax(logits (rows, V))[targets].
template <floating_dtype T>
void cross_entropy_forward(const Context<Cuda>& ctx, float* losses, const T* logits,
                           const std::int32_t* targets, std::int64_t rows, std::int64_t V,
                           std::int64_t ld = 0) {
  if (rows <= 0) return;
  ld = fourway::host::detail::row_stride(V, ld);
  detail::cross_entropy_forward_kernel<<<detail::row_blocks(rows), detail::ce_threads, 0,
                                         ctx.stream()>>>(losses, logits, targets, V, ld);
  check_cuda(cudaGetLastError(), "cross_entropy_forward");
}

/// dlogits (rows, V) = dloss * (softmax(logits) - onehot(targets)); dlogits may alias logits.
/// With a row stride ld > V (a padded vocabulary), columns [V, ld) of dlogits are set to 0.
template <floating_dtype T>
void cross_entropy_backward(const Context<Cuda>& ctx, T* dlogits, const T* logits,
                            const std::int32_t* targets, std::int64_t rows, std::int64_t V,
                            float dloss, std::int64_t ld = 0) {
  if (rows <= 0) return;
  ld = fourway::host::detail::row_stride(V, ld);
  detail::cross_entropy_backward_kernel<<<detail::row_blocks(rows), detail::ce_threads, 0,
                                          ctx.stream()>>>(dlogits, logits, targets, V, dloss, ld);
  check_cuda(cudaGetLastError(), "cross_entropy_backward");
}

template <floating_dtype T>
void vocab_local_max(const Context<Cuda>& ctx, float* maxes, const T* logits, std::int64_t rows,
                     std::int64_t Vlocal) {
  if (rows <= 0) return;
  detail::vocab_local_max_kernel<<<detail::row_blocks(rows), detail::ce_threads, 0, ctx.stream()>>>(
      maxes, logits, Vlocal);
  check_cuda(cudaGetLastError(), "vocab_local_max");
}

template <floating_dtype T>
void vocab_local_sumexp(const Context<Cuda>& ctx, float* sumexp, const T* logits,
                        const float* maxes, std::int64_t rows, std::int64_t Vlocal) {
  if (rows <= 0) return;
  detail::
      vocab_local_sumexp_kernel<<<detail::row_blocks(rows), detail::ce_threads, 0, ctx.stream()>>>(
          sumexp, logits, maxes, Vlocal);
  check_cuda(cudaGetLastError(), "vocab_local_sumexp");
}

template <floating_dtype T>
void vocab_target_logit(const Context<Cuda>& ctx, float* target_logits, const T* logits,
                        const std::int32_t* targets, std::int64_t rows, std::int64_t Vlocal,
                        std::int64_t vocab_start) {
  detail::for_each(
      ctx, rows,
      [=] __device__(std::int64_t r) {
        const std::int64_t t = targets[r] - vocab_start;
        target_logits[r] = (t >= 0 && t < Vlocal) ? detail::load(logits + r * Vlocal + t) : 0.0f;
      },
      "vocab_target_logit");
}

inline void vocab_loss(const Context<Cuda>& ctx, float* losses, const float* maxes,
                       const float* sumexp, const float* target_logits, std::int64_t rows) {
  detail::for_each(
      ctx, rows,
      [=] __device__(std::int64_t r) { losses[r] = logf(sumexp[r]) + maxes[r] - target_logits[r]; },
      "vocab_loss");
}

template <floating_dtype T>
void vocab_local_grad(const Context<Cuda>& ctx, T* dlogits, const T* logits,
                      const std::int32_t* targets, const float* maxes, const float* sumexp,
                      std::int64_t rows, std::int64_t Vlocal, std::int64_t vocab_start,
                      float dloss) {
  if (rows <= 0) return;
  detail::
      vocab_local_grad_kernel<<<detail::row_blocks(rows), detail::ce_threads, 0, ctx.stream()>>>(
          dlogits, logits, targets, maxes, sumexp, Vlocal, vocab_start, dloss);
  check_cuda(cudaGetLastError(), "vocab_local_grad");
}

}  // namespace fourway::cuda
