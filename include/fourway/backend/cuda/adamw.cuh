//! CUDA fused AdamW, twin of `host/adamw.hpp` (which defines `AdamWStep` and the per-element
//! update both sides run): one pass reads grad, master, m, v and writes master, m, v and the
//! 16-bit working copy — the minimum traffic for the update, so it runs at copy bandwidth.
//! `adamw_update_list` is the multi-tensor form: up to 24 tensors a launch, their pointers and
//! sizes passed as kernel parameters (nothing uploaded), so a model's step is a handful of
//! launches instead of one per parameter.
#pragma once

#include <cstdint>
#include <vector>

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

namespace detail {
inline constexpr int adamw_list_capacity = 24;
/// Elements one block of `adamw_list_kernel` updates.
inline constexpr std::int64_t adamw_block_elements = std::int64_t{block_threads} * 8;

template <class T, class G>
struct AdamWList {
  float* master[adamw_list_capacity];
  float* m[adamw_list_capacity];
  float* v[adamw_list_capacity];
  T* working[adamw_list_capacity];
  const G* grad[adamw_list_capacity];
  std::int64_t n[adamw_list_capacity];
  int first_block[adamw_list_capacity + 1];
  bool decay[adamw_list_capacity];
  int count;
};

template <class T, class G>
__global__ void adamw_list_kernel(AdamWList<T, G> list, fourway::detail::AdamWConstants with_decay,
                                  fourway::detail::AdamWConstants plain) {
  const int b = static_cast<int>(blockIdx.x);
  int t = 0;
  while (t + 1 < list.count && list.first_block[t + 1] <= b) ++t;
  const fourway::detail::AdamWConstants& k = list.decay[t] ? with_decay : plain;
  const std::int64_t begin =
      static_cast<std::int64_t>(b - list.first_block[t]) * adamw_block_elements;
  const std::int64_t end =
      begin + adamw_block_elements < list.n[t] ? begin + adamw_block_elements : list.n[t];
  float* master = list.master[t];
  float* m = list.m[t];
  float* v = list.v[t];
  T* working = list.working[t];
  const G* grad = list.grad[t];
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float mi = m[i];
    float vi = v[i];
    fourway::detail::adamw_moments(k, mi, vi, load(grad + i));
    const float p = fourway::detail::adamw_param(k, master[i], mi, sqrtf(vi));
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if (working != nullptr) store(working + i, p);
  }
}
}  // namespace detail

/// `adamw_update` of every tensor of the list, the weight decay of `step` only where the tensor's
/// `decay` is set; one launch per 24 tensors. Twin of `host::adamw_update_list`.
template <floating_dtype T, floating_dtype G>
void adamw_update_list(const Context<Cuda>& ctx, const std::vector<AdamWTensor<T, G>>& list,
                       const AdamWStep& step) {
  AdamWStep plain = step;
  plain.weight_decay = 0.0f;
  const auto with_decay = fourway::detail::adamw_constants(step);
  const auto without = fourway::detail::adamw_constants(plain);
  detail::AdamWList<T, G> launch{};
  auto flush = [&] {
    if (launch.count == 0) return;
    detail::adamw_list_kernel<<<launch.first_block[launch.count], detail::block_threads, 0,
                                ctx.stream()>>>(launch, with_decay, without);
    check_cuda(cudaGetLastError(), "adamw_update_list kernel launch");
    launch = detail::AdamWList<T, G>{};
  };
  for (const auto& t : list) {
    if (t.n <= 0) continue;
    const std::int64_t nb = (t.n + detail::adamw_block_elements - 1) / detail::adamw_block_elements;
    if (launch.count == detail::adamw_list_capacity ||
        launch.first_block[launch.count] + nb > (std::int64_t{1} << 30)) {
      flush();
    }
    check<DeviceError>(nb <= (std::int64_t{1} << 30), "fourway: adamw_update_list: a tensor of ",
                       t.n, " elements exceeds one launch; split it");
    const int c = launch.count;
    launch.master[c] = t.master;
    launch.m[c] = t.m;
    launch.v[c] = t.v;
    launch.working[c] = t.working;
    launch.grad[c] = t.grad;
    launch.n[c] = t.n;
    launch.decay[c] = t.decay;
    launch.first_block[c + 1] = launch.first_block[c] + static_cast<int>(nb);
    ++launch.count;
  }
  flush();
}

}  // namespace fourway::cuda
