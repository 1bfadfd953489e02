//! The Host backend: 64-byte aligned CPU memory, and the per-rank host context.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/sync_counter.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

struct Host {
  static constexpr std::string_view name = "host";
  static constexpr bool on_device = false;
  static constexpr std::size_t alignment = 64;

  static void* allocate(std::size_t bytes) {
    // aligned_alloc wants a non-zero multiple of the alignment; the padding is not counted.
    const std::size_t padded =
        bytes == 0 ? alignment : (bytes + alignment - 1) / alignment * alignment;
    void* p = padded >= bytes ? std::aligned_alloc(alignment, padded) : nullptr;
    if (p == nullptr) {
      throw OutOfMemory(detail::cat("fourway: host allocation of ", bytes, " B failed"));
    }
    return p;
  }
  static void deallocate(void* p) noexcept { std::free(p); }
};
static_assert(backend<Host>);

/// Per-rank host context: the rank's memory accountant, and the count of synchronising calls
/// (core/sync_counter.hpp: the host makes the same calls the device path makes, so it counts them
/// the same way).
template <>
struct Context<Host> : SyncCounter {
  using backend_type = Host;
  explicit Context(MemoryAccountant& m) : memory_(&m) {}
  [[nodiscard]] MemoryAccountant& memory() const { return *memory_; }
  /// Host work is synchronous; present so code can be written once for both backends. Counted.
  void synchronize() const { note_sync("synchronize"); }

 private:
  MemoryAccountant* memory_;
};

namespace host {
/// dst[0, n) = src[0, n). Regions must not overlap.
template <class T>
void copy(const Context<Host>& /*ctx*/, T* dst, const T* src, std::int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(T));
}
/// p[0, n) = value.
template <class T>
void fill(const Context<Host>& /*ctx*/, T* p, std::int64_t n, T value) {
  std::fill(p, p + n, value);
}
/// Copies host memory into a host buffer (the same call as `cuda::to_host` on the device side,
/// which waits for the stream: counted as a synchronising call).
template <class T>
void to_host(const Context<Host>& ctx, T* dst, const T* src, std::int64_t n) {
  ctx.note_sync("to_host (a copy to the host)");
  copy(ctx, dst, src, n);
}
template <class T>
void from_host(const Context<Host>& ctx, T* dst, const T* src, std::int64_t n) {
  ctx.note_upload("from_host (a copy from host memory)");
  copy(ctx, dst, src, n);
}
}  // namespace host

}  // namespace fourway
