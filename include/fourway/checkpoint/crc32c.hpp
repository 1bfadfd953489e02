//! CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), the checksum of iSCSI,
//! ext4 metadata and many storage formats, for checkpoint files and the slices inside them.
//!
//! `Crc32c` is incremental: `update()` any number of byte spans, then `value()`. The portable
//! path is slice-by-8 (eight 256-entry tables built once, eight bytes per step, a few GB/s);
//! where the compiler targets SSE 4.2 (`-march=native` on x86-64), the `crc32` instruction does
//! eight bytes at a time instead. Both give the same value (tests/checkpoint/crc32c_test.cpp
//! checks them against a bit-at-a-time reference and the standard check value
//! crc32c("123456789") = 0xE3069283).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#if defined(__SSE4_2__) && defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace fourway {

namespace detail {
/// tables[k][b]: the CRC of byte b followed by k zero bytes (slice-by-8).
inline const std::array<std::array<std::uint32_t, 256>, 8>& crc32c_tables() {
  static const auto tables = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (std::uint32_t b = 0; b < 256; ++b) {
      for (std::size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
    }
    return t;
  }();
  return tables;
}

/// The running (pre-inverted) register after `n` bytes at `p`, portable slice-by-8.
inline std::uint32_t crc32c_portable(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  const auto& t = crc32c_tables();
  for (; n >= 8; n -= 8, p += 8) {
    std::uint32_t lo = 0, hi = 0;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;  // little-endian hosts (the checkpoint formats assume them too)
    crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFFu] ^ t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xFFu];
  return crc;
}

inline std::uint32_t crc32c_update(std::uint32_t crc, const unsigned char* p, std::size_t n) {
#if defined(__SSE4_2__) && defined(__x86_64__)
  std::uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
#else
  return crc32c_portable(crc, p, n);
#endif
}
}  // namespace detail

/// An incremental CRC-32C.
class Crc32c {
 public:
  Crc32c& update(std::span<const unsigned char> bytes) {
    reg_ = detail::crc32c_update(reg_, bytes.data(), bytes.size());
    return *this;
  }
  Crc32c& update(const void* p, std::size_t n) {
    return update(std::span<const unsigned char>(static_cast<const unsigned char*>(p), n));
  }
  [[nodiscard]] std::uint32_t value() const { return ~reg_; }

 private:
  std::uint32_t reg_ = 0xFFFFFFFFu;
};

inline std::uint32_t crc32c(const void* p, std::size_t n) { return Crc32c().update(p, n).value(); }
inline std::uint32_t crc32c(std::string_view s) { return crc32c(s.data(), s.size()); }

}  // namespace fourway
