//! Progress of a training run on the terminal, the way PyTorch trainers show it.
//!
//! On a terminal (stdout is a TTY) one line is redrawn in place: a bar, the step, the loss, its
//! moving average (0.9 decay), tokens/s and the time left. Anywhere else (a pipe, a file, CI) each
//! step is one plain line that a script can parse, `step 3/50 | loss 5.123456 | ...`. Messages that
//! must not be overwritten go through `note()`, which ends the bar line first.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "fourway/train/log.hpp"

#if __has_include(<unistd.h>)
#include <unistd.h>
#endif

namespace fourway::tools {

/// True when `f` is a terminal.
inline bool is_terminal(std::FILE* f) {
#if __has_include(<unistd.h>)
  return ::isatty(::fileno(f)) != 0;
#else
  (void)f;
  return false;
#endif
}

class Progress {
 public:
  /// `total` steps; `interactive` chooses the bar (default: whether stdout is a terminal).
  explicit Progress(std::int64_t total, bool interactive = is_terminal(stdout),
                    std::FILE* out = stdout)
      : total_(total), interactive_(interactive), out_(out) {}

  [[nodiscard]] bool interactive() const { return interactive_; }

  void update(const StepRecord& r) {
    elapsed_ms_ += r.step_ms;
    mean_loss_ = r.step == 1 ? r.loss : 0.9 * mean_loss_ + 0.1 * r.loss;
    const double eta_s =
        static_cast<double>(total_ - r.step) * (elapsed_ms_ / static_cast<double>(r.step)) / 1000.0;
    if (!interactive_) {
      std::fprintf(
          out_,
          "step %lld/%lld | loss %.6f | grad_norm %.4f | lr %.3g | %.0f tokens/s | %.1f ms%s%s\n",
          static_cast<long long>(r.step), static_cast<long long>(total_), r.loss, r.grad_norm, r.lr,
          r.tokens_per_s, r.step_ms, extras(r).c_str(), r.skipped ? " | skipped (inf/nan)" : "");
      std::fflush(out_);
      return;
    }
    constexpr int width = 24;
    const int filled = total_ > 0 ? static_cast<int>(width * r.step / total_) : width;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar += std::string(static_cast<std::size_t>(width - filled), '.');
    std::fprintf(out_, "\r\033[K[%s] %lld/%lld loss %.4f (ema %.4f) | %s tok/s%s | eta %s%s",
                 bar.c_str(), static_cast<long long>(r.step), static_cast<long long>(total_),
                 r.loss, mean_loss_, human(r.tokens_per_s).c_str(), extras(r).c_str(),
                 duration(eta_s).c_str(), r.skipped ? " skipped" : "");
    if (r.step >= total_) std::fputc('\n', out_);
    std::fflush(out_);
    open_line_ = r.step < total_;
  }

  /// Prints `text` (one line) without tearing the bar.
  void note(const std::string& text) {
    if (open_line_) std::fputc('\n', out_);
    open_line_ = false;
    std::fprintf(out_, "%s\n", text.c_str());
    std::fflush(out_);
  }

  void finish() {
    if (open_line_) std::fputc('\n', out_);
    open_line_ = false;
    std::fflush(out_);
  }

 private:
  /// " | val 3.141593 | MFU 41.2% | GPU 12.3 GiB": what the step adds when it knows it.
  static std::string extras(const StepRecord& r) {
    std::string s;
    char b[48];
    if (r.val_loss >= 0) {
      std::snprintf(b, sizeof b, " | val %.6f", r.val_loss);
      s += b;
    }
    if (r.mfu >= 0) {
      std::snprintf(b, sizeof b, " | MFU %.1f%%", 100.0 * r.mfu);
      s += b;
    }
    if (r.device_memory_bytes >= 0) {
      std::snprintf(b, sizeof b, " | GPU %.2f GiB", r.device_memory_bytes / (1024.0 * 1024 * 1024));
      s += b;
    }
    return s;
  }
  static std::string human(double v) {
    char b[32];
    if (v >= 1e6)
      std::snprintf(b, sizeof b, "%.2fM", v / 1e6);
    else if (v >= 1e3)
      std::snprintf(b, sizeof b, "%.1fk", v / 1e3);
    else
      std::snprintf(b, sizeof b, "%.0f", v);
    return b;
  }
  static std::string duration(double s) {
    char b[32];
    if (s >= 3600)
      std::snprintf(b, sizeof b, "%dh%02dm", static_cast<int>(s / 3600),
                    static_cast<int>(s / 60) % 60);
    else if (s >= 60)
      std::snprintf(b, sizeof b, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
    else
      std::snprintf(b, sizeof b, "%.0fs", s);
    return b;
  }

  std::int64_t total_;
  bool interactive_;
  std::FILE* out_;
  double elapsed_ms_ = 0.0;
  double mean_loss_ = 0.0;
  bool open_line_ = false;
};

}  // namespace fourway::tools
