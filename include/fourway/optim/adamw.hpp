//! AdamW (Loshchilov & Hutter 2019) with the semantics of PyTorch's `torch.optim.AdamW`, on the
//! fp32 state of `MasterState`. Per element, at step t (from 1), with gradient g:
//!
//!   g  = grad * grad_scale            (loss-scale undo x clip coefficient, see below)
//!   p *= 1 - lr * wd                  (wd = weight_decay for 2-D tensors, 0 for the others)
//!   m  = beta1 m + (1 - beta1) g      v = beta2 v + (1 - beta2) g^2
//!   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//!
//! The arithmetic is the fused `adamw_update` kernel, run over every segment by one multi-tensor
//! call (`adamw_update_list`, docs/contracts.md); this header decides what is passed to it: which
//! segments decay, the step number, the working copy to refresh.
//! Folding the loss-scale undo and the clip coefficient into one factor is exact: the loss scale
//! is a power of two, so `g * (c / S)` and PyTorch's `(g / S) * c` round to the same float.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/core/error.hpp"
#include "fourway/optim/lr_schedule.hpp"
#include "fourway/optim/precision.hpp"

namespace fourway {

/// AdamW hyper-parameters; the defaults are PyTorch's. `max_grad_norm <= 0` disables clipping.
struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  float max_grad_norm = 0.0f;

  void validate() const {
    check<ConfigError>(std::isfinite(lr) && lr >= 0.0f,
                       "fourway: AdamW lr must be finite and "
                       ">= 0, got ",
                       lr);
    check<ConfigError>(beta1 >= 0.0f && beta1 < 1.0f && beta2 >= 0.0f && beta2 < 1.0f,
                       "fourway: AdamW betas must lie in [0, 1), got beta1 ", beta1, " and beta2 ",
                       beta2);
    check<ConfigError>(eps > 0.0f && std::isfinite(eps), "fourway: AdamW eps must be > 0, got ",
                       eps);
    check<ConfigError>(weight_decay >= 0.0f && std::isfinite(weight_decay),
                       "fourway: AdamW weight_decay must be >= 0, got ", weight_decay);
    check<ConfigError>(std::isfinite(max_grad_norm),
                       "fourway: max_grad_norm must be finite "
                       "(<= 0 disables clipping), got ",
                       max_grad_norm);
  }
};

/// Where the optimizer reads and writes segment i of a `MasterState`: the working weights
/// (`numel` elements, updated in place in fp32, refreshed from the master otherwise) and the
/// gradients, both starting at the segment's first element.
template <class T>
struct SegmentBinding {
  T* weight = nullptr;
  const T* grad = nullptr;
};

/// The optimizer: hyper-parameters and a learning-rate schedule (constant `lr` by default).
class AdamW {
 public:
  explicit AdamW(AdamWConfig cfg = {}) : cfg_(cfg), schedule_(LrSchedule::constant(cfg.lr)) {
    cfg_.validate();
  }
  AdamW(AdamWConfig cfg, LrSchedule schedule) : cfg_(cfg), schedule_(schedule) { cfg_.validate(); }

  [[nodiscard]] const AdamWConfig& config() const { return cfg_; }
  [[nodiscard]] const LrSchedule& schedule() const { return schedule_; }
  /// Learning rate of iteration `i` (0-based).
  [[nodiscard]] float lr_at(long i) const { return schedule_.at(i); }

  /// One AdamW step over every segment of `state` (bindings[i] is segment i) with learning rate
  /// `lr`; gradients are multiplied by `grad_scale` first. Advances `state.step()`.
  template <class T, class B>
  void update(const Context<B>& ctx, MasterState<T, B>& state,
              std::type_identity_t<std::span<const SegmentBinding<T>>> bindings, float lr,
              float grad_scale) const {
    const auto segs = state.segments();
    check<ConfigError>(bindings.size() == segs.size(), "fourway: AdamW got ", bindings.size(),
                       " segment bindings for an optimizer state of ", segs.size(), " segments");
    AdamWStep s{};
    s.lr = lr;
    s.beta1 = cfg_.beta1;
    s.beta2 = cfg_.beta2;
    s.eps = cfg_.eps;
    s.weight_decay = cfg_.weight_decay;
    s.grad_scale = grad_scale;
    s.step = state.step() + 1;
    // one multi-tensor call: the masters (the weights themselves without a separate master),
    // moments, working weights and gradients of every segment
    using Working = std::conditional_t<MasterState<T, B>::keeps_master, T, float>;
    std::vector<AdamWTensor<Working, T>> list;
    list.reserve(segs.size());
    for (std::size_t i = 0; i < segs.size(); ++i) {
      if (segs[i].numel == 0) continue;
      if constexpr (MasterState<T, B>::keeps_master) {
        list.push_back({state.master(i), state.m(i), state.v(i), bindings[i].weight,
                        bindings[i].grad, segs[i].numel, segs[i].decay});
      } else {
        list.push_back({bindings[i].weight, state.m(i), state.v(i), nullptr, bindings[i].grad,
                        segs[i].numel, segs[i].decay});
      }
    }
    Ops<B>::adamw_update_list(ctx, list, s);
    state.advance();
  }

 private:
  AdamWConfig cfg_;
  LrSchedule schedule_;
};

}  // namespace fourway
