//! safetensors: strict reading and writing of the Hugging Face tensor file format.
//!
//! A file is an 8-byte little-endian header length N, N bytes of JSON (UTF-8, may end in spaces)
//! mapping each tensor name to `{"dtype", "shape", "data_offsets": [begin, end]}` plus an optional
//! `"__metadata__"` object of strings, then the data buffer. Offsets are relative to the buffer.
//! The reader accepts a file only when, sorted by `begin`, the tensors tile the buffer exactly:
//! the first starts at 0, each starts where the previous ended, the last ends at the end of the
//! file (no gap, no overlap, no trailing bytes), and `end - begin == numel * dtype size` for each.
//! Every violation throws `fourway::CheckpointError` naming the file, the tensor and the numbers;
//! nothing is read out of bounds, whatever the bytes are (the JSON parser bounds depth and size).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/shape.hpp"

namespace fourway {

/// The dtypes of the safetensors format (spelled as in the file).
enum class StDtype : std::uint8_t {
  BOOL,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64
};

namespace detail {
/// "(2, 3)": a shape as the error messages print it.
inline std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}
struct StDtypeInfo {
  StDtype dtype;
  std::string_view name;
  std::size_t size;
};
inline constexpr StDtypeInfo st_dtypes[] = {
    {StDtype::BOOL, "BOOL", 1},       {StDtype::U8, "U8", 1},           {StDtype::I8, "I8", 1},
    {StDtype::F8_E5M2, "F8_E5M2", 1}, {StDtype::F8_E4M3, "F8_E4M3", 1}, {StDtype::I16, "I16", 2},
    {StDtype::U16, "U16", 2},         {StDtype::F16, "F16", 2},         {StDtype::BF16, "BF16", 2},
    {StDtype::I32, "I32", 4},         {StDtype::U32, "U32", 4},         {StDtype::F32, "F32", 4},
    {StDtype::F64, "F64", 8},         {StDtype::I64, "I64", 8},         {StDtype::U64, "U64", 8},
};
}  // namespace detail

constexpr std::string_view st_dtype_name(StDtype d) {
  for (const auto& i : detail::st_dtypes) {
    if (i.dtype == d) return i.name;
  }
  return "?";
}
constexpr std::size_t st_dtype_size(StDtype d) {
  for (const auto& i : detail::st_dtypes) {
    if (i.dtype == d) return i.size;
  }
  return 0;
}
inline std::optional<StDtype> st_dtype_from_name(std::string_view s) {
  for (const auto& i : detail::st_dtypes) {
    if (i.name == s) return i.dtype;
  }
  return std::nullopt;
}
template <class T>
constexpr StDtype st_dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return StDtype::F32;
  else if constexpr (std::is_same_v<T, fp16>)
    return StDtype::F16;
  else if constexpr (std::is_same_v<T, bf16>)
    return StDtype::BF16;
  else if constexpr (std::is_same_v<T, double>)
    return StDtype::F64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return StDtype::I32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return StDtype::I64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return StDtype::U8;
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return StDtype::U16;
  else
    static_assert(sizeof(T) == 0, "fourway: no safetensors dtype for this element type");
}

/// Limits the reader enforces. The header cap is the reference implementation's (100 MB).
struct SafetensorsLimits {
  std::uint64_t max_header_bytes = 100'000'000;
  int max_rank = 8;
  int max_json_depth = 8;
};

/// One tensor of a safetensors file: where its bytes are in the data buffer.
struct SafetensorsEntry {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets into the data buffer, [begin, end)
  std::uint64_t end = 0;

  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  [[nodiscard]] std::string shape_str() const { return detail::shape_text(shape); }
};

namespace detail {

/// A small strict JSON parser for the safetensors header: objects, arrays, strings, numbers,
/// true/false/null. Depth-bounded; every read is bounds-checked; errors are `CheckpointError`.
class StJson {
 public:
  enum class Kind : std::uint8_t { object, array, string, number, boolean, null };
  struct Value {
    Kind kind = Kind::null;
    std::string str;                // string, or the number's text
    std::vector<std::string> keys;  // object members in file order: keys[i] names values[i]
    std::vector<Value> values;
    std::vector<Value> items;  // array
  };

