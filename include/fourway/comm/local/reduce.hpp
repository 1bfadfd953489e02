//! LocalWorld's reduction code on host memory: the fixed-order reduction of one slice over every
//! rank's buffer (`reduce_range`, fp32 accumulation for 16-bit types, non-temporal stores for
//! large results), the balanced split of a count over owners, and the per-rank pointer table.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "fourway/comm/types.hpp"
#include "fourway/core/dtype.hpp"

// In the mode's inline namespace (config.hpp) like every part of LocalWorld: host and CUDA
// units of one program link distinct symbols, never two bodies under one name.
namespace fourway::detail {
FOURWAY_BEGIN_MODE_NAMESPACE

template <class T, class A>
inline A acc_load(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<A>(v);
  } else {
    return convert<A>(v);
  }
}
template <class T, class A>
inline T acc_store(A v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return convert<T>(static_cast<float>(v));
  }
}

/// dst[0, bytes) = src[0, bytes) with non-temporal stores where the CPU has them (SSE2); the
/// caller issues `stream_fence()` before another thread may read dst.
inline void stream_copy(void* dst, const void* src, std::int64_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
#if defined(__SSE2__)
  const auto head = static_cast<std::int64_t>((16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16);
  if (head >= bytes) {
    std::memcpy(d, s, static_cast<std::size_t>(bytes));
    return;
  }
  std::memcpy(d, s, static_cast<std::size_t>(head));
  std::int64_t i = head;
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  }
  std::memcpy(d + i, s + i, static_cast<std::size_t>(bytes - i));
#else
  std::memcpy(d, s, static_cast<std::size_t>(bytes));
#endif
}
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/// Whether a collective writing `elements` result elements of `size` bytes in all writes them
/// with non-temporal stores: from 2 MiB on, where skipping the read-for-ownership of the
/// destination lines saves a third of the memory traffic of a large all_reduce.
inline bool streams_result(std::int64_t elements, std::size_t size) {
  return elements * static_cast<std::int64_t>(size) >= (std::int64_t{1} << 21);
}

/// dst[d][i] = op over q = 0..n-1 (in this order) of src[q][i], for i in [lo, hi), d < ndst;
/// `streaming`: write dst with non-temporal stores (see streams_result).
template <class T>
void reduce_range(const T* const* src, int n, T* const* dst, int ndst, std::int64_t lo,
                  std::int64_t hi, ReduceOp op, bool streaming) {
  using A = typename accumulator<T>::type;
  constexpr std::int64_t chunk = 2048;
  A acc[chunk];
  alignas(64) T staged[chunk];
  for (std::int64_t base = lo; base < hi; base += chunk) {
    const std::int64_t len = std::min(chunk, hi - base);
    const T* s0 = src[0] + base;
    for (std::int64_t j = 0; j < len; ++j) acc[j] = acc_load<T, A>(s0[j]);
    for (int q = 1; q < n; ++q) {
      const T* s = src[q] + base;
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          for (std::int64_t j = 0; j < len; ++j) acc[j] = acc_add(acc[j], acc_load<T, A>(s[j]));
          break;
        case ReduceOp::max:
          for (std::int64_t j = 0; j < len; ++j) {
            const A v = acc_load<T, A>(s[j]);
            acc[j] = acc[j] < v ? v : acc[j];
          }
          break;
        case ReduceOp::min:
          for (std::int64_t j = 0; j < len; ++j) {
            const A v = acc_load<T, A>(s[j]);
            acc[j] = v < acc[j] ? v : acc[j];
          }
          break;
      }
    }
    if (op == ReduceOp::avg) {
      const A div = static_cast<A>(n);
      for (std::int64_t j = 0; j < len; ++j) acc[j] = acc[j] / div;
    }
    if (!streaming) {
      for (int d = 0; d < ndst; ++d) {
        T* out = dst[d] + base;
        for (std::int64_t j = 0; j < len; ++j) out[j] = acc_store<T, A>(acc[j]);
      }
      continue;
    }
    for (std::int64_t j = 0; j < len; ++j) staged[j] = acc_store<T, A>(acc[j]);
    for (int d = 0; d < ndst; ++d)
      stream_copy(dst[d] + base, staged, len * static_cast<std::int64_t>(sizeof(T)));
  }
  if (streaming) stream_fence();
}

/// One pointer per rank of a group, on the stack up to 16 ranks (a collective allocates nothing
/// then), on the heap above.
template <class P>
class RankPointers {
 public:
  explicit RankPointers(int n) : heap_(n > 16 ? static_cast<std::size_t>(n) : 0) {}
  P* data() { return heap_.empty() ? local_.data() : heap_.data(); }
  P& operator[](int q) { return data()[q]; }

 private:
  std::array<P, 16> local_{};
  std::vector<P> heap_;
};

/// [lo, hi) of slice `r` when `count` elements are split over `n` owners as evenly as possible.
inline std::pair<std::int64_t, std::int64_t> balanced_slice(std::int64_t count, int n, int r) {
  const std::int64_t base = count / n;
  const std::int64_t extra = count % n;
  const std::int64_t lo = r * base + std::min<std::int64_t>(r, extra);
  return {lo, lo + base + (r < extra ? 1 : 0)};
}

FOURWAY_END_MODE_NAMESPACE
}  // namespace fourway::detail
