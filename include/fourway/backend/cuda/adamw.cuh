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

/// One block updates `adamw_block_elements` of one tensor, each thread `adamw_per_thread` of them
/// a block-width apart: every load of a thread is issued before its first update (one memory
/// round trip, not eight), and the constants live in registers (the tensor's weight decay chosen
/// by value: a reference picking one of two kernel parameters put both in local memory, read at
/// every element).
inline constexpr int adamw_per_thread = static_cast<int>(adamw_block_elements / block_threads);

template <class T, class G>
__global__ void adamw_list_kernel(AdamWList<T, G> list, fourway::detail::AdamWConstants with_decay,
                                  fourway::detail::AdamWConstants plain) {
  const int b = static_cast<int>(blockIdx.x);
  int t = 0;
  while (t + 1 < list.count && list.first_block[t + 1] <= b) ++t;
  fourway::detail::AdamWConstants k = plain;
  if (list.decay[t]) k.decay = with_decay.decay;
  const std::int64_t begin =
      static_cast<std::int64_t>(b - list.first_block[t]) * adamw_block_elements + threadIdx.x;
  const std::int64_t n = list.n[t];
  float* __restrict__ master = list.master[t];
  float* __restrict__ m = list.m[t];
  float* __restrict__ v = list.v[t];
  T* __restrict__ working = list.working[t];
  const G* __restrict__ grad = list.grad[t];
  float mi[adamw_per_thread], vi[adamw_per_thread], gi[adamw_per_thread], pi[adamw_per_thread];
#pragma unroll
  for (int u = 0; u < adamw_per_thread; ++u) {
    const std::int64_t i = begin + std::int64_t{u} * block_threads;
    if (i < n) {
      mi[u] = m[i];
      vi[u] = v[i];
      gi[u] = load(grad + i);
      pi[u] = master[i];
    }
  }
#pragma unroll
  for (int u = 0; u < adamw_per_thread; ++u) {
    const std::int64_t i = begin + std::int64_t{u} * block_threads;
    if (i < n) {
      fourway::detail::adamw_moments(k, mi[u], vi[u], gi[u]);
      const float p = fourway::detail::adamw_param(k, pi[u], mi[u], sqrtf(vi[u]));
      m[i] = mi[u];
      v[i] = vi[u];
      master[i] = p;
      if (working != nullptr) store(working + i, p);
    }
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