  /// `max_array_items` defaults to the safetensors bound: no array there is longer than a shape.
  StJson(std::string_view text, std::string_view source, int max_depth,
         std::size_t max_array_items = 64)
      : s_(text), source_(source), max_depth_(max_depth), max_array_items_(max_array_items) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected data after the JSON header object");
    return v;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw CheckpointError(
        cat("fourway: ", source_, ": malformed safetensors header at byte ", pos_, ": ", what));
  }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) fail("invalid literal");
    pos_ += w.size();
  }
  Value parse_value(int depth) {
    if (depth > max_depth_) fail(cat("nesting deeper than ", max_depth_));
    if (pos_ >= s_.size()) fail("unexpected end of header");
    Value v;
    const char c = s_[pos_];
    if (c == '{') {
      v.kind = Kind::object;
      ++pos_;
      skip_ws();
      if (eat('}')) return v;
      for (;;) {
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key");
        std::string key = parse_string();
        for (const auto& k : v.keys) {
          if (k == key) fail(cat("duplicate key \"", key, "\""));
        }
        skip_ws();
        if (!eat(':')) fail("expected ':'");
        skip_ws();
        Value child = parse_value(depth + 1);
        v.keys.push_back(std::move(key));
        v.values.push_back(std::move(child));
        skip_ws();
        if (eat('}')) return v;
        if (!eat(',')) fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Kind::array;
      ++pos_;
      skip_ws();
      if (eat(']')) return v;
      for (;;) {
        skip_ws();
        // bounding arrays bounds the parser's memory
        if (v.items.size() >= max_array_items_) fail(cat("array longer than ", max_array_items_));
        v.items.push_back(parse_value(depth + 1));
        skip_ws();
        if (eat(']')) return v;
        if (!eat(',')) fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Kind::string;
      v.str = parse_string();
      return v;
    }
    if (c == 't') {
      expect_word("true");
      v.kind = Kind::boolean;
      v.str = "true";
      return v;
    }
    if (c == 'f') {
      expect_word("false");
      v.kind = Kind::boolean;
      v.str = "false";
      return v;
    }
    if (c == 'n') {
      expect_word("null");
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Kind::number;
      const std::size_t start = pos_;
      eat('-');
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("invalid number");
      while (pos_ < s_.size() &&
             ((s_[pos_] >= '0' && s_[pos_] <= '9') || s_[pos_] == '.' || s_[pos_] == 'e' ||
              s_[pos_] == 'E' || s_[pos_] == '+' || s_[pos_] == '-')) {
        ++pos_;
      }
      v.str = std::string(s_.substr(start, pos_ - start));
      return v;
    }
    fail(cat("unexpected character code ", static_cast<int>(static_cast<unsigned char>(c))));
  }
  static void put_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::uint32_t parse_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9')
        v |= static_cast<std::uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        v |= static_cast<std::uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        v |= static_cast<std::uint32_t>(h - 'A' + 10);
      else
        fail("invalid \\u escape");
    }
    return v;
  }
  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!(eat('\\') && eat('u'))) fail("unpaired surrogate");
            const std::uint32_t lo = parse_hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("invalid low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: fail("invalid escape");
      }
    }
  }

  std::string_view s_;
  std::string_view source_;
  int max_depth_;
  std::size_t max_array_items_;
  std::size_t pos_ = 0;
};

/// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
inline bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 0;
    std::uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0)
      n = 1, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
      n = 2, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
      n = 3, cp = c & 0x07;
    else
      return false;
    if (s.size() - i <= n) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
    i += n + 1;
  }
  return true;
}

