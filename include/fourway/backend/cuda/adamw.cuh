//! CUDA fused AdamW, twin of `host/adamw.hpp` (which defines `AdamWStep` and the per-element
//! update both sides run): one pass reads grad, master, m, v and writes master, m, v and the
//! 16-bit working copy — the minimum traffic for the update, so it runs at copy bandwidth.
#pragma once

#include <cstdint>

#include "fourway/backend/cuda/common.cuh"
#include "fourway/backend/host/adamw.hpp"

namespace fourway::cuda {

/// Updates master, m, v (n, fp32) from grad (n) and writes working (n) unless it is null.
template <floating_dtype T, floating_dtype G>
void adamw_update(const Context<Cuda>& ctx, float* master, float* m, float* v, T* working,
                  const G* grad, std::int64_t n, const AdamWStep& step) {
  const fourway::detail::AdamWConstants k = fourway::detail::adamw_constants(step);
  detail::for_each(
      ctx, n,
      [=] __device__(std::int64_t i) {
        float mi = m[i];
        float vi = v[i];
        fourway::detail::adamw_moments(k, mi, vi, detail::load(grad + i));
        const float p = fourway::detail::adamw_param(k, master[i], mi, sqrtf(vi));
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        if (working != nullptr) detail::store(working + i, p);
      },
      "adamw_update");
}

}  // namespace fourway::cuda
