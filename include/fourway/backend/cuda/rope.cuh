//! CUDA rotary position embedding, twin of `host/rope.hpp` (same layout and convention): one
//! thread per (row, head, pair), grid-stride, pairs fastest so the reads of each half of a head
//! are coalesced. The inverse frequencies are computed on the host by the host twin's code and
//! passed by value in the launch, so both sides turn by bitwise the same angles (then device
//! `sincosf` against host `std::cos`/`std::sin`: a few fp32 ulps). CUDA: head_size ≤ 1024.
// fourway-requires: cuda
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/host/rope.hpp"
#include "fourway/core/error.hpp"

namespace fourway::cuda {

namespace detail {
inline constexpr std::int64_t rope_max_half = 512;

/// The inverse frequencies as a kernel parameter (2 KiB, under the 4 KiB parameter limit).
struct RopeFreqs {
  float f[rope_max_half];
};

template <class T>
__global__ void rope_kernel(T* x, std::int64_t rows, std::int64_t seq, std::int64_t row_stride,
                            std::int64_t heads, std::int64_t half, const RopeFreqs freqs,
                            float sign, std::int64_t first_position) {
  const std::int64_t n = rows * heads * half;
  for (std::int64_t idx = thread_index(); idx < n; idx += grid_stride()) {
    const std::int64_t i = idx % half;
    const std::int64_t rh = idx / half;
    const std::int64_t h = rh % heads;
    const std::int64_t r = rh / heads;
    const float angle = static_cast<float>(first_position + r % seq) * freqs.f[i];
    float s, c;
    sincosf(angle, &s, &c);
    s *= sign;
    T* p = x + r * row_stride + h * 2 * half + i;
    const float a = load(p);
    const float b = load(p + half);
    store(p, a * c - b * s);
    store(p + half, b * c + a * s);
  }
}

template <class T>
void rope_launch(const Context<Cuda>& ctx, T* x, std::int64_t rows, std::int64_t seq,
                 std::int64_t row_stride, std::int64_t heads, std::int64_t head_size, float theta,
                 float sign, const char* who, std::int64_t first_position) {
  const auto f = host::detail::rope_inv_freq(rows, seq, row_stride, heads, head_size, theta, who,
                                             first_position);
  const std::int64_t half = head_size / 2;
  check<ShapeError>(half <= rope_max_half, "fourway: the CUDA ", who, " takes head sizes up to ",
                    2 * rope_max_half, ", got head_size=", head_size);
  if (rows == 0) return;
  RopeFreqs freqs{};
  for (std::int64_t i = 0; i < half; ++i) freqs.f[i] = f[static_cast<std::size_t>(i)];
  rope_kernel<<<blocks_for(rows * heads * half), block_threads, 0, ctx.stream()>>>(
      x, rows, seq, row_stride, heads, half, freqs, sign, first_position);
  check_cuda(cudaGetLastError(), who);
}
}  // namespace detail

/// x (rows, row_stride) rotated in place (see host::rope_forward).
template <floating_dtype T>
void rope_forward(const Context<Cuda>& ctx, T* x, std::int64_t rows, std::int64_t seq,
                  std::int64_t row_stride, std::int64_t heads, std::int64_t head_size, float theta,
                  std::int64_t first_position = 0) {
  detail::rope_launch(ctx, x, rows, seq, row_stride, heads, head_size, theta, 1.0f, "rope_forward",
                      first_position);
}

/// dx in place: the transpose rotation (see host::rope_backward).
template <floating_dtype T>
void rope_backward(const Context<Cuda>& ctx, T* dx, std::int64_t rows, std::int64_t seq,
                   std::int64_t row_stride, std::int64_t heads, std::int64_t head_size, float theta,
                   std::int64_t first_position = 0) {
  detail::rope_launch(ctx, dx, rows, seq, row_stride, heads, head_size, theta, -1.0f,
                      "rope_backward", first_position);
}

}  // namespace fourway::cuda