/// A non-negative decimal integer that fits in `std::uint64_t`, else nullopt.
inline std::optional<std::uint64_t> parse_u64(std::string_view t) {
  if (t.empty() || t.size() > 20) return std::nullopt;
  if (t.size() > 1 && t[0] == '0') return std::nullopt;
  std::uint64_t v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

inline void json_escape(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (u < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

inline std::vector<unsigned char> read_whole_file(const std::filesystem::path& path,
                                                  std::string_view what) {
  std::error_code ec;
  const bool is_file = std::filesystem::is_regular_file(path, ec);
  check<CheckpointError>(is_file, "fourway: cannot open ", what, " ", path.string(),
                         ": no such regular file");
  const auto size = std::filesystem::file_size(path, ec);
  check<CheckpointError>(!ec, "fourway: cannot read the size of ", path.string(), ": ",
                         ec.message());
  std::ifstream in(path, std::ios::binary);
  check<CheckpointError>(in.good(), "fourway: cannot open ", what, " ", path.string());
  std::vector<unsigned char> bytes(static_cast<std::size_t>(size));
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  check<CheckpointError>(static_cast<std::uint64_t>(in.gcount()) == size || size == 0,
                         "fourway: short read of ", path.string(), ": got ", in.gcount(), " of ",
                         size, " B");
  return bytes;
}

}  // namespace detail

/// A parsed and validated safetensors file held in memory.
class SafetensorsFile {
 public:
  /// Reads and validates `path`. Throws `CheckpointError` on any inconsistency.
  static SafetensorsFile read(const std::filesystem::path& path, SafetensorsLimits limits = {}) {
    return parse(detail::read_whole_file(path, "safetensors file"), path.string(), limits);
  }

  /// Validates `bytes` (a whole file); `source` names it in messages.
  static SafetensorsFile parse(std::vector<unsigned char> bytes, std::string source = "<memory>",
                               SafetensorsLimits limits = {}) {
    SafetensorsFile f;
    f.source_ = std::move(source);
    const std::uint64_t n = header_length(bytes.data(), bytes.size(), f.source_, limits);
    const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8),
                                static_cast<std::size_t>(n));
    f.parse_header(text, bytes.size(), limits);
    f.bytes_ = std::move(bytes);
    return f;
  }

  /// The header of a file of `file_size` bytes alone (`header` = the JSON text after the length
  /// field), with every check `parse` makes; the result has entries and no data (`bytes` throws).
  static SafetensorsFile index(std::string_view header, std::uint64_t file_size, std::string source,
                               SafetensorsLimits limits = {}) {
    SafetensorsFile f;
    f.source_ = std::move(source);
    f.header_only_ = true;
    f.parse_header(header, file_size, limits);
    return f;
  }

  /// The header length from the first 8 bytes of a file of `file_size` bytes (`first` holds at
  /// least min(8, file_size) of them), checked against the file and the limits.
  static std::uint64_t header_length(const unsigned char* first, std::uint64_t file_size,
                                     const std::string& src, const SafetensorsLimits& limits) {
    check<CheckpointError>(file_size >= 8, "fourway: ", src, ": ", file_size,
                           " B is too short for a safetensors file (8-byte header length missing)");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | first[static_cast<std::size_t>(i)];
    check<CheckpointError>(n <= limits.max_header_bytes, "fourway: ", src, ": header length ", n,
                           " B exceeds the cap of ", limits.max_header_bytes, " B");
    check<CheckpointError>(n <= file_size - 8, "fourway: ", src, ": header length ", n,
                           " B exceeds the ", file_size - 8, " B after the length field");
    check<CheckpointError>(n >= 2, "fourway: ", src, ": header length ", n,
                           " B cannot hold a JSON object");
    return n;
  }

  /// Converts the F32, F16, BF16 or F64 values at `p` (`n` elements of `dtype`) into `out`;
  /// `name` and `source` are for the message when the dtype does not convert.
  template <floating_dtype T>
  static void convert_values(StDtype dtype, const unsigned char* p, T* out, std::size_t n,
                             std::string_view source, std::string_view name) {
    switch (dtype) {
      case StDtype::F32:
        if constexpr (std::is_same_v<T, float>) {
          if (n > 0) std::memcpy(out, p, n * 4);
        } else {
          for (std::size_t i = 0; i < n; ++i) {
            float v;
            std::memcpy(&v, p + 4 * i, 4);
            out[i] = convert<T>(v);
          }
        }
        return;
      case StDtype::F16:
      case StDtype::BF16: {
        const bool is_half = dtype == StDtype::F16;
        if ((is_half && std::is_same_v<T, fp16>) || (!is_half && std::is_same_v<T, bf16>)) {
          if (n > 0) std::memcpy(out, p, n * 2);
          return;
        }
        for (std::size_t i = 0; i < n; ++i) {
          std::uint16_t b;
          std::memcpy(&b, p + 2 * i, 2);
          const float v = is_half ? detail::fp16_bits_to_float(b) : detail::bf16_bits_to_float(b);
          out[i] = convert<T>(v);
        }
        return;
      }
      case StDtype::F64:
        for (std::size_t i = 0; i < n; ++i) {
          double v;
          std::memcpy(&v, p + 8 * i, 8);
          out[i] = convert<T>(static_cast<float>(v));
        }
        return;
      default:
        throw CheckpointError(detail::cat(
            "fourway: ", source, ": tensor \"", name, "\" has dtype ", st_dtype_name(dtype),
            "; only F32, F16, BF16 and F64 convert to ", dtype_name(dtype_of<T>::value)));
    }
  }

  [[nodiscard]] const std::string& source() const { return source_; }
  [[nodiscard]] const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Bytes before the data buffer (8 + header length).
  [[nodiscard]] std::size_t data_offset() const { return data_offset_; }

  [[nodiscard]] const SafetensorsEntry* find(std::string_view name) const {
    for (const auto& e : entries_) {
      if (e.name == name) return &e;
    }
    return nullptr;
  }
  [[nodiscard]] const SafetensorsEntry& at(std::string_view name) const {
    const auto* e = find(name);
    check<CheckpointError>(e != nullptr, "fourway: ", source_, ": no tensor named \"", name, "\"");
    return *e;
  }

  /// The raw little-endian bytes of `e`.
  [[nodiscard]] std::span<const unsigned char> bytes(const SafetensorsEntry& e) const {
    check<CheckpointError>(!header_only_, "fourway: ", source_,
                           ": only the header was read; read tensor bytes with a "
                           "SafetensorsReader");
    return {bytes_.data() + data_offset_ + e.begin, static_cast<std::size_t>(e.end - e.begin)};
  }
  /// Whether tensors `a` and `b` have the same dtype and bytes.
  [[nodiscard]] bool same_bytes(const SafetensorsEntry& a, const SafetensorsEntry& b) const {
    const auto x = bytes(a);
    const auto y = bytes(b);
    return a.dtype == b.dtype && x.size() == y.size() &&
           (x.empty() || std::memcmp(x.data(), y.data(), x.size()) == 0);
  }

  /// Converts the F32, F16, BF16 or F64 tensor `e` into `out` (exactly `e.numel()` elements).
  template <floating_dtype T>
  void read_into(const SafetensorsEntry& e, std::span<T> out) const {
    check<CheckpointError>(out.size() == static_cast<std::size_t>(e.numel()), "fourway: ", source_,
                           ": tensor \"", e.name, "\" has ", e.numel(),
                           " elements, the destination ", out.size());
    convert_values(e.dtype, bytes(e).data(), out.data(), out.size(), source_, e.name);
  }

  /// The tensor as a vector of T (converted from F32/F16/BF16/F64).
  template <floating_dtype T = float>
  [[nodiscard]] std::vector<T> read(const SafetensorsEntry& e) const {
    std::vector<T> v(static_cast<std::size_t>(e.numel()));
    read_into(e, std::span<T>(v));
    return v;
  }

 private:
  /// Parses and validates the header `text` of a file of `file_size` bytes: every strict check
  /// (fields, dtypes, shapes, offsets tiling the data buffer exactly).
  void parse_header(std::string_view text, std::uint64_t file_size,
                    const SafetensorsLimits& limits) {
    SafetensorsFile& f = *this;
    const auto& src = f.source_;
    const std::uint64_t n = text.size();
    check<CheckpointError>(text.front() == '{', "fourway: ", src,
                           ": the header must start with '{'");
    check<CheckpointError>(detail::valid_utf8(text), "fourway: ", src,
                           ": the header is not valid UTF-8");
    const auto doc = detail::StJson(text, src, limits.max_json_depth).parse_document();
    check<CheckpointError>(doc.kind == detail::StJson::Kind::object, "fourway: ", src,
                           ": the header is not a JSON object");

    using K = detail::StJson::Kind;
    for (std::size_t t = 0; t < doc.keys.size(); ++t) {
      const std::string& name = doc.keys[t];
      const auto& v = doc.values[t];
      if (name == "__metadata__") {
        check<CheckpointError>(v.kind == K::object, "fourway: ", src,
                               ": __metadata__ must be an object of strings");
        for (std::size_t j = 0; j < v.keys.size(); ++j) {
          const std::string& k = v.keys[j];
          const auto& mv = v.values[j];
          check<CheckpointError>(mv.kind == K::string, "fourway: ", src, ": __metadata__ entry \"",
                                 k, "\" is not a string");
          f.metadata_.emplace(k, mv.str);
        }
        continue;
      }
      check<CheckpointError>(v.kind == K::object, "fourway: ", src, ": tensor \"", name,
                             "\" is not described by an object");
      SafetensorsEntry e;
      e.name = name;
      bool has_dtype = false, has_shape = false, has_offsets = false;
      for (std::size_t j = 0; j < v.keys.size(); ++j) {
        const std::string& k = v.keys[j];
        const auto& fv = v.values[j];
        if (k == "dtype") {
          check<CheckpointError>(fv.kind == K::string, "fourway: ", src, ": tensor \"", name,
                                 "\": dtype is not a string");
          const auto d = st_dtype_from_name(fv.str);
          check<CheckpointError>(d.has_value(), "fourway: ", src, ": tensor \"", name,
                                 "\": unknown dtype \"", fv.str, "\"");
          e.dtype = *d;
          has_dtype = true;
        } else if (k == "shape") {
          check<CheckpointError>(fv.kind == K::array, "fourway: ", src, ": tensor \"", name,
                                 "\": shape is not an array");
          check<CheckpointError>(fv.items.size() <= static_cast<std::size_t>(limits.max_rank),
                                 "fourway: ", src, ": tensor \"", name, "\": rank ",
                                 fv.items.size(), " exceeds ", limits.max_rank);
          for (const auto& d : fv.items) {
            const auto u = d.kind == K::number ? detail::parse_u64(d.str) : std::nullopt;
            const std::uint64_t extent = u.value_or(~std::uint64_t{0});
            check<CheckpointError>(extent <= (std::uint64_t{1} << 53), "fourway: ", src,
                                   ": tensor \"", name, "\": shape entry '", d.str,
                                   "' is not a non-negative integer below 2^53");
            e.shape.push_back(static_cast<std::int64_t>(extent));
          }
          has_shape = true;
        } else if (k == "data_offsets") {
          check<CheckpointError>(fv.kind == K::array && fv.items.size() == 2, "fourway: ", src,
                                 ": tensor \"", name, "\": data_offsets must be [begin, end]");
          std::uint64_t o[2] = {0, 0};
          for (int i = 0; i < 2; ++i) {
            const auto& d = fv.items[static_cast<std::size_t>(i)];
            const auto u = d.kind == K::number ? detail::parse_u64(d.str) : std::nullopt;
            check<CheckpointError>(u.has_value(), "fourway: ", src, ": tensor \"", name,
                                   "\": data offset '", d.str, "' is not a non-negative integer");
            o[i] = u.value_or(0);
          }
          e.begin = o[0];
          e.end = o[1];
          has_offsets = true;
        } else {
          throw CheckpointError(
              detail::cat("fourway: ", src, ": tensor \"", name, "\": unknown field \"", k, "\""));
        }
      }
      check<CheckpointError>(has_dtype && has_shape && has_offsets, "fourway: ", src, ": tensor \"",
                             name, "\" lacks", has_dtype ? "" : " dtype", has_shape ? "" : " shape",
                             has_offsets ? "" : " data_offsets");
      check<CheckpointError>(e.begin <= e.end, "fourway: ", src, ": tensor \"", name,
                             "\": data_offsets [", e.begin, ", ", e.end, "] end before they begin");
      std::uint64_t count = 1;
      for (auto d : e.shape) {
        const auto u = static_cast<std::uint64_t>(d);
        check<CheckpointError>(u == 0 || count <= std::numeric_limits<std::uint64_t>::max() / u /
                                                      st_dtype_size(e.dtype),
                               "fourway: ", src, ": tensor \"", name, "\": shape ", e.shape_str(),
                               " overflows a 64-bit byte count");
        count *= u;
      }
      const std::uint64_t nbytes = count * st_dtype_size(e.dtype);
      check<CheckpointError>(nbytes == e.end - e.begin, "fourway: ", src, ": tensor \"", name,
                             "\": shape ", e.shape_str(), " of ", st_dtype_name(e.dtype), " needs ",
                             nbytes, " B but data_offsets [", e.begin, ", ", e.end, "] hold ",
                             e.end - e.begin, " B");
      f.entries_.push_back(std::move(e));
    }

    // The tensors must tile the data buffer: sorted by begin, each starts where the last ended.
    const std::uint64_t buffer = file_size - 8 - n;
    std::vector<std::size_t> order(f.entries_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const auto& x = f.entries_[a];
      const auto& y = f.entries_[b];
      return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
    });
    std::uint64_t at = 0;
    std::string prev = "(start of the data buffer)";
    for (std::size_t i : order) {
      const auto& e = f.entries_[i];
      check<CheckpointError>(e.begin >= at, "fourway: ", src, ": tensor \"", e.name, "\" at [",
                             e.begin, ", ", e.end, ") overlaps \"", prev, "\" which ends at ", at);
      check<CheckpointError>(e.begin == at, "fourway: ", src, ": gap of ", e.begin - at,
                             " B in the data buffer between \"", prev, "\" (ends at ", at,
                             ") and tensor \"", e.name, "\" (begins at ", e.begin, ")");
      check<CheckpointError>(e.end <= buffer, "fourway: ", src, ": tensor \"", e.name, "\" at [",
                             e.begin, ", ", e.end, ") overflows the data buffer of ", buffer, " B");
      at = e.end;
      prev = e.name;
    }
    check<CheckpointError>(at == buffer, "fourway: ", src, ": ", buffer - at,
                           " trailing bytes after the last tensor (data buffer is ", buffer,
                           " B, tensors cover ", at, " B)");
    f.data_offset_ = 8 + static_cast<std::size_t>(n);
  }

 private:
  std::string source_;
  bool header_only_ = false;
  std::vector<unsigned char> bytes_;
  std::size_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// Collects tensors and writes a safetensors file: header padded with spaces to a multiple of
