//! Host grouped-query attention packing (Ainslie et al. 2023): `heads` query heads share
//! `kv_heads` key/value heads, query head h reading key/value head h / (heads / kv_heads) (the
//! grouping of Hugging Face Llama's `repeat_kv`). The attention kernels take a packed q|k|v row of
//! equal heads, so the forward repeats each key/value head over its group and the backward sums
//! the repeated heads' gradients back into it.
#pragma once

#include <cstdint>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/dtype.hpp"

namespace fourway::host {

/// qkv (rows, 3·heads·hs) = [q | k repeated | v repeated] from q (rows, heads·hs) and kv (rows,
/// 2·kv_heads·hs) = [k | v].
template <floating_dtype T>
void gqa_pack(const Context<Host>& /*ctx*/, T* qkv, const T* q, const T* kv, std::int64_t rows,
              std::int64_t heads, std::int64_t kv_heads, std::int64_t hs) {
  const std::int64_t group = heads / kv_heads;
  const std::int64_t w = heads * hs;
  const std::int64_t kw = kv_heads * hs;
  for (std::int64_t r = 0; r < rows; ++r) {
    T* out = qkv + r * 3 * w;
    for (std::int64_t e = 0; e < w; ++e) out[e] = q[r * w + e];
    for (std::int64_t h = 0; h < heads; ++h) {
      const T* k = kv + r * 2 * kw + (h / group) * hs;
      for (std::int64_t e = 0; e < hs; ++e) {
        out[w + h * hs + e] = k[e];
        out[2 * w + h * hs + e] = k[kw + e];
      }
    }
  }
}

/// The backward of `gqa_pack`: dq (rows, heads·hs) and dkv (rows, 2·kv_heads·hs) = [dk | dv],
/// each key/value head the fp32 sum of its group's gradients, from dqkv (rows, 3·heads·hs).
/// Written (=).
template <floating_dtype T>
void gqa_unpack_grad(const Context<Host>& /*ctx*/, T* dq, T* dkv, const T* dqkv, std::int64_t rows,
                     std::int64_t heads, std::int64_t kv_heads, std::int64_t hs) {
  const std::int64_t group = heads / kv_heads;
  const std::int64_t w = heads * hs;
  const std::int64_t kw = kv_heads * hs;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* in = dqkv + r * 3 * w;
    for (std::int64_t e = 0; e < w; ++e) dq[r * w + e] = in[e];
    for (std::int64_t part = 0; part < 2; ++part) {  // k, then v
      for (std::int64_t j = 0; j < kv_heads; ++j) {
        for (std::int64_t e = 0; e < hs; ++e) {
          float sum = 0.0f;
          for (std::int64_t g = 0; g < group; ++g) {
            sum += convert<float>(in[(1 + part) * w + (j * group + g) * hs + e]);
          }
          dkv[r * 2 * kw + part * kw + j * hs + e] = convert<T>(sum);
        }
      }
    }
  }
}

}  // namespace fourway::host
