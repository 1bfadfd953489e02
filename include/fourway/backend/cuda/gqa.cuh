//! CUDA grouped-query attention packing, twin of `host/gqa.hpp`: one thread per output element
//! (grid-stride), the backward's sums over a group in fp32 in the same order as the host's.
// fourway-requires: cuda
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"

namespace fourway::cuda {

/// qkv (rows, 3·heads·hs) = [q | k repeated | v repeated] from q (rows, heads·hs) and kv (rows,
/// 2·kv_heads·hs) = [k | v]; query head h reads key/value head h / (heads / kv_heads).
template <floating_dtype T>
void gqa_pack(const Context<Cuda>& ctx, T* qkv, const T* q, const T* kv, std::int64_t rows,
              std::int64_t heads, std::int64_t kv_heads, std::int64_t hs) {
  if (rows <= 0 || heads <= 0) return;
  const std::int64_t group = heads / kv_heads;
  const std::int64_t w = heads * hs;
  const std::int64_t kw = kv_heads * hs;
  detail::for_each(
      ctx, rows * 3 * w,
      [=] __device__(std::int64_t i) {
        const std::int64_t r = i / (3 * w);
        const std::int64_t c = i % (3 * w);
        const std::int64_t part = c / w;  // 0 q, 1 k, 2 v
        const std::int64_t h = (c % w) / hs;
        const std::int64_t e = c % hs;
        qkv[i] = part == 0 ? q[r * w + c] : kv[r * 2 * kw + (part - 1) * kw + (h / group) * hs + e];
      },
      "gqa_pack");
}

/// The backward of `gqa_pack`: dq (rows, heads·hs) and dkv (rows, 2·kv_heads·hs), each key/value
/// head the fp32 sum of its group's gradients. Written (=).
template <floating_dtype T>
void gqa_unpack_grad(const Context<Cuda>& ctx, T* dq, T* dkv, const T* dqkv, std::int64_t rows,
                     std::int64_t heads, std::int64_t kv_heads, std::int64_t hs) {
  if (rows <= 0 || heads <= 0) return;
  const std::int64_t group = heads / kv_heads;
  const std::int64_t w = heads * hs;
  const std::int64_t kw = kv_heads * hs;
  detail::for_each(
      ctx, rows * w, [=] __device__(std::int64_t i) { dq[i] = dqkv[(i / w) * 3 * w + i % w]; },
      "gqa_unpack_q");
  detail::for_each(
      ctx, rows * 2 * kw,
      [=] __device__(std::int64_t i) {
        const std::int64_t r = i / (2 * kw);
        const std::int64_t c = i % (2 * kw);
        const std::int64_t part = c / kw;  // 0 k, 1 v
        const std::int64_t j = (c % kw) / hs;
        const std::int64_t e = c % hs;
        float sum = 0.0f;
        for (std::int64_t g = 0; g < group; ++g) {
          sum += detail::load(dqkv + r * 3 * w + (1 + part) * w + (j * group + g) * hs + e);
        }
        detail::store(dkv + i, sum);
      },
      "gqa_unpack_kv");
}

}  // namespace fourway::cuda
