//! CUDA bias kernels, twins of `host/bias.hpp`: `out[r, c] += bias[c]`, and
//! `dbias[c] += sum_r dout[r, c]` as a deterministic column reduction (fp32, fixed order).
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"

namespace fourway::cuda {

template <floating_dtype T>
void bias_add(const Context<Cuda>& ctx, T* out, const T* bias, std::int64_t rows,
              std::int64_t cols) {
  detail::map(
      ctx, rows * cols,
      [=] __device__(std::int64_t i, float x) { return x + detail::load(bias + i % cols); },
      "bias_add", out, static_cast<const T*>(out));
}

template <floating_dtype T>
void bias_backward(const Context<Cuda>& ctx, T* dbias, const T* dout, std::int64_t rows,
                   std::int64_t cols) {
  detail::column_sum(
      ctx, rows, cols,
      [=] __device__(std::int64_t r, std::int64_t c) { return detail::load(dout + r * cols + c); },
      [=] __device__(std::int64_t c, float s) {
        detail::store(dbias + c, detail::load(dbias + c) + s);
      });
}

}  // namespace fourway::cuda
