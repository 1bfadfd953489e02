//! BlockCache: the memory blocks a rank's tensors gave back, kept for the next tensor of the same
//! size on the same backend and device, so a training step that repeats the previous step's
//! allocations asks the backend for nothing (no page faults and zeroing on the host, no
//! synchronising `cudaFree` on the GPU).
//!
//! A block is keyed by its backend's release function, its device and its exact byte count. The
//! cache belongs to one rank's `MemoryAccountant` and is guarded by its lock; the accountant still
//! counts only live tensors (a cached block is not "in use"), so every memory law holds as before.
//! Idle blocks are capped (the accountant passes its live peak): a block past the cap goes back to
//! the backend at once. Device blocks are reused in the order of the rank's stream, the only
//! stream its kernels and collectives run on. Under AddressSanitizer an idle host block is
//! poisoned, so a use after free is still reported.
//!
//! Graph blocks: a CUDA graph (backend/capture.hpp) replays the addresses its capture was served,
//! long after the host has freed those tensors. Every block taken or given back while a capture
//! is open is therefore *reserved* for that graph's owner: idle, it serves only a capture (never
//! a tensor made between replays, which a replay would overwrite), it stays past the cap, and
//! `release_all` keeps it, until `unreserve(owner)` when the graph goes (PyTorch keeps a private
//! memory pool per graph for the same reason).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define FOURWAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FOURWAY_ASAN 1
#endif
#endif
#if defined(FOURWAY_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace fourway {

class BlockCache {
 public:
  /// The backend's `deallocate`, which also names the backend in the key.
  using Release = void (*)(void*) noexcept;

  BlockCache() = default;
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache() {
    reserved_.clear();  // the graphs went before the accountant that owns the cache
    release_all(nullptr);
  }

  /// An idle block of exactly `bytes` from `release`'s backend on `device`, or null: one no
  /// graph holds, or inside a capture (`capture_owner` not null) one its graph holds, which then
  /// becomes the owner's too. Another graph's block never serves.
  void* take(Release release, int device, std::size_t bytes, bool host_memory,
             const void* capture_owner = nullptr) {
    auto it = idle_.find(Key{release, device, bytes});
    if (it != idle_.end()) {
      auto& blocks = it->second;
      for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
        void* p = *b;
        const auto held = reserved_.find(p);
        if (held != reserved_.end() && held->second != capture_owner) continue;
        blocks.erase(std::next(b).base());
        idle_bytes_ -= bytes;
        ++hits_;
        if (capture_owner != nullptr) reserved_[p] = capture_owner;
        if (host_memory) unpoison(p, bytes);
        return p;
      }
    }
    ++misses_;
    return nullptr;
  }

  /// Keeps block `p` of `bytes` while the idle bytes stay within `cap` (a graph's block always);
  /// false: the caller gives it back to the backend. Inside a capture (`capture_owner` not null)
  /// the block becomes the owner's.
  bool give(Release release, int device, std::size_t bytes, void* p, bool host_memory,
            std::size_t cap, const void* capture_owner = nullptr) {
    if (capture_owner != nullptr) reserved_[p] = capture_owner;
    if (!reserved_.contains(p) && (!enabled_ || idle_bytes_ + bytes > cap)) return false;
    idle_[Key{release, device, bytes}].push_back(p);
    idle_bytes_ += bytes;
    if (host_memory) poison(p, bytes);
    return true;
  }

  /// Whether a graph holds block `p` (taken or given back inside its capture); `owner`'s graph
  /// when `owner` is not null.
  [[nodiscard]] bool reserved(const void* p, const void* owner = nullptr) const {
    const auto it = reserved_.find(const_cast<void*>(p));
    return it != reserved_.end() && (owner == nullptr || it->second == owner);
  }
  /// The blocks `owner`'s graph held are ordinary cached blocks again; how many.
  std::size_t unreserve(const void* owner) {
    return std::erase_if(reserved_, [&](const auto& kv) { return kv.second == owner; });
  }
  /// Blocks a graph holds.
  [[nodiscard]] std::size_t reserved_blocks() const { return reserved_.size(); }

  /// Gives every idle block of `release`'s backend (every backend when null) back; the bytes.
  std::size_t release_all(Release release) {
    std::size_t freed = 0;
    for (auto it = idle_.begin(); it != idle_.end();) {
      const Key& k = it->first;
      if (release != nullptr && k.release != release) {
        ++it;
        continue;
      }
      // a graph's blocks stay: a replay still writes them
      auto& blocks = it->second;
      std::erase_if(blocks, [&](void* p) {
        if (reserved_.contains(p)) return false;
        unpoison(p, k.bytes);
        k.release(p);
        freed += k.bytes;
        idle_bytes_ -= k.bytes;
        return true;
      });
      it = blocks.empty() ? idle_.erase(it) : std::next(it);
    }
    return freed;
  }

  /// Off: every block given back goes to the backend (what is idle now stays until released).
  void set_enabled(bool on) { enabled_ = on; }
  [[nodiscard]] bool enabled() const { return enabled_; }
  [[nodiscard]] std::size_t idle_bytes() const { return idle_bytes_; }
  [[nodiscard]] std::size_t hits() const { return hits_; }
  [[nodiscard]] std::size_t misses() const { return misses_; }

 private:
  struct Key {
    Release release;
    int device;
    std::size_t bytes;
    bool operator<(const Key& o) const {
      const auto a = reinterpret_cast<std::uintptr_t>(release);
      const auto b = reinterpret_cast<std::uintptr_t>(o.release);
      return std::tie(bytes, device, a) < std::tie(o.bytes, o.device, b);
    }
  };
  static void poison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) {
#if defined(FOURWAY_ASAN)
    ASAN_POISON_MEMORY_REGION(p, n);
#endif
  }
  static void unpoison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) {
#if defined(FOURWAY_ASAN)
    ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
  }

  std::map<Key, std::vector<void*>> idle_;
  std::unordered_map<void*, const void*> reserved_;  // graph blocks (idle or live) -> the owner
  std::size_t idle_bytes_ = 0;
  std::size_t hits_ = 0;
  std::size_t misses_ = 0;
  bool enabled_ = true;
};

}  // namespace fourway
