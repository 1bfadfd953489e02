//! Fused AdamW (Loshchilov & Hutter 2019) with PyTorch's `torch.optim.AdamW` semantics, host side;
//! also defines `AdamWStep` and the per-element update (moments, then parameter) that the CUDA
//! kernel shares, and `AdamWTensor`, one entry of the multi-tensor form `adamw_update_list`.
//!
//! One pass per element, fp32 master weight `p`, moments `m`, `v`:
//! ```
//!   g  = grad * grad_scale                      (loss-scale undo x clip coefficient)
//!   m  = beta1 m + (1 - beta1) g ;  v = beta2 v + (1 - beta2) g^2
//!   p *= 1 - lr * weight_decay                  (decoupled decay; 0 switches it off per tensor)
//!   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)   (eps outside sqrt)
//!   working = p rounded to the working type     (skipped when `working` is null)
//! ```
//! The bias corrections are computed in double once per call, as PyTorch does in Python floats.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

/// One AdamW step's hyper-parameters; `step` counts from 1.
struct AdamWStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  int step = 1;
};

/// One tensor of a multi-tensor AdamW call (`adamw_update_list`): its fp32 master (the working
/// weights themselves in fp32 training, with `working` null), moments, working copy, gradient,
/// size, and whether the step's weight decay applies to it.
template <class T, class G>
struct AdamWTensor {
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  T* working = nullptr;
  const G* grad = nullptr;
  std::int64_t n = 0;
  bool decay = true;
};

namespace detail {
/// The per-call constants of the update, derived from an AdamWStep.
struct AdamWConstants {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, grad_scale;
  float decay;         // 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^t)
  float inv_bc2_sqrt;  // 1 / sqrt(1 - beta2^t)
};

inline AdamWConstants adamw_constants(const AdamWStep& s) {
  check<ConfigError>(s.step >= 1, "fourway: AdamW step counts from 1, got step=", s.step);
  check<ConfigError>(s.beta1 >= 0.0f && s.beta1 < 1.0f && s.beta2 >= 0.0f && s.beta2 < 1.0f,
                     "fourway: AdamW betas must lie in [0, 1), got beta1=", s.beta1,
                     " beta2=", s.beta2);
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), s.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), s.step);
  return AdamWConstants{s.beta1,
                        s.beta2,
                        1.0f - s.beta1,
                        1.0f - s.beta2,
                        s.eps,
                        s.grad_scale,
                        static_cast<float>(1.0 - static_cast<double>(s.lr) * s.weight_decay),
                        static_cast<float>(s.lr / bc1),
                        static_cast<float>(1.0 / std::sqrt(bc2))};
}

/// The moment update of one element: m, v from the gradient.
FOURWAY_HOST_DEVICE inline void adamw_moments(const AdamWConstants& k, float& m, float& v,
                                              float grad) {
  const float g = grad * k.grad_scale;
  m = k.beta1 * m + k.one_minus_beta1 * g;
  v = k.beta2 * v + k.one_minus_beta2 * g * g;
}
/// The parameter update of one element from the updated m and sqrt(v); returns the new weight.
FOURWAY_HOST_DEVICE inline float adamw_param(const AdamWConstants& k, float p, float m,
                                             float sqrt_v) {
  return p * k.decay - k.step_size * m / (sqrt_v * k.inv_bc2_sqrt + k.eps);
}
}  // namespace detail

namespace host {

/// Updates master, m, v (n, fp32) from grad (n) and writes working (n) unless it is null.
template <floating_dtype T, floating_dtype G>
void adamw_update(const Context<Host>& /*ctx*/, float* master, float* m, float* v, T* working,
                  const G* grad, std::int64_t n, const AdamWStep& step) {
  const fourway::detail::AdamWConstants k = fourway::detail::adamw_constants(step);
  // Blocks of 256: moments (vectorised), sqrt of v over the block, then the parameter update.
  constexpr std::int64_t block = 256;
  float root[block];
  for (std::int64_t i0 = 0; i0 < n; i0 += block) {
    const std::int64_t len = n - i0 < block ? n - i0 : block;
    float* mb = m + i0;
    float* vb = v + i0;
    const G* gb = grad + i0;
    for (std::int64_t j = 0; j < len; ++j) {
      fourway::detail::adamw_moments(k, mb[j], vb[j], convert<float>(gb[j]));
      root[j] = vb[j];
    }
    detail::sqrt_block(root, len);
    float* pb = master + i0;
    for (std::int64_t j = 0; j < len; ++j)
      pb[j] = fourway::detail::adamw_param(k, pb[j], mb[j], root[j]);
    if (working != nullptr) {
      for (std::int64_t j = 0; j < len; ++j) working[i0 + j] = convert<T>(pb[j]);
    }
  }
}

/// `adamw_update` of every tensor of the list with `step`, its weight decay applied only where
/// the tensor's `decay` is set: the CUDA twin runs the whole list in one launch per 24 tensors.
template <floating_dtype T, floating_dtype G>
void adamw_update_list(const Context<Host>& ctx, const std::vector<AdamWTensor<T, G>>& list,
                       const AdamWStep& step) {
  AdamWStep plain = step;
  plain.weight_decay = 0.0f;
  for (const auto& t : list) {
    adamw_update(ctx, t.master, t.m, t.v, t.working, t.grad, t.n, t.decay ? step : plain);
  }
}

}  // namespace host
}  // namespace fourway
