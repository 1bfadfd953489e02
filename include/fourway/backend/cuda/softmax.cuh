//! CUDA row softmax, twin of `host/softmax.hpp`: one warp per row, max-subtracted, fp32.
//!
//! The row kernels take a per-row length (`cols` or, for causal attention, `t + 1`), a scale
//! applied to the inputs, and zero the columns past the length — `attention.cuh` uses the same
//! kernels for its masked rows.
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"

namespace fourway::cuda {

namespace detail {
inline constexpr int softmax_warps = 8;

/// out[r, :len) = softmax(scale * in[r, :len)), out[r, len:cols) = 0, with len = cols, or
/// r % T + 1 when `causal_T` > 0.
template <class TO, class TI>
__global__ void softmax_rows_kernel(TO* out, const TI* in, std::int64_t rows, std::int64_t cols,
                                    float scale, std::int64_t causal_T) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * softmax_warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const std::int64_t len = causal_T > 0 ? r % causal_T + 1 : cols;
  const TI* x = in + r * cols;
  float mx = -3.4e38f;
  for (std::int64_t c = lane; c < len; c += 32) mx = fmaxf(mx, scale * load(x + c));
  mx = warp_max(mx);
  float s = 0.0f;
  for (std::int64_t c = lane; c < len; c += 32) s += expf(scale * load(x + c) - mx);
  const float inv = 1.0f / warp_sum(s);
  TO* o = out + r * cols;
  for (std::int64_t c = lane; c < len; c += 32) store(o + c, expf(scale * load(x + c) - mx) * inv);
  for (std::int64_t c = len + lane; c < cols; c += 32) store(o + c, 0.0f);
}

/// din[r, :len) = scale * out * (dout - <dout, out>), din[r, len:cols) = 0 (len as above).
template <class T>
__global__ void softmax_backward_rows_kernel(T* din, const T* out, const T* dout, std::int64_t rows,
                                             std::int64_t cols, float scale,
                                             std::int64_t causal_T) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * softmax_warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const std::int64_t len = causal_T > 0 ? r % causal_T + 1 : cols;
  const T* y = out + r * cols;
  const T* dy = dout + r * cols;
  float dot = 0.0f;
  for (std::int64_t c = lane; c < len; c += 32) dot += load(dy + c) * load(y + c);
  dot = warp_sum(dot);
  T* dx = din + r * cols;
  for (std::int64_t c = lane; c < len; c += 32) {
    store(dx + c, scale * load(y + c) * (load(dy + c) - dot));
  }
  for (std::int64_t c = len + lane; c < cols; c += 32) store(dx + c, 0.0f);
}

template <class TO, class TI>
void softmax_rows(const Context<Cuda>& ctx, TO* out, const TI* in, std::int64_t rows,
                  std::int64_t cols, float scale, std::int64_t causal_T) {
  if (rows <= 0) return;
  softmax_rows_kernel<<<blocks_for(rows, softmax_warps), 256, 0, ctx.stream()>>>(
      out, in, rows, cols, scale, causal_T);
  check_cuda(cudaGetLastError(), "softmax kernel");
}
template <class T>
void softmax_backward_rows(const Context<Cuda>& ctx, T* din, const T* out, const T* dout,
                           std::int64_t rows, std::int64_t cols, float scale,
                           std::int64_t causal_T) {
  if (rows <= 0) return;
  softmax_backward_rows_kernel<<<blocks_for(rows, softmax_warps), 256, 0, ctx.stream()>>>(
      din, out, dout, rows, cols, scale, causal_T);
  check_cuda(cudaGetLastError(), "softmax backward kernel");
}
}  // namespace detail

/// out (rows, cols) = softmax of each row of in; out may alias in.
template <floating_dtype T>
void softmax_forward(const Context<Cuda>& ctx, T* out, const T* in, std::int64_t rows,
                     std::int64_t cols) {
  detail::softmax_rows(ctx, out, in, rows, cols, 1.0f, 0);
}

/// din (rows, cols) = out * (dout - rowsum(dout * out)); din may alias dout.
template <floating_dtype T>
void softmax_backward(const Context<Cuda>& ctx, T* din, const T* out, const T* dout,
                      std::int64_t rows, std::int64_t cols) {
  detail::softmax_backward_rows(ctx, din, out, dout, rows, cols, 1.0f, 0);
}

}  // namespace fourway::cuda
