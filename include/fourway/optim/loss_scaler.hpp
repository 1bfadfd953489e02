//! Dynamic loss scaling for fp16 (Micikevicius et al. 2018, "Mixed Precision Training"), with
//! the semantics of PyTorch's `torch.cuda.amp.GradScaler`.
//!
//! The loss is multiplied by `scale()` before backward, so small gradients survive in fp16; the
//! optimizer divides it back out. After each step `update(found_inf)`:
//!   found_inf:  the step was skipped (the caller applies nothing), scale *= backoff (0.5),
//!               the run of clean steps restarts;
//!   clean:      the run grows by one; when it reaches `growth_interval`, scale *= growth (2)
//!               and the run restarts.
//! The scale never goes below `min_scale` (DeepSpeed's `min_loss_scale`; PyTorch has no floor)
//! nor above the largest finite float. `LossScaler::none()` is scale 1, never changing: what
//! fp32 and bf16 use.
#pragma once

#include <cmath>
#include <limits>

#include "fourway/core/error.hpp"

namespace fourway {

struct LossScalerConfig {
  float init_scale = 65536.0f;  // 2^16, PyTorch's default
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;  // clean steps before the scale grows
  float min_scale = 1.0f;

  void validate() const {
    check<ConfigError>(std::isfinite(init_scale) && init_scale > 0.0f,
                       "fourway: loss scale must start finite and > 0, got ", init_scale);
    check<ConfigError>(growth_factor > 1.0f && backoff_factor > 0.0f && backoff_factor < 1.0f,
                       "fourway: loss scaling needs growth > 1 and 0 < backoff < 1, got growth ",
                       growth_factor, " and backoff ", backoff_factor);
    check<ConfigError>(growth_interval >= 1,
                       "fourway: loss-scale growth interval must be >= 1 "
                       "clean steps, got ",
                       growth_interval);
    check<ConfigError>(min_scale > 0.0f && min_scale <= init_scale,
                       "fourway: loss-scale floor must be in (0, init_scale = ", init_scale,
                       "], got ", min_scale);
  }
};

class LossScaler {
 public:
  /// Dynamic scaling (fp16).
  static LossScaler dynamic(const LossScalerConfig& cfg = {}) {
    cfg.validate();
    LossScaler s;
    s.cfg_ = cfg;
    s.enabled_ = true;
    s.scale_ = cfg.init_scale;
    return s;
  }
  /// No scaling: scale 1 forever, `update` only counts (fp32, bf16).
  static LossScaler none() { return LossScaler{}; }

  [[nodiscard]] bool enabled() const { return enabled_; }
  [[nodiscard]] float scale() const { return scale_; }
  /// Clean steps since the last growth or back-off (PyTorch's growth tracker).
  [[nodiscard]] int clean_run() const { return clean_run_; }
  [[nodiscard]] long skipped_steps() const { return skipped_; }
  [[nodiscard]] const LossScalerConfig& config() const { return cfg_; }

  /// Restores the dynamic state saved in a checkpoint (the configuration stays this scaler's).
  void restore(float scale, int clean_run, long skipped) {
    check<CheckpointError>(std::isfinite(scale) && scale > 0.0f && clean_run >= 0 && skipped >= 0,
                           "fourway: a checkpoint's loss scaler state (scale ", scale,
                           ", clean run ", clean_run, ", skipped ", skipped, ") is invalid");
    check<CheckpointError>(enabled_ || scale == 1.0f,
                           "fourway: the checkpoint was saved with loss ", "scale ", scale,
                           " but this run does not scale the loss (fp16 only)");
    scale_ = scale;
    clean_run_ = clean_run;
    skipped_ = skipped;
  }

  /// Records the outcome of one step. Returns true when the step was applied (no overflow).
  bool update(bool found_inf) {
    if (found_inf) {
      ++skipped_;
      clean_run_ = 0;
      if (enabled_) scale_ = std::fmax(scale_ * cfg_.backoff_factor, cfg_.min_scale);
      return false;
    }
    if (!enabled_) return true;
    if (++clean_run_ >= cfg_.growth_interval) {
      const float grown = scale_ * cfg_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      clean_run_ = 0;
    }
    return true;
  }

 private:
  LossScaler() = default;
  LossScalerConfig cfg_{};
  bool enabled_ = false;
  float scale_ = 1.0f;
  int clean_run_ = 0;
  long skipped_ = 0;
};

}  // namespace fourway
