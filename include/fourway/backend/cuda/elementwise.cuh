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
#include <span>
#include <vector>

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
  detail::map(
      ctx, n, [] __device__(std::int64_t, float x, float y) { return x + y; }, "residual_forward",
      out, a, b);
}

/// out = gelu(in) over n elements.
template <floating_dtype T>
void gelu_forward(const Context<Cuda>& ctx, T* out, const T* in, std::int64_t n) {
  detail::map(
      ctx, n, [] __device__(std::int64_t, float x) { return detail::gelu(x); }, "gelu_forward", out,
      in);
}

/// din = gelu'(in) * dout over n elements (din may alias dout).
template <floating_dtype T>
void gelu_backward(const Context<Cuda>& ctx, T* din, const T* in, const T* dout, std::int64_t n) {
  detail::map(
      ctx, n, [] __device__(std::int64_t, float x, float dy) { return detail::gelu_grad(x) * dy; },
      "gelu_backward", din, in, dout);
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
  detail::map(
      ctx, n, [=] __device__(std::int64_t, float x) { return x * s; }, "scale", p,
      static_cast<const T*>(p));
}

/// True when any of the n elements is an infinity or a NaN (synchronises the stream).
template <floating_dtype T>
bool has_inf_nan(const Context<Cuda>& ctx, const T* p, std::int64_t n) {
  return detail::device_reduce<int>(ctx, p, n, detail::MaxInt{}, detail::IsInfNan<T>{}, 0,
                                    "cub::DeviceReduce (has_inf_nan)") != 0;
}

namespace detail {
/// Tensors per launch of the multi-tensor reduction: their pointers, sizes and first blocks
/// travel as kernel parameters (28 B a tensor), so no table is uploaded.
inline constexpr int list_capacity = 64;
/// Elements one block of `squares_partials_kernel` reduces.
inline constexpr std::int64_t list_block_elements = std::int64_t{block_threads} * 32;

template <class T>
struct TensorList {
  const T* p[list_capacity];
  std::int64_t n[list_capacity];
  int first_block[list_capacity + 1];  // block of this launch where each tensor starts
  int count;
  int partial_base;  // index of this launch's first partial sum
};

/// One partial Σx² (double) per block of `list_block_elements` elements of one tensor.
template <class T>
__global__ void squares_partials_kernel(TensorList<T> list, double* partials) {
  __shared__ double shared[32];
  const int b = static_cast<int>(blockIdx.x);
  int t = 0;
  while (t + 1 < list.count && list.first_block[t + 1] <= b) ++t;
  const std::int64_t begin =
      static_cast<std::int64_t>(b - list.first_block[t]) * list_block_elements;
  const std::int64_t end =
      begin + list_block_elements < list.n[t] ? begin + list_block_elements : list.n[t];
  double s = 0.0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double x = load(list.p[t] + i);
    s += x * x;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partials[list.partial_base + b] = s;
}

/// *acc += scale * Σ x[0, n) in double, by one block in a fixed order (deterministic).
template <class T>
__global__ void sum_into_kernel(double* acc, const T* x, std::int64_t n, double scale) {
  __shared__ double shared[32];
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if constexpr (std::is_same_v<T, double>) {
      s += x[i];
    } else {
      s += static_cast<double>(load(x + i));
    }
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *acc += scale * s;
}
}  // namespace detail

/// *acc += Σ over the list of every element squared, in double; acc is device memory and nothing
/// is read back (no synchronisation). At most `list_capacity` tensors a launch, each cut into
/// blocks of `list_block_elements` whose partial sums go to a workspace; one block then adds the
/// partials in a fixed order, so the result is deterministic. Twin of `host::sum_squares_into`.
template <floating_dtype T>
void sum_squares_into(const Context<Cuda>& ctx, double* acc,
                      const std::vector<std::span<const T>>& list) {
  std::int64_t blocks = 0;
  for (const auto& t : list) {
    blocks += (static_cast<std::int64_t>(t.size()) + detail::list_block_elements - 1) /
              detail::list_block_elements;
  }
  if (blocks == 0) return;
  check<DeviceError>(blocks < (std::int64_t{1} << 31), "fourway: sum_squares_into over ", blocks,
                     " blocks of ", detail::list_block_elements,
                     " elements exceeds a launch; split the list");
  Tensor<double, Cuda> partials(Shape{blocks}, MemTag::workspace, ctx.memory());
  detail::TensorList<T> launch{};
  int base = 0;
  auto flush = [&] {
    if (launch.count == 0) return;
    const int grid = launch.first_block[launch.count];
    detail::squares_partials_kernel<<<grid, detail::block_threads, 0, ctx.stream()>>>(
        launch, partials.data());
    check_cuda(cudaGetLastError(), "sum_squares_into kernel launch");
    base += grid;
    launch = detail::TensorList<T>{};
    launch.partial_base = base;
  };
  for (const auto& t : list) {
    const auto n = static_cast<std::int64_t>(t.size());
    if (n == 0) continue;
    const auto nb =
        static_cast<int>((n + detail::list_block_elements - 1) / detail::list_block_elements);
    if (launch.count == detail::list_capacity ||
        static_cast<std::int64_t>(launch.first_block[launch.count]) + nb > 65535 * 1024) {
      flush();
    }
    launch.p[launch.count] = t.data();
    launch.n[launch.count] = n;
    launch.first_block[launch.count + 1] = launch.first_block[launch.count] + nb;
    ++launch.count;
  }
  flush();
  detail::sum_into_kernel<<<1, 1024, 0, ctx.stream()>>>(acc, partials.data(), blocks, 1.0);
  check_cuda(cudaGetLastError(), "sum_squares_into final kernel launch");
}

/// *acc += scale * Σ x[0, n) in double; acc is device memory (the step's loss sum), nothing is
/// read back. One block, fixed order: deterministic. Twin of `host::sum_into`.
template <floating_dtype T>
void sum_into(const Context<Cuda>& ctx, double* acc, const T* x, std::int64_t n, double scale) {
  if (n <= 0) return;
  detail::sum_into_kernel<<<1, 1024, 0, ctx.stream()>>>(acc, x, n, scale);
  check_cuda(cudaGetLastError(), "sum_into kernel launch");
}

/// Sum of p[i]^2 over n elements, accumulated in double (synchronises the stream).
template <floating_dtype T>
double sum_squares(const Context<Cuda>& ctx, const T* p, std::int64_t n) {
  return detail::device_reduce<double>(ctx, p, n, ::cuda::std::plus<double>{},
                                       detail::SquareDouble<T>{}, 0.0,
                                       "cub::DeviceReduce (sum_squares)");
}

}  // namespace fourway::cuda
