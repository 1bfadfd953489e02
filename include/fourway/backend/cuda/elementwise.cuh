//! CUDA element-wise kernels, twins of `host/elementwise.hpp`: residual add, tanh-GELU forward
//! and backward, cast, scale, and the two reductions over a whole buffer (`has_inf_nan`,
//! `sum_squares`) done with `cub::DeviceReduce::TransformReduce` into a device scalar.
//!
//! The reductions return to the host, so they synchronise the context's stream. Their CUB
//! scratch is a workspace tensor counted by the rank's accountant. `sum_squares` accumulates in
//! double, like the host version.
#pragma once

#include <cstdint>
#include <cub/device/device_reduce.cuh>
#include <cuda/std/functional>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/core/tensor.hpp"

namespace fourway::cuda {

namespace detail {
inline constexpr float gelu_scale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float gelu_cubic = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  const float t = tanhf(gelu_scale * (x + gelu_cubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}
__device__ __forceinline__ float gelu_grad(float x) {
  const float t = tanhf(gelu_scale * (x + gelu_cubic * x * x * x));
  const float dt = gelu_scale * (1.0f + 3.0f * gelu_cubic * x * x) * (1.0f - t * t);
  return 0.5f * (1.0f + t) + 0.5f * x * dt;
}

template <class T>
struct IsInfNan {
  __device__ int operator()(T x) const {
    if constexpr (std::is_same_v<T, float>)
      return isfinite(x) ? 0 : 1;
    else if constexpr (std::is_same_v<T, bf16>)
      return (x.bits & 0x7f80u) == 0x7f80u ? 1 : 0;
    else
      return (x.bits & 0x7c00u) == 0x7c00u ? 1 : 0;
  }
};
struct MaxInt {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
template <class T>
struct SquareDouble {
  __device__ double operator()(T x) const {
    const double d = load(&x);
    return d * d;
  }
};

/// cub::DeviceReduce::TransformReduce over p[0, n) into one host value.
template <class R, class T, class Reduce, class Transform>
R device_reduce(const Context<Cuda>& ctx, const T* p, std::int64_t n, Reduce op, Transform tr,
                R init, const char* what) {
  if (n <= 0) return init;
  Tensor<R, Cuda> result({1}, MemTag::workspace, ctx.memory());
  std::size_t temp_bytes = 0;
  check_cuda(cub::DeviceReduce::TransformReduce(nullptr, temp_bytes, p, result.data(), n, op, tr,
                                                init, ctx.stream()),
             what);
  Tensor<std::uint8_t, Cuda> temp({static_cast<std::int64_t>(temp_bytes) + 1}, MemTag::workspace,
                                  ctx.memory());
  check_cuda(cub::DeviceReduce::TransformReduce(temp.data(), temp_bytes, p, result.data(), n, op,
                                                tr, init, ctx.stream()),
             what);
  R host = init;
  to_host(ctx, &host, result.data(), 1);
  return host;
}
}  // namespace detail

/// out = a + b over n elements (out may alias a or b).
template <floating_dtype T>
void residual_forward(const Context<Cuda>& ctx, T* out, const T* a, const T* b, std::int64_t n) {
  detail::for_each(
      ctx, n,
      [=] __device__(std::int64_t i) {
        detail::store(out + i, detail::load(a + i) + detail::load(b + i));
      },
      "residual_forward");
}

/// out = gelu(in) over n elements.
template <floating_dtype T>
void gelu_forward(const Context<Cuda>& ctx, T* out, const T* in, std::int64_t n) {
  detail::for_each(
      ctx, n,
      [=] __device__(std::int64_t i) {
        detail::store(out + i, detail::gelu(detail::load(in + i)));
      },
      "gelu_forward");
}

/// din = gelu'(in) * dout over n elements (din may alias dout).
template <floating_dtype T>
void gelu_backward(const Context<Cuda>& ctx, T* din, const T* in, const T* dout, std::int64_t n) {
  detail::for_each(
      ctx, n,
      [=] __device__(std::int64_t i) {
        detail::store(din + i, detail::gelu_grad(detail::load(in + i)) * detail::load(dout + i));
      },
      "gelu_backward");
}

/// dst = src converted (round to nearest even) over n elements.
template <floating_dtype To, floating_dtype From>
void cast(const Context<Cuda>& ctx, To* dst, const From* src, std::int64_t n) {
  detail::for_each(
      ctx, n, [=] __device__(std::int64_t i) { detail::store(dst + i, detail::load(src + i)); },
      "cast");
}

/// p *= s over n elements.
template <floating_dtype T>
void scale(const Context<Cuda>& ctx, T* p, std::int64_t n, float s) {
  detail::for_each(
      ctx, n, [=] __device__(std::int64_t i) { detail::store(p + i, detail::load(p + i) * s); },
      "scale");
}

/// True when any of the n elements is an infinity or a NaN (synchronises the stream).
template <floating_dtype T>
bool has_inf_nan(const Context<Cuda>& ctx, const T* p, std::int64_t n) {
  return detail::device_reduce<int>(ctx, p, n, detail::MaxInt{}, detail::IsInfNan<T>{}, 0,
                                    "cub::DeviceReduce (has_inf_nan)") != 0;
}

/// Sum of p[i]^2 over n elements, accumulated in double (synchronises the stream).
template <floating_dtype T>
double sum_squares(const Context<Cuda>& ctx, const T* p, std::int64_t n) {
  return detail::device_reduce<double>(ctx, p, n, ::cuda::std::plus<double>{},
                                       detail::SquareDouble<T>{}, 0.0,
                                       "cub::DeviceReduce (sum_squares)");
}

}  // namespace fourway::cuda
