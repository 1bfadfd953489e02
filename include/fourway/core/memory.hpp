//! The memory accountant: every byte the library allocates is tagged and counted, per rank.
//!
//! One `MemoryAccountant` belongs to one rank (ranks may be threads of one process, so there is
//! no process-global counter). It keeps current and peak bytes per tag and in total; the peak of
//! the total is the high-water mark of the sum, not the sum of per-tag peaks. Views allocate
//! nothing and are never counted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>

#include "fourway/core/error.hpp"

namespace fourway {

enum class MemTag : std::uint8_t {
  weights,          // parameters in their working precision
  grads,            // parameter gradients
  master_weights,   // fp32 copy of the parameters kept by mixed precision
  optimizer_state,  // Adam moments
  activations,      // forward values stashed for backward
  comm_buffers,     // buckets, gather and scatter buffers
  workspace,        // scratch
};
inline constexpr int mem_tag_count = 7;

constexpr std::string_view mem_tag_name(MemTag t) {
  switch (t) {
    case MemTag::weights: return "weights";
    case MemTag::grads: return "grads";
    case MemTag::master_weights: return "master_weights";
    case MemTag::optimizer_state: return "optimizer_state";
    case MemTag::activations: return "activations";
    case MemTag::comm_buffers: return "comm_buffers";
    case MemTag::workspace: return "workspace";
  }
  return "?";
}

class MemoryAccountant {
 public:
  explicit MemoryAccountant(int rank = 0) : rank_(rank) {}
  MemoryAccountant(const MemoryAccountant&) = delete;
  MemoryAccountant& operator=(const MemoryAccountant&) = delete;

  void on_alloc(MemTag tag, std::size_t bytes) {
    std::lock_guard lock(mu_);
    const auto i = static_cast<std::size_t>(tag);
    current_[i] += bytes;
    if (current_[i] > peak_[i]) peak_[i] = current_[i];
    total_current_ += bytes;
    if (total_current_ > total_peak_) total_peak_ = total_current_;
    ++allocations_;
  }
  void on_free(MemTag tag, std::size_t bytes) {
    std::lock_guard lock(mu_);
    const auto i = static_cast<std::size_t>(tag);
    check<Error>(current_[i] >= bytes, "fourway: memory accountant of rank ", rank_, " frees ",
                 bytes, " B of tag ", mem_tag_name(tag), " but only ", current_[i],
                 " B are allocated");
    current_[i] -= bytes;
    total_current_ -= bytes;
  }

  [[nodiscard]] int rank() const { return rank_; }
  /// The GPU this rank's device tensors are allocated on, whatever device is current in the
  /// allocating thread; -1 until a `Context<Cuda>` binds one. A rank computes on one GPU, so
  /// binding another device than the bound one throws ConfigError.
  void bind_device(int device) {
    std::lock_guard lock(mu_);
    check<ConfigError>(device_ < 0 || device_ == device, "fourway: the memory accountant of rank ",
                       rank_, " already serves GPU ", device_, " and is now asked for GPU ", device,
                       "; give each GPU's context its own rank (and accountant)");
    device_ = device;
  }
  [[nodiscard]] int device() const {
    std::lock_guard lock(mu_);
    return device_;
  }
  [[nodiscard]] std::size_t current(MemTag t) const {
    std::lock_guard lock(mu_);
    return current_[static_cast<std::size_t>(t)];
  }
  [[nodiscard]] std::size_t peak(MemTag t) const {
    std::lock_guard lock(mu_);
    return peak_[static_cast<std::size_t>(t)];
  }
  [[nodiscard]] std::size_t total_current() const {
    std::lock_guard lock(mu_);
    return total_current_;
  }
  [[nodiscard]] std::size_t total_peak() const {
    std::lock_guard lock(mu_);
    return total_peak_;
  }
  [[nodiscard]] std::size_t allocations() const {
    std::lock_guard lock(mu_);
    return allocations_;
  }
  /// Starts a new peak measurement from the current state.
  void reset_peak() {
    std::lock_guard lock(mu_);
    peak_ = current_;
    total_peak_ = total_current_;
  }

  /// A fixed-width table: one row per tag, current and peak, bytes and MiB.
  [[nodiscard]] std::string table() const {
    std::lock_guard lock(mu_);
    std::ostringstream os;
    os << "memory of rank " << rank_ << "\n";
    os << std::left << std::setw(17) << "tag" << std::right << std::setw(16) << "current B"
       << std::setw(16) << "peak B" << std::setw(12) << "peak MiB"
       << "\n";
    auto row = [&](std::string_view name, std::size_t cur, std::size_t pk) {
      os << std::left << std::setw(17) << name << std::right << std::setw(16) << cur
         << std::setw(16) << pk << std::setw(12) << std::fixed << std::setprecision(2)
         << static_cast<double>(pk) / (1024.0 * 1024.0) << "\n";
    };
    for (int i = 0; i < mem_tag_count; ++i) {
      row(mem_tag_name(static_cast<MemTag>(i)), current_[i], peak_[i]);
    }
    row("total", total_current_, total_peak_);
    return os.str();
  }

  /// `{"rank":0,"current":{"weights":..,...},"peak":{...},"total_current":..,"total_peak":..}`
  [[nodiscard]] std::string json() const {
    std::lock_guard lock(mu_);
    std::ostringstream os;
    auto obj = [&](const std::array<std::size_t, mem_tag_count>& v) {
      os << "{";
      for (int i = 0; i < mem_tag_count; ++i) {
        os << (i ? "," : "") << "\"" << mem_tag_name(static_cast<MemTag>(i)) << "\":" << v[i];
      }
      os << "}";
    };
    os << "{\"rank\":" << rank_ << ",\"current\":";
    obj(current_);
    os << ",\"peak\":";
    obj(peak_);
    os << ",\"total_current\":" << total_current_ << ",\"total_peak\":" << total_peak_ << "}";
    return os.str();
  }

 private:
  int rank_;
  int device_ = -1;
  mutable std::mutex mu_;
  std::array<std::size_t, mem_tag_count> current_{};
  std::array<std::size_t, mem_tag_count> peak_{};
  std::size_t total_current_ = 0;
  std::size_t total_peak_ = 0;
  std::size_t allocations_ = 0;
};

}  // namespace fourway
