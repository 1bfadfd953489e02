//! CUDA SwiGLU, twin of `host/swiglu.hpp`: one thread per output element (grid-stride), so the
//! reads of gate, up and dout and the writes are coalesced. Device `expf` against the host's
//! `std::exp`: a few fp32 ulps.
// fourway-requires: cuda
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"

namespace fourway::cuda {

namespace detail {
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }
}  // namespace detail

/// out (rows, F) = silu(in[:, :F]) · in[:, F:], in (rows, 2F).
template <floating_dtype T>
void swiglu_forward(const Context<Cuda>& ctx, T* out, const T* in, std::int64_t rows,
                    std::int64_t F) {
  if (F <= 0) return;
  detail::for_each(
      ctx, rows * F,
      [=] __device__(std::int64_t i) {
        const std::int64_t r = i / F, c = i % F;
        const float g = detail::load(in + r * 2 * F + c);
        const float u = detail::load(in + r * 2 * F + F + c);
        detail::store(out + i, g * detail::sigmoid(g) * u);
      },
      "swiglu_forward");
}

/// din (rows, 2F) = [dgate | dup] from dout (rows, F) and the forward's input.
template <floating_dtype T>
void swiglu_backward(const Context<Cuda>& ctx, T* din, const T* dout, const T* in,
                     std::int64_t rows, std::int64_t F) {
  if (F <= 0) return;
  detail::for_each(
      ctx, rows * F,
      [=] __device__(std::int64_t i) {
        const std::int64_t r = i / F, c = i % F;
        const float g = detail::load(in + r * 2 * F + c);
        const float u = detail::load(in + r * 2 * F + F + c);
        const float d = detail::load(dout + i);
        const float sig = detail::sigmoid(g);
        detail::store(din + r * 2 * F + c, d * u * sig * (1.0f + g * (1.0f - sig)));
        detail::store(din + r * 2 * F + F + c, d * g * sig);
      },
      "swiglu_backward");
}

}  // namespace fourway::cuda
