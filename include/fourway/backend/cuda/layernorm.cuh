//! CUDA LayerNorm, twin of `host/layernorm.hpp`: one warp per row with warp-shuffle reductions
//! (two passes over the row: mean, then the centred variance, as the host does). Backward: one
//! warp per row writes `din`; `dweight`, `dbias` accumulate (`+=`) through the deterministic
//! column reduction, so they add no atomics and no run-to-run noise.
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"

namespace fourway::cuda {

namespace detail {
inline constexpr int ln_warps = 8;  // rows per 256-thread block

/// One warp normalises row r of `in` (lane reads elements lane, lane + 32, ...).
template <class T>
__device__ void layernorm_row(T* out, float* mean, float* rstd, const T* in, const T* weight,
                              const T* bias, std::int64_t r, std::int64_t C, float eps, int lane) {
  const T* x = in + r * C;
  float s = 0.0f;
  for (std::int64_t c = lane; c < C; c += 32) s += load(x + c);
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (std::int64_t c = lane; c < C; c += 32) {
    const float d = load(x + c) - m;
    v += d * d;
  }
  const float rs = rsqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  T* o = out + r * C;
  for (std::int64_t c = lane; c < C; c += 32) {
    store(o + c, (load(x + c) - m) * rs * load(weight + c) + load(bias + c));
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* in,
                                         const T* weight, const T* bias, std::int64_t rows,
                                         std::int64_t C, float eps) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * ln_warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  layernorm_row(out, mean, rstd, in, weight, bias, r, C, eps, lane);
}

/// Row r of res = a + b (rounded to T), then that stored row normalised: each lane reads back
/// only the elements it wrote, so the row needs no synchronisation beyond the warp's.
template <class T>
__global__ void residual_layernorm_forward_kernel(T* res, T* out, float* mean, float* rstd,
                                                  const T* a, const T* b, const T* weight,
                                                  const T* bias, std::int64_t rows, std::int64_t C,
                                                  float eps) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * ln_warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  for (std::int64_t c = lane; c < C; c += 32) {
    store(res + r * C + c, load(a + r * C + c) + load(b + r * C + c));
  }
  __syncwarp();
  layernorm_row(out, mean, rstd, res, weight, bias, r, C, eps, lane);
}

template <class T>
__global__ void layernorm_backward_din_kernel(T* din, const T* dout, const T* in, const T* weight,
                                              const float* mean, const float* rstd,
                                              std::int64_t rows, std::int64_t C, const T* dresid) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * ln_warps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* x = in + r * C;
  const T* dy = dout + r * C;
  const float m = mean[r];
  const float s = rstd[r];
  float a = 0.0f;
  float b = 0.0f;
  for (std::int64_t c = lane; c < C; c += 32) {
    const float dnorm = load(weight + c) * load(dy + c);
    a += dnorm;
    b += dnorm * (load(x + c) - m) * s;
  }
  const float dnorm_mean = warp_sum(a) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(b) / static_cast<float>(C);
  T* dx = din + r * C;
  for (std::int64_t c = lane; c < C; c += 32) {
    const float norm = (load(x + c) - m) * s;
    const float dnorm = load(weight + c) * load(dy + c);
    const float v = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    store(dx + c, dresid != nullptr ? v + load(dresid + r * C + c) : v);
  }
}
}  // namespace detail

/// out (rows, C) = (in - mean) * rstd * weight + bias; mean, rstd (rows) fp32.
template <floating_dtype T>
void layernorm_forward(const Context<Cuda>& ctx, T* out, float* mean, float* rstd, const T* in,
                       const T* weight, const T* bias, std::int64_t rows, std::int64_t C,
                       float eps) {
  if (rows <= 0) return;
  detail::layernorm_forward_kernel<<<detail::blocks_for(rows, detail::ln_warps), 256, 0,
                                     ctx.stream()>>>(out, mean, rstd, in, weight, bias, rows, C,
                                                     eps);
  check_cuda(cudaGetLastError(), "layernorm_forward");
}

/// res (rows, C) = a + b, then out = layernorm(res), in one kernel (twin of
/// `host::residual_layernorm_forward`): a and b are read once, res written once and read back by
/// the thread that wrote it.
template <floating_dtype T>
void residual_layernorm_forward(const Context<Cuda>& ctx, T* res, T* out, float* mean, float* rstd,
                                const T* a, const T* b, const T* weight, const T* bias,
                                std::int64_t rows, std::int64_t C, float eps) {
  if (rows <= 0) return;
  detail::residual_layernorm_forward_kernel<<<detail::blocks_for(rows, detail::ln_warps), 256, 0,
                                              ctx.stream()>>>(res, out, mean, rstd, a, b, weight,
                                                              bias, rows, C, eps);
  check_cuda(cudaGetLastError(), "residual_layernorm_forward");
}

/// din (rows, C) =, dweight (C) +=, dbias (C) += from dout (rows, C) and the saved mean, rstd.
/// With `dresid` (rows, C) din also gets the residual branch's gradient, added in fp32 before
/// din is rounded (the host twin adds it after): one pass where a residual pass followed.
template <floating_dtype T>
void layernorm_backward(const Context<Cuda>& ctx, T* din, T* dweight, T* dbias, const T* dout,
                        const T* in, const T* weight, const float* mean, const float* rstd,
                        std::int64_t rows, std::int64_t C, const T* dresid = nullptr) {
  if (rows <= 0) return;
  detail::layernorm_backward_din_kernel<<<detail::blocks_for(rows, detail::ln_warps), 256, 0,
                                          ctx.stream()>>>(din, dout, in, weight, mean, rstd, rows,
                                                          C, dresid);
  check_cuda(cudaGetLastError(), "layernorm_backward");
  detail::column_sum(
      ctx, rows, C,
      [=] __device__(std::int64_t r, std::int64_t c) {
        return (detail::load(in + r * C + c) - mean[r]) * rstd[r] * detail::load(dout + r * C + c);
      },
      [=] __device__(std::int64_t c, float s) {
        detail::store(dweight + c, detail::load(dweight + c) + s);
      });
  detail::column_sum(
      ctx, rows, C,
      [=] __device__(std::int64_t r, std::int64_t c) { return detail::load(dout + r * C + c); },
      [=] __device__(std::int64_t c, float s) {
        detail::store(dbias + c, detail::load(dbias + c) + s);
      });
}

}  // namespace fourway::cuda