/// 8 bytes (so the buffer is 8-aligned), tensors in the order they were added, no gaps.
class SafetensorsWriter {
 public:
  void set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }

  /// Adds a tensor of raw little-endian bytes (copied now).
  void add(std::string name, StDtype dtype, std::vector<std::int64_t> shape,
           std::span<const unsigned char> data) {
    check<CheckpointError>(!name.empty() && name != "__metadata__", "fourway: tensor name \"", name,
                           "\" is not allowed in a safetensors file");
    check<CheckpointError>(detail::valid_utf8(name), "fourway: tensor name is not valid UTF-8");
    for (const auto& t : tensors_) {
      check<CheckpointError>(t.name != name, "fourway: tensor \"", name, "\" added twice");
    }
    std::uint64_t count = 1;
    for (auto d : shape) {
      check<CheckpointError>(d >= 0, "fourway: tensor \"", name, "\": negative extent ", d);
      count *= static_cast<std::uint64_t>(d);
    }
    check<CheckpointError>(count * st_dtype_size(dtype) == data.size(), "fourway: tensor \"", name,
                           "\": ", count, " elements of ", st_dtype_name(dtype), " need ",
                           count * st_dtype_size(dtype), " B, got ", data.size(), " B");
    tensors_.push_back({std::move(name), dtype, std::move(shape),
                        std::vector<unsigned char>(data.begin(), data.end())});
  }

  template <class T>
  void add(std::string name, std::vector<std::int64_t> shape, std::span<const T> values) {
    add(std::move(name), st_dtype_of<T>(), std::move(shape),
        std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(values.data()),
                                       values.size() * sizeof(T)));
  }

  /// What the header says of one tensor.
  struct HeaderEntry {
    std::string_view name;
    StDtype dtype;
    std::span<const std::int64_t> shape;
    std::uint64_t bytes = 0;
  };

  /// The header text (padded with spaces to a multiple of 8) of a file holding `tensors` in this
  /// order with no gaps: the writer's, so a file assembled piece by piece is byte-identical.
  static std::string header(const std::map<std::string, std::string>& metadata,
                            std::span<const HeaderEntry> tensors) {
    std::string h = "{";
    bool first = true;
    if (!metadata.empty()) {
      h += "\"__metadata__\":{";
      bool f2 = true;
      for (const auto& [k, v] : metadata) {
        if (!f2) h += ',';
        f2 = false;
        detail::json_escape(h, k);
        h += ':';
        detail::json_escape(h, v);
      }
      h += '}';
      first = false;
    }
    std::uint64_t at = 0;
    for (const auto& t : tensors) {
      if (!first) h += ',';
      first = false;
      detail::json_escape(h, t.name);
      h += ":{\"dtype\":\"";
      h += st_dtype_name(t.dtype);
      h += "\",\"shape\":[";
      for (std::size_t i = 0; i < t.shape.size(); ++i) {
        if (i) h += ',';
        h += std::to_string(t.shape[i]);
      }
      h += "],\"data_offsets\":[" + std::to_string(at) + ',' + std::to_string(at + t.bytes) + "]}";
      at += t.bytes;
    }
    h += '}';
    while (h.size() % 8 != 0) h += ' ';
    return h;
  }

  /// The whole file as bytes.
  [[nodiscard]] std::vector<unsigned char> serialize() const {
    std::vector<HeaderEntry> entries;
    std::uint64_t at = 0;
    for (const auto& t : tensors_) {
      entries.push_back({t.name, t.dtype, t.shape, t.data.size()});
      at += t.data.size();
    }
    const std::string h = header(metadata_, entries);
    std::vector<unsigned char> out;
    out.reserve(8 + h.size() + at);
    const std::uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(n >> (8 * i)));
    out.insert(out.end(), h.begin(), h.end());
    for (const auto& t : tensors_) out.insert(out.end(), t.data.begin(), t.data.end());
    return out;
  }

  /// Writes the file to `path.tmp` and renames it, so a crash never leaves a half file.
  void write(const std::filesystem::path& path) const {
    const auto bytes = serialize();
    auto tmp = path;
    tmp += ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      check<CheckpointError>(out.good(), "fourway: cannot create ", tmp.string());
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
      out.flush();
      check<CheckpointError>(out.good(), "fourway: writing ", bytes.size(), " B to ", tmp.string(),
                             " failed");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    check<CheckpointError>(!ec, "fourway: cannot rename ", tmp.string(), " to ", path.string(),
                           ": ", ec.message());
  }

 private:
  struct Pending {
    std::string name;
    StDtype dtype;
    std::vector<std::int64_t> shape;
    std::vector<unsigned char> data;
  };
  std::map<std::string, std::string> metadata_;
  std::vector<Pending> tensors_;
};

}  // namespace fourway
