//! The per-step JSON-lines log of a training run: one object per line, flushed every step.
//!
//! `{"step":1,"loss":..,"grad_norm":..,"tokens_per_s":..,"step_ms":..,"lr":..,"skipped":false,
//!   "memory":[<MemoryAccountant::json() of rank 0>, <rank 1>, ...]}`
//! with `model_flops`, `mfu`, `val_loss`, `sample` and `device_memory_bytes` before `memory` when
//! known.
//! Each memory object carries the rank and its current and peak bytes per tag. Floating point
//! values are written with 9 significant digits (round-trips a float), so the log is exact
//! enough to compare runs at 1e-7; non-finite values are written as `null` (JSON has no inf).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"

namespace fourway {

/// What one optimizer step reports.
struct StepRecord {
  std::int64_t step = 0;      // 1-based
  double loss = 0.0;          // mean cross-entropy of the global batch
  double grad_norm = 0.0;     // global L2 norm before clipping
  double tokens_per_s = 0.0;  // global batch tokens / step time
  double step_ms = 0.0;
  double lr = 0.0;
  bool skipped = false;               // fp16: the step found inf/NaN and changed nothing
  double model_flops = 0.0;           // of the step, by the caller's formula (0: not given)
  double mfu = -1.0;                  // model FLOPs / (step time x peak FLOP/s); < 0: no peak known
  double device_memory_bytes = -1.0;  // in use on the rank's GPU; < 0: not on a GPU
  double val_loss = -1.0;             // mean loss of the validation batches; < 0: not evaluated
  std::string sample;                 // text generated after the step (--sample-tokens); "": none
};

namespace detail {
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
/// `text` as a JSON string, quotes included: `"` and `\` escaped, control characters and
/// bytes of ill-formed UTF-8 as \uXXXX (a byte 0x80-0xFF that is not part of a well-formed
/// character as its code point, so any bytes give valid JSON).
inline std::string json_string(const std::string& text) {
  std::string out = "\"";
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    std::size_t len = c < 0x80         ? 1
                      : (c >> 5) == 6  ? 2
                      : (c >> 4) == 14 ? 3
                      : (c >> 3) == 30 ? 4
                                       : 0;
    bool ok = len > 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (!ok || c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : b;
      ++i;
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out.append(text, i, len);
    i += len;
  }
  return out + "\"";
}
}  // namespace detail

/// One JSON object for `r`, with the memory of each rank in `ranks` (any may be null: skipped).
inline std::string step_json(const StepRecord& r,
                             const std::vector<const MemoryAccountant*>& ranks) {
  std::string s =
      "{\"step\":" + std::to_string(r.step) + ",\"loss\":" + detail::json_number(r.loss) +
      ",\"grad_norm\":" + detail::json_number(r.grad_norm) +
      ",\"tokens_per_s\":" + detail::json_number(r.tokens_per_s) +
      ",\"step_ms\":" + detail::json_number(r.step_ms) + ",\"lr\":" + detail::json_number(r.lr) +
      ",\"skipped\":" + (r.skipped ? "true" : "false");
  if (r.model_flops > 0) s += ",\"model_flops\":" + detail::json_number(r.model_flops);
  if (r.mfu >= 0) s += ",\"mfu\":" + detail::json_number(r.mfu);
  if (r.val_loss >= 0) s += ",\"val_loss\":" + detail::json_number(r.val_loss);
  if (!r.sample.empty()) s += ",\"sample\":" + detail::json_string(r.sample);
  if (r.device_memory_bytes >= 0) {
    s += ",\"device_memory_bytes\":" + detail::json_number(r.device_memory_bytes);
  }
  s += ",\"memory\":[";
  bool first = true;
  for (const auto* m : ranks) {
    if (m == nullptr) continue;
    if (!first) s += ',';
    first = false;
    s += m->json();
  }
  return s + "]}";
}

/// The same with snapshots (every rank's counters, gathered from other processes under MPI).
inline std::string step_json(const StepRecord& r, const std::vector<MemorySnapshot>& ranks) {
  std::vector<const MemoryAccountant*> none;
  std::string s = step_json(r, none);
  s.resize(s.size() - 2);  // "]}"
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + ranks[i].json();
  return s + "]}";
}

/// Appends one line per step to a file (truncated when opened).
class JsonLog {
 public:
  JsonLog() = default;
  explicit JsonLog(const std::filesystem::path& path) : path_(path.string()) {
    out_.open(path, std::ios::trunc);
    check<ConfigError>(out_.good(), "fourway: cannot create the log file ", path_);
  }
  [[nodiscard]] bool is_open() const { return out_.is_open(); }
  void write(const StepRecord& r, const std::vector<const MemoryAccountant*>& ranks) {
    if (!out_.is_open()) return;
    out_ << step_json(r, ranks) << '\n';
    out_.flush();
    check<ConfigError>(out_.good(), "fourway: writing the log file ", path_, " failed");
  }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace fourway
