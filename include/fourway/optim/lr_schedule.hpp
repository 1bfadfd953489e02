//! Learning-rate schedules: constant (the default) or linear warm-up then cosine decay.
//!
//! `at(i)` is the learning rate of optimizer iteration i, counted from 0 (the first call of
//! `Trainer::step` is iteration 0; skipped fp16 steps count too, as with a PyTorch scheduler
//! stepped every iteration). Warm-up + cosine is llm.c's `get_lr` (and nanoGPT's):
//!
//!   i <  warmup:           max_lr * (i + 1) / warmup
//!   warmup <= i < total:   min_lr + 0.5 * (1 + cos(pi * (i - warmup) / (total - warmup))) *
//!   (max_lr - min_lr) i >= total:            min_lr
#pragma once

#include <cmath>
#include <numbers>

#include "fourway/core/error.hpp"

namespace fourway {

class LrSchedule {
 public:
  enum class Kind { constant, warmup_cosine };

  /// The same learning rate at every iteration.
  static LrSchedule constant(float lr) {
    check<ConfigError>(lr >= 0.0f && std::isfinite(lr), "fourway: learning rate ", lr,
                       " must be finite and >= 0");
    LrSchedule s;
    s.max_lr_ = lr;
    s.min_lr_ = lr;
    return s;
  }

  /// Linear warm-up over `warmup` iterations to `max_lr`, cosine decay to `min_lr` at `total`.
  static LrSchedule warmup_cosine(float max_lr, int warmup, int total, float min_lr = 0.0f) {
    check<ConfigError>(
        max_lr >= 0.0f && std::isfinite(max_lr) && min_lr >= 0.0f && min_lr <= max_lr,
        "fourway: warm-up + cosine needs 0 <= min_lr <= max_lr, got min_lr ", min_lr,
        " and max_lr ", max_lr);
    check<ConfigError>(warmup >= 0 && total > warmup,
                       "fourway: warm-up + cosine needs 0 <= "
                       "warmup < total iterations, got warmup ",
                       warmup, " and total ", total, "; raise total or lower warmup");
    LrSchedule s;
    s.kind_ = Kind::warmup_cosine;
    s.max_lr_ = max_lr;
    s.min_lr_ = min_lr;
    s.warmup_ = warmup;
    s.total_ = total;
    return s;
  }

  /// Learning rate of iteration `i` (0-based).
  [[nodiscard]] float at(long i) const {
    if (kind_ == Kind::constant) return max_lr_;
    check<ConfigError>(i >= 0, "fourway: learning-rate iteration ", i, " must be >= 0");
    if (i < warmup_) {
      return static_cast<float>(static_cast<double>(max_lr_) * static_cast<double>(i + 1) /
                                static_cast<double>(warmup_));
    }
    if (i >= total_) return min_lr_;
    const double ratio = static_cast<double>(i - warmup_) / static_cast<double>(total_ - warmup_);
    const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
    return static_cast<float>(min_lr_ + coeff * (static_cast<double>(max_lr_) - min_lr_));
  }

  [[nodiscard]] Kind kind() const { return kind_; }
  [[nodiscard]] float max_lr() const { return max_lr_; }
  [[nodiscard]] float min_lr() const { return min_lr_; }
  [[nodiscard]] int warmup() const { return warmup_; }
  [[nodiscard]] int total() const { return total_; }

 private:
  LrSchedule() = default;
  Kind kind_ = Kind::constant;
  float max_lr_ = 0.0f;
  float min_lr_ = 0.0f;
  int warmup_ = 0;
  int total_ = 0;
};

}  // namespace fourway
