//! The memory accountant: every byte the library allocates is tagged and counted, per rank.
//!
//! One `MemoryAccountant` belongs to one rank (ranks may be threads of one process, so there is
//! no process-global counter). It keeps current and peak bytes per tag and in total; the peak of
//! the total is the high-water mark of the sum, not the sum of per-tag peaks. Views allocate
//! nothing and are never counted.
//!
//! An optional limit (`set_limit`) caps the rank's total: an allocation that would take the total
//! past it throws `OutOfMemory` naming the rank, the tag, the bytes asked for, the bytes in use per
//! tag and the cap, and changes nothing. `MemorySnapshot` is a copy of the counters that can be
//! sent between processes (18 integers) and printed like the accountant itself.
//!
//! The accountant also keeps the rank's `BlockCache` (core/block_cache.hpp): tensors take blocks
//! from it and give them back to it, so a repeated step makes no backend allocation;
//! `backend_allocations()` counts the blocks that had to come from the backend.
//!
//! On request (`track_blocks(true)`, which the strict world turns on: comm/local/strict.hpp) it
//! also remembers where every live tensor block lies, so `owns(p, bytes)` says whether a range
//! is memory this rank's backend allocated: what NCCL's contract asks of a buffer, checked on the
//! host where every pointer is host memory.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/core/block_cache.hpp"
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

/// The accountant's counters at one moment: what the JSON log and the report print, and what
/// ranks in other processes send each other (`to_words` / `from_words`).
struct MemorySnapshot {
  int rank = 0;
  std::array<std::size_t, mem_tag_count> current{};
  std::array<std::size_t, mem_tag_count> peak{};
  std::size_t total_current = 0;
  std::size_t total_peak = 0;
  std::size_t limit = 0;  // 0: none

  static constexpr int words = 2 * mem_tag_count + 4;
  [[nodiscard]] std::array<std::int64_t, words> to_words() const {
    std::array<std::int64_t, words> w{};
    w[0] = rank;
    constexpr auto tags = static_cast<std::size_t>(mem_tag_count);
    for (std::size_t i = 0; i < tags; ++i) {
      w[1 + i] = static_cast<std::int64_t>(current[i]);
      w[1 + tags + i] = static_cast<std::int64_t>(peak[i]);
    }
    w[words - 3] = static_cast<std::int64_t>(total_current);
    w[words - 2] = static_cast<std::int64_t>(total_peak);
    w[words - 1] = static_cast<std::int64_t>(limit);
    return w;
  }
  static MemorySnapshot from_words(const std::int64_t* w) {
    MemorySnapshot s;
    s.rank = static_cast<int>(w[0]);
    for (int i = 0; i < mem_tag_count; ++i) {
      s.current[i] = static_cast<std::size_t>(w[1 + i]);
      s.peak[i] = static_cast<std::size_t>(w[1 + mem_tag_count + i]);
    }
    s.total_current = static_cast<std::size_t>(w[words - 3]);
    s.total_peak = static_cast<std::size_t>(w[words - 2]);
    s.limit = static_cast<std::size_t>(w[words - 1]);
    return s;
  }

  /// A fixed-width table: one row per tag, current and peak, bytes and MiB.
  [[nodiscard]] std::string table() const {
    std::ostringstream os;
    os << "memory of rank " << rank;
    if (limit > 0) os << " (cap " << limit << " B)";
    os << "\n";
    os << std::left << std::setw(17) << "tag" << std::right << std::setw(16) << "current B"
       << std::setw(16) << "peak B" << std::setw(12) << "peak MiB"
       << "\n";
    auto row = [&](std::string_view name, std::size_t cur, std::size_t pk) {
      os << std::left << std::setw(17) << name << std::right << std::setw(16) << cur
         << std::setw(16) << pk << std::setw(12) << std::fixed << std::setprecision(2)
         << static_cast<double>(pk) / (1024.0 * 1024.0) << "\n";
    };
    for (int i = 0; i < mem_tag_count; ++i) {
      row(mem_tag_name(static_cast<MemTag>(i)), current[i], peak[i]);
    }
    row("total", total_current, total_peak);
    return os.str();
  }

  /// `{"rank":0,"current":{"weights":..,...},"peak":{...},"total_current":..,"total_peak":..}`
  /// (and `"limit":..` when a cap is set).
  [[nodiscard]] std::string json() const {
    std::ostringstream os;
    auto obj = [&](const std::array<std::size_t, mem_tag_count>& v) {
      os << "{";
      for (int i = 0; i < mem_tag_count; ++i) {
        os << (i ? "," : "") << "\"" << mem_tag_name(static_cast<MemTag>(i)) << "\":" << v[i];
      }
      os << "}";
    };
    os << "{\"rank\":" << rank << ",\"current\":";
    obj(current);
    os << ",\"peak\":";
    obj(peak);
    os << ",\"total_current\":" << total_current << ",\"total_peak\":" << total_peak;
    if (limit > 0) os << ",\"limit\":" << limit;
    os << "}";
    return os.str();
  }
};

