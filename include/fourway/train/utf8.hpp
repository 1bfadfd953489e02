//! UTF-8 for the tokenizer: strict validation with the byte offset of the first fault, lossy
//! decoding that replaces each ill-formed piece by U+FFFD, and a stream that turns bytes arriving
//! in pieces (one token at a time) into text without splitting a character.
//!
//! Well-formed means Unicode's table 3-7: no overlong forms, no surrogates (U+D800..DFFF), nothing
//! above U+10FFFF. Lossy decoding replaces every *maximal subpart* of an ill-formed sequence (the
//! longest prefix of a well-formed sequence, or one byte) by one U+FFFD, the practice Unicode
//! recommends and the one Python's `errors="replace"` and Rust's `from_utf8_lossy` follow, so the
//! result equals Hugging Face's and tiktoken's `decode` on the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "fourway/core/error.hpp"

namespace fourway {

/// Text that is not UTF-8. `offset()` is the byte at which the ill-formed sequence starts.
class TextError : public Error {
 public:
  TextError(const std::string& what, std::size_t offset) : Error(what), offset_(offset) {}
  [[nodiscard]] std::size_t offset() const { return offset_; }

 private:
  std::size_t offset_;
};

namespace detail {

/// What starts at one byte of a UTF-8 text.
struct Utf8Step {
  std::uint32_t cp = 0;  // the code point, when `ok`
  int length = 1;        // bytes: of the character when `ok`, else of the maximal subpart
  bool ok = false;
  bool cut = false;  // not ok only because the text ends: more bytes could complete it
};

/// Decodes the character at `s[i]` (i < s.size()).
constexpr Utf8Step utf8_step(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  Utf8Step r;
  if (b0 < 0x80) {
    r.cp = b0;
    r.ok = true;
    return r;
  }
  int need = 0;                        // continuation bytes
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the first continuation byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    r.cp = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    r.cp = b0 & 0x0Fu;
    if (b0 == 0xE0) lo = 0xA0;  // overlong below
    if (b0 == 0xED) hi = 0x9F;  // surrogates above
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    r.cp = b0 & 0x07u;
    if (b0 == 0xF0) lo = 0x90;  // overlong below
    if (b0 == 0xF4) hi = 0x8F;  // past U+10FFFF above
  } else {
    return r;  // a continuation byte, C0/C1 (always overlong) or F5..FF
  }
  for (int k = 1; k <= need; ++k) {
    if (i + static_cast<std::size_t>(k) >= s.size()) {
      r.length = k;
      r.cut = true;
      return r;
    }
    const unsigned char b = byte(i + static_cast<std::size_t>(k));
    if (b < lo || b > hi) {
      r.length = k;
      return r;
    }
    r.cp = (r.cp << 6) | (b & 0x3Fu);
    lo = 0x80;
    hi = 0xBF;
  }
  r.length = need + 1;
  r.ok = true;
  return r;
}

inline std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

}  // namespace detail

/// Throws `TextError` at the first ill-formed sequence of `text`, naming `source` (a file name,
/// or "the text"), the byte offset, the bytes and the fix.
inline void validate_utf8(std::string_view text, std::string_view source = "the text") {
  for (std::size_t i = 0; i < text.size();) {
    const auto st = detail::utf8_step(text, i);
    if (st.ok) {
      i += static_cast<std::size_t>(st.length);
      continue;
    }
    const auto lead = static_cast<unsigned char>(text[i]);
    std::string why;
    if (st.cut) {
      why = detail::cat("the character starting with ", detail::hex_byte(lead),
                        " is cut off by the end of the text");
    } else if (lead < 0xC2 || lead > 0xF4) {
      why = detail::cat(detail::hex_byte(lead), " cannot start a UTF-8 character");
    } else {
      const std::size_t at = i + static_cast<std::size_t>(st.length);
      why = detail::cat(detail::hex_byte(static_cast<unsigned char>(text[at])), " at byte ", at,
                        " cannot continue the character starting with ", detail::hex_byte(lead),
                        " (a broken, overlong or surrogate form)");
    }
    throw TextError(detail::cat("fourway: ", source, ": invalid UTF-8 at byte ", i, ": ", why,
                                "; the text must be UTF-8 (convert it first, e.g. iconv -f "
                                "LATIN1 -t UTF-8)"),
                    i);
  }
}

/// Appends code point `cp` (at most U+10FFFF) to `out` as UTF-8.
inline void append_utf8(std::string& out, std::uint32_t cp) {
  const auto put = [&](std::uint32_t v) { out += static_cast<char>(v); };
  if (cp < 0x80) {
    put(cp);
    return;
  }
  const int tail = cp < 0x800 ? 1 : cp < 0x10000 ? 2 : 3;
  static constexpr std::uint32_t lead_mark[4] = {0, 0xC0, 0xE0, 0xF0};
  put(lead_mark[tail] | (cp >> (6 * tail)));
  for (int k = tail - 1; k >= 0; --k) put(0x80 | ((cp >> (6 * k)) & 0x3F));
}

inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";  // U+FFFD

/// Bytes arriving in pieces, turned into UTF-8 text: `push` returns what can be decoded so far
/// and keeps back the bytes of a character that is not complete yet (at most 3); `finish`
/// replaces what is left by U+FFFD. Pushing a byte string in any split and then finishing gives
/// exactly `lossy_utf8` of the whole.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes) {
    pending_.append(bytes);
    std::string out;
    std::size_t i = 0;
    while (i < pending_.size()) {
      const auto st = detail::utf8_step(pending_, i);
      if (st.cut) break;  // wait for the rest of the character
      if (st.ok) {
        out.append(pending_, i, static_cast<std::size_t>(st.length));
      } else {
        out.append(replacement_character);
      }
      i += static_cast<std::size_t>(st.length);
    }
    pending_.erase(0, i);
    return out;
  }

  /// The end of the bytes: a character still incomplete becomes U+FFFD.
  std::string finish() {
    std::string out = pending_.empty() ? std::string() : std::string(replacement_character);
    pending_.clear();
    return out;
  }

  /// Bytes held back: the start of a character not yet complete.
  [[nodiscard]] std::size_t pending() const { return pending_.size(); }

 private:
  std::string pending_;
};

/// `bytes` as UTF-8 text, each maximal ill-formed subpart replaced by U+FFFD.
inline std::string lossy_utf8(std::string_view bytes) {
  Utf8Stream s;
  std::string out = s.push(bytes);
  return out + s.finish();
}

}  // namespace fourway
