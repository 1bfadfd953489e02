//! CUDA RMSNorm, twin of `host/rmsnorm.hpp`: one warp per row with a warp-shuffle sum of squares
//! (forward) and of w·dy·x (backward, which writes `din`); `dweight` accumulates (`+=`) through
//! the deterministic column reduction, as LayerNorm's does: no atomics, no run-to-run noise.
// fourway-requires: cuda
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/cuda/layernorm.cuh"

namespace fourway::cuda {

namespace detail {
template <class T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* in, const T* weight,
                                       std::int64_t rows, std::int64_t C, float eps) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * ln_warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* x = in + r * C;
  float ss = 0.0f;
  for (std::int64_t c = lane; c < C; c += 32) {
    const float v = load(x + c);
    ss += v * v;
  }
  const float s = rsqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  T* o = out + r * C;
  for (std::int64_t c = lane; c < C; c += 32) store(o + c, load(x + c) * s * load(weight + c));
  if (lane == 0) rstd[r] = s;
}

template <class T>
__global__ void rmsnorm_backward_din_kernel(T* din, const T* dout, const T* in, const T* weight,
                                            const float* rstd, std::int64_t rows, std::int64_t C) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * ln_warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* x = in + r * C;
  const T* dy = dout + r * C;
  const float s = rstd[r];
  float dot = 0.0f;
  for (std::int64_t c = lane; c < C; c += 32) dot += load(weight + c) * load(dy + c) * load(x + c);
  const float k = warp_sum(dot) / static_cast<float>(C) * s * s;
  T* dx = din + r * C;
  for (std::int64_t c = lane; c < C; c += 32) {
    store(dx + c, (load(weight + c) * load(dy + c) - load(x + c) * k) * s);
  }
}
}  // namespace detail

/// out (rows, C) = in · rstd · weight; rstd (rows) fp32 = 1/sqrt(mean(in²) + eps).
template <floating_dtype T>
void rmsnorm_forward(const Context<Cuda>& ctx, T* out, float* rstd, const T* in, const T* weight,
                     std::int64_t rows, std::int64_t C, float eps) {
  if (rows <= 0) return;
  detail::
      rmsnorm_forward_kernel<<<detail::blocks_for(rows, detail::ln_warps), 256, 0, ctx.stream()>>>(
          out, rstd, in, weight, rows, C, eps);
  check_cuda(cudaGetLastError(), "rmsnorm_forward");
}

/// din (rows, C) =, dweight (C) += from dout (rows, C) and the saved rstd.
template <floating_dtype T>
void rmsnorm_backward(const Context<Cuda>& ctx, T* din, T* dweight, const T* dout, const T* in,
                      const T* weight, const float* rstd, std::int64_t rows, std::int64_t C) {
  if (rows <= 0) return;
  detail::rmsnorm_backward_din_kernel<<<detail::blocks_for(rows, detail::ln_warps), 256, 0,
                                        ctx.stream()>>>(din, dout, in, weight, rstd, rows, C);
  check_cuda(cudaGetLastError(), "rmsnorm_backward");
  detail::column_sum(
      ctx, rows, C,
      [=] __device__(std::int64_t r, std::int64_t c) {
        return detail::load(dout + r * C + c) * detail::load(in + r * C + c) * rstd[r];
      },
      [=] __device__(std::int64_t c, float s) {
        detail::store(dweight + c, detail::load(dweight + c) + s);
      });
}

}  // namespace fourway::cuda