class MemoryAccountant {
 public:
  explicit MemoryAccountant(int rank = 0) : rank_(rank) {}
  MemoryAccountant(const MemoryAccountant&) = delete;
  MemoryAccountant& operator=(const MemoryAccountant&) = delete;

  /// Counts `bytes` under `tag`; throws `OutOfMemory` (and counts nothing) past the limit.
  void on_alloc(MemTag tag, std::size_t bytes) {
    std::lock_guard lock(mu_);
    const auto i = static_cast<std::size_t>(tag);
    if (limit_ && total_current_ + bytes > *limit_) throw_out_of_memory(tag, bytes);
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
  /// Caps the rank's total bytes at `bytes` (0 removes the cap). Bytes already counted stay.
  void set_limit(std::size_t bytes) {
    std::lock_guard lock(mu_);
    limit_ = bytes > 0 ? std::optional<std::size_t>(bytes) : std::nullopt;
  }
  [[nodiscard]] std::optional<std::size_t> limit() const {
    std::lock_guard lock(mu_);
    return limit_;
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

  // ---- the block cache (core/block_cache.hpp), used by Tensor ---------------------------------
  /// An idle block of exactly `bytes` of the backend `release` belongs to, or null (inside a
  /// capture it becomes the capture's graph's; outside one, no graph's block serves).
  void* reuse_block(BlockCache::Release release, std::size_t bytes, bool host_memory) {
    std::lock_guard lock(mu_);
    return cache_.take(release, device_, bytes, host_memory, capture_owner_);
  }
  /// Keeps a block a tensor gives back (false: the caller frees it). Idle blocks stay within
  /// twice the rank's live peak (blocks of one size cannot serve another, so a step whose sizes
  /// change from unit to unit keeps more than its peak idle between uses); a graph's always stay.
  /// Inside a capture, a block the capture was not served (a tensor made before it) is the
  /// capture's fault (`capture_fault`): a replay would read it after the host reused it.
  bool keep_block(BlockCache::Release release, std::size_t bytes, void* p, bool host_memory,
                  MemTag tag) {
    std::lock_guard lock(mu_);
    if (capture_ != nullptr && capture_fault_.empty() && !cache_.reserved(p, capture_owner_)) {
      capture_fault_ = detail::cat(
          "fourway: rank ", rank_, " frees a tensor of ", bytes, " bytes (", mem_tag_name(tag),
          ") made before ", capture_,
          ": each replay would run the step's work on it again after the host has given its "
          "block to other tensors; free it before the capture, or keep it alive past it");
    }
    return cache_.give(release, device_, bytes, p, host_memory, 2 * total_peak_, capture_owner_);
  }
  /// Gives the idle blocks of one backend (all when null) back to it, but a graph's; the bytes.
  std::size_t release_cached_blocks(BlockCache::Release release = nullptr) {
    std::lock_guard lock(mu_);
    return cache_.release_all(release);
  }
  /// Counts a block the backend had to allocate (a cache miss).
  void note_backend_allocation() {
    std::lock_guard lock(mu_);
    ++backend_allocations_;
  }
  /// Opens (`what` names it in errors) and closes a CUDA graph capture on this rank for the graph
  /// `owner` (backend/capture.hpp): while open, a tensor that the block cache cannot serve is
  /// refused before the backend allocates (`refuse_allocation_in_capture`), and every block taken
  /// or given back becomes the owner's until `release_graph_blocks(owner)`.
  void begin_capture(const char* what, const void* owner) {
    std::lock_guard lock(mu_);
    capture_ = what;
    capture_owner_ = owner;
    capture_fault_.clear();
  }
  void end_capture() {
    std::lock_guard lock(mu_);
    capture_ = nullptr;
    capture_owner_ = nullptr;
  }
  /// What the last capture did that a replay cannot repeat (empty: nothing); see `keep_block`.
  [[nodiscard]] std::string capture_fault() const {
    std::lock_guard lock(mu_);
    return capture_fault_;
  }
  /// The blocks `owner`'s graph held are ordinary cached blocks again (the graph is gone).
  void release_graph_blocks(const void* owner) {
    std::lock_guard lock(mu_);
    cache_.unreserve(owner);
  }
  /// Blocks a graph holds (idle or in a tensor).
  [[nodiscard]] std::size_t graph_blocks() const {
    std::lock_guard lock(mu_);
    return cache_.reserved_blocks();
  }
  /// Throws GraphCaptureError when a capture is open: a block of `bytes` would come from the
  /// backend (cudaMalloc cannot be captured, and a replay would not allocate again).
  void refuse_allocation_in_capture(std::size_t bytes) const {
    std::lock_guard lock(mu_);
    if (capture_ == nullptr) return;
    throw GraphCaptureError(detail::cat(
        "fourway: rank ", rank_, " allocates a new block of ", bytes, " bytes inside ", capture_,
        ": a captured step may not allocate (the block cache holds no idle block of that size); ",
        "run the step once uncaptured first, so that the cache holds its blocks, and keep its "
        "shapes fixed from step to step"));
  }
  /// Blocks allocated by the backend so far; a training step after the first ones adds none.
  [[nodiscard]] std::size_t backend_allocations() const {
    std::lock_guard lock(mu_);
    return backend_allocations_;
  }
  /// Bytes held idle in the block cache (allocated from the backend, in no tensor).
  [[nodiscard]] std::size_t cached_bytes() const {
    std::lock_guard lock(mu_);
    return cache_.idle_bytes();
  }
  /// Off: freed blocks go straight back to the backend (and what is idle is released now).
  void set_block_caching(bool on) {
    std::lock_guard lock(mu_);
    cache_.set_enabled(on);
    if (!on) cache_.release_all(nullptr);
  }
  // ---- live blocks (the strict world's buffer check) --------------------------------------------
  /// Remembers (true) or forgets (false) the live tensor blocks from now on; blocks allocated
  /// before tracking began are not known, so turn it on before the rank allocates.
  void track_blocks(bool on) {
    std::lock_guard lock(mu_);
    tracking_.store(on, std::memory_order_relaxed);
    if (!on) blocks_.clear();
  }
  [[nodiscard]] bool tracks_blocks() const { return tracking_.load(std::memory_order_relaxed); }
  /// A tensor took the block [p, p + bytes) (no-op unless tracking).
  void note_block(const void* p, std::size_t bytes) {
    if (!tracks_blocks() || p == nullptr) return;
    std::lock_guard lock(mu_);
    blocks_[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  }
  /// The tensor holding the block at `p` gave it up (no-op unless tracking).
  void forget_block(const void* p) {
    if (!tracks_blocks()) return;
    std::lock_guard lock(mu_);
    blocks_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  /// Whether [p, p + bytes) lies inside one live block a tensor of this rank owns (tracking on).
  [[nodiscard]] bool owns(const void* p, std::size_t bytes) const {
    std::lock_guard lock(mu_);
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(at);
    if (it == blocks_.begin()) return false;
    --it;
    return at >= it->first && at + bytes <= it->first + it->second;
  }

  /// Starts a new peak measurement from the current state.
  void reset_peak() {
    std::lock_guard lock(mu_);
    peak_ = current_;
    total_peak_ = total_current_;
  }

  [[nodiscard]] MemorySnapshot snapshot() const {
    std::lock_guard lock(mu_);
    return MemorySnapshot{rank_, current_, peak_, total_current_, total_peak_, limit_.value_or(0)};
  }
  /// A fixed-width table: one row per tag, current and peak, bytes and MiB.
  [[nodiscard]] std::string table() const { return snapshot().table(); }
  /// `{"rank":0,"current":{"weights":..,...},"peak":{...},"total_current":..,"total_peak":..}`
  [[nodiscard]] std::string json() const { return snapshot().json(); }

 private:
  [[noreturn]] void throw_out_of_memory(MemTag tag, std::size_t bytes) const {
    std::ostringstream os;
    os << "fourway: out of memory on rank " << rank_ << ": allocating " << bytes << " B of "
       << mem_tag_name(tag) << " would take the rank to " << total_current_ + bytes
       << " B, past its cap of " << *limit_ << " B (" << total_current_ << " B in use:";
    for (int t = 0; t < mem_tag_count; ++t) {
      os << (t ? ", " : " ") << mem_tag_name(static_cast<MemTag>(t)) << " " << current_[t];
    }
    os << "); raise the cap (--memory-cap-gb), shard more (--zero 3, more ranks), or lower the "
          "batch or the model";
    throw OutOfMemory(os.str());
  }

  int rank_;
  int device_ = -1;
  mutable std::mutex mu_;
  std::optional<std::size_t> limit_;
  std::array<std::size_t, mem_tag_count> current_{};
  std::array<std::size_t, mem_tag_count> peak_{};
  std::size_t total_current_ = 0;
  std::size_t total_peak_ = 0;
  std::size_t allocations_ = 0;
  std::size_t backend_allocations_ = 0;
  std::atomic<bool> tracking_{false};
  std::map<std::uintptr_t, std::size_t> blocks_;  // live tensor blocks: start -> bytes
  const char* capture_ = nullptr;        // the open capture's name (begin_capture), or null
  const void* capture_owner_ = nullptr;  // the graph the open capture records
  std::string capture_fault_;            // the open (or last) capture's fault, see keep_block
  BlockCache cache_;  // declared last: its idle blocks go back before the counters vanish
};

}  // namespace fourway
