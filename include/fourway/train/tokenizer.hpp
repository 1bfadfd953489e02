//! GPT-2's tokenizer: byte-level BPE read from Hugging Face's files, `vocab.json` + `merges.txt`
//! or `tokenizer.json`, with no dependency outside the standard library.
//!
//! encode(text):
//!   1. the text must be UTF-8 (`TextError` with the byte offset otherwise);
//!   2. special tokens (`<|endoftext|>`) are cut out first and become their own ids, as
//!      `tokenizers` and tiktoken's `allowed_special="all"` do (`encode_ordinary` keeps them text);
//!   3. the rest is split by GPT-2's pattern
//!        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//!      matched here by hand over UTF-8 (unicode_classes.hpp: \p{L}, \p{N}, \s);
//!   4. each piece's bytes start as one token per byte and the adjacent pair of lowest merge rank
//!      is merged until no pair has a rank (leftmost first among equal ranks).
//! Vocabulary strings are GPT-2's byte-to-unicode spelling of the bytes (a printable byte stands
//! for itself, the others for U+0100 upward: the space is "Ġ"); they are turned back into bytes
//! on load, so encode and decode work on bytes and ids only.
//!
//! decode(ids) concatenates the tokens' bytes and replaces ill-formed UTF-8 by U+FFFD, as
//! `tokenizers` and tiktoken do. One token may end inside a character, so a program that prints
//! tokens as they are generated uses `DecodeStream`: `push(id)` returns the text completed so far
//! and keeps back the start of a character until its last byte arrives; the pieces joined equal
//! decode(all ids). `token_bytes(id)` gives one token's raw bytes.
//!
//! A missing or malformed file is a `TokenizerFileError` naming the path and what was expected;
//! an id that no token has is a `TokenIdError`. A tokenizer.json with another algorithm (a
//! normalizer, another pre-tokenizer, BPE dropout, byte fallback, ...) is refused, not
//! approximated.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <queue>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/train/unicode_classes.hpp"
#include "fourway/train/utf8.hpp"

namespace fourway {

/// A tokenizer file that is missing, unreadable, malformed or of an unsupported kind.
class TokenizerFileError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

/// A token id that the tokenizer has no token for.
class TokenIdError : public Error {
 public:
  using Error::Error;
};

namespace detail {

/// GPT-2's bytes_to_unicode: the code point that spells byte b in vocabulary strings.
constexpr std::array<std::uint16_t, 256> byte_spelling_table() {
  std::array<std::uint16_t, 256> t{};
  std::uint16_t extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    t[static_cast<std::size_t>(b)] = printable ? static_cast<std::uint16_t>(b) : extra++;
  }
  return t;
}
inline constexpr auto byte_spelling = byte_spelling_table();
inline constexpr std::uint32_t byte_spelling_end = 256 + 68;  // code points in use: [0, 324)

/// The inverse: code point -> byte, -1 where a code point spells no byte.
constexpr std::array<std::int16_t, byte_spelling_end> spelling_byte_table() {
  std::array<std::int16_t, byte_spelling_end> t{};
  for (auto& v : t) v = -1;
  for (int b = 0; b < 256; ++b) t[byte_spelling[static_cast<std::size_t>(b)]] = std::int16_t(b);
  return t;
}
inline constexpr auto spelling_byte = spelling_byte_table();

inline std::string read_tokenizer_file(const std::filesystem::path& path, std::string_view what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw TokenizerFileError(cat("fourway: tokenizer file ", path.string(),
                                 " is missing (no such regular file); expected ", what));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    throw TokenizerFileError(cat("fourway: cannot read tokenizer file ", path.string()));
  }
  return std::move(text).str();
}

/// A pull reader over one JSON document: the caller walks the structure it expects, skipping
/// the rest, so a 50k-entry vocabulary is read without building a tree. Errors name the file,
/// line and column (`TokenizerFileError`).
class JsonReader {
 public:
  JsonReader(std::string_view text, std::string source, std::string expected)
      : s_(text), source_(std::move(source)), expected_(std::move(expected)) {}

  [[noreturn]] void fail(std::string_view what) const {
    std::size_t line = 1, col = 1;
    for (std::size_t k = 0; k < pos_ && k < s_.size(); ++k) {
      col = s_[k] == '\n' ? 1 : col + 1;
      line += s_[k] == '\n';
    }
    throw TokenizerFileError(cat("fourway: tokenizer file ", source_, ": ", what, " at line ", line,
                                 ", column ", col, "; expected ", expected_));
  }

  /// The next value's first character, after whitespace ('\0' at the end).
  char peek() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) {
      ++pos_;
    }
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }

  /// Reads an object; `member(key)` must read or skip the member's value.
  void object(const std::function<void(const std::string&)>& member) {
    open('{', "an object");
    if (close('}')) return;
    do {
      if (peek() != '"') fail("expected a member name in quotes");
      const std::string key = string();
      if (peek() != ':') fail(cat("expected ':' after \"", key, "\""));
      ++pos_;
      member(key);
    } while (separator('}'));
    --depth_;
  }

  /// Reads an array; `item(index)` must read or skip each element.
  void array(const std::function<void(std::size_t)>& item) {
    open('[', "an array");
    if (close(']')) return;
    std::size_t i = 0;
    do item(i++);
    while (separator(']'));
    --depth_;
  }

  /// A string's text, escapes resolved (copied a run of plain characters at a time).
  std::string string() {
    if (peek() != '"') fail("expected a string");
    ++pos_;
    std::string out;
    for (;;) {
      const std::size_t stop = s_.find_first_of("\"\\", pos_);
      const auto plain = s_.substr(pos_, stop == std::string_view::npos ? stop : stop - pos_);
      const auto control = std::find_if(
          plain.begin(), plain.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; });
      pos_ += static_cast<std::size_t>(control - plain.begin());
      if (control != plain.end()) fail("control character inside a string");
      if (stop == std::string_view::npos) fail("unterminated string");
      out.append(plain);
      pos_ = stop + 1;
      if (s_[stop] == '"') return out;
      escape(out);
    }
  }

  /// An integer in [lo, hi].
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    peek();
    const std::size_t start = pos_;
    const bool negative = pos_ < s_.size() && s_[pos_] == '-';
    pos_ += negative;
    std::int64_t v = 0;
    bool any = false;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) fail("integer too large");
      v = v * 10 + (s_[pos_++] - '0');
      any = true;
    }
    if (!any || (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))) {
      pos_ = start;
      fail("expected an integer");
    }
    v = negative ? -v : v;
    if (v < lo || v > hi) {
      pos_ = start;
      fail(cat("integer ", v, " outside [", lo, ", ", hi, "]"));
    }
    return v;
  }

  /// true / false.
  bool boolean() {
    if (word("true")) return true;
    if (word("false")) return false;
    fail("expected true or false");
  }

  /// Consumes `null` when it comes next.
  bool null() { return word("null"); }

  /// Skips any one value.
  void skip() {
    const char c = peek();
    if (c == '{') {
      object([&](const std::string&) { skip(); });
    } else if (c == '[') {
      array([&](std::size_t) { skip(); });
    } else if (c == '"') {
      string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      while (pos_ < s_.size() &&
             std::string_view("+-.0123456789eE").find(s_[pos_]) != std::string_view::npos) {
        ++pos_;
      }
    } else if (!word("true") && !word("false") && !null()) {
      fail("expected a JSON value");
    }
  }

  /// Nothing but whitespace may follow the document.
  void end() {
    if (peek() != '\0') fail("unexpected text after the JSON document");
  }

 private:
  static constexpr int max_depth = 64;

  void open(char c, std::string_view what) {
    if (peek() != c) fail(cat("expected ", what));
    if (++depth_ > max_depth) fail(cat("nesting deeper than ", max_depth));
    ++pos_;
  }
  bool close(char c) {
    if (peek() != c) return false;
    ++pos_;
    --depth_;
    return true;
  }
  // After an element: true at ',' (another follows), false at the closing bracket.
  bool separator(char closing) {
    const char c = peek();
    ++pos_;
    if (c == ',') return true;
    if (c == closing) return false;
    --pos_;
    fail(cat("expected ',' or '", closing, "'"));
  }
  bool word(std::string_view w) {
    if (peek() != w[0] || s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  // The escape after a backslash, appended to `out` as UTF-8.
  void escape(std::string& out) {
    const char e = pos_ < s_.size() ? s_[pos_++] : '\0';
    constexpr std::string_view from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
    if (const auto k = from.find(e); k != std::string_view::npos) {
      out += to[k];
      return;
    }
    if (e != 'u') fail("invalid escape in a string");
    std::uint32_t cp = hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail("low surrogate without its high half");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (s_.substr(pos_, 2) != "\\u") fail("high surrogate without its low half");
      pos_ += 2;
      const std::uint32_t low = hex4();
      if (low < 0xDC00 || low > 0xDFFF) fail("high surrogate without its low half");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(out, cp);
  }
  std::uint32_t hex4() {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k, ++pos_) {
      const char h = pos_ < s_.size() ? s_[pos_] : '\0';
      const char lower = (h >= 'A' && h <= 'F') ? static_cast<char>(h - 'A' + 'a') : h;
      const auto d = std::string_view("0123456789abcdef").find(lower);
      if (d == std::string_view::npos) fail("invalid \\u escape");
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return v;
  }

  std::string_view s_;
  std::string source_, expected_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace detail

/// A token that is cut out of the text before BPE and encoded as its own id.
struct SpecialToken {
  std::string text;
  std::int32_t id = 0;
};

/// GPT-2's byte-level BPE tokenizer. Immutable after loading; encode and decode are const and
/// may run on several threads at once.
class Tokenizer {
 public:
  /// Hugging Face's tokenizer files in `path`: a folder holding `tokenizer.json` (preferred, as
  /// `transformers` does) or `vocab.json` + `merges.txt`, or a tokenizer.json itself.
  static Tokenizer load(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      throw TokenizerFileError(
          detail::cat("fourway: tokenizer ", path.string(),
                      " does not exist; expected a folder holding "
                      "tokenizer.json or vocab.json + merges.txt, or a tokenizer.json"));
    }
    if (!std::filesystem::is_directory(path, ec)) {
      const auto name = path.filename();
      if (name == "vocab.json" || name == "merges.txt") return load(path.parent_path());
      return from_tokenizer_json(path);
    }
    if (std::filesystem::exists(path / "tokenizer.json", ec)) {
      return from_tokenizer_json(path / "tokenizer.json");
    }
    const bool vocab = std::filesystem::exists(path / "vocab.json", ec);
    const bool merges = std::filesystem::exists(path / "merges.txt", ec);
    if (vocab != merges) {
      const auto missing = path / (vocab ? "merges.txt" : "vocab.json");
      throw TokenizerFileError(detail::cat("fourway: tokenizer file ", missing.string(),
                                           " is missing; vocab.json and merges.txt come as a "
                                           "pair (or give tokenizer.json)"));
    }
    if (!vocab) {
      throw TokenizerFileError(detail::cat(
          "fourway: ", path.string(),
          " holds no tokenizer: expected tokenizer.json, or "
          "vocab.json + merges.txt (Hugging Face's files, e.g. `huggingface-cli download gpt2 "
          "tokenizer.json`)"));
    }
    return from_files(path / "vocab.json", path / "merges.txt");
  }

  /// GPT-2's two files. `<|endoftext|>`, where the vocabulary has it, is the special token (as
  /// `transformers`' GPT2Tokenizer makes it).
  static Tokenizer from_files(const std::filesystem::path& vocab_json,
                              const std::filesystem::path& merges_txt) {
    Tokenizer t;
    t.source_ = vocab_json.string() + " + " + merges_txt.string();
    const std::string vtext = detail::read_tokenizer_file(vocab_json, "a vocab.json");
    const std::string mtext = detail::read_tokenizer_file(merges_txt, "a merges.txt");
    Raw raw;
    detail::JsonReader json(checked_utf8(vtext, vocab_json), vocab_json.string(),
                            "GPT-2's vocab.json: one JSON object of token -> id");
    json.object([&](const std::string& token) {
      raw.vocab.emplace_back(token, static_cast<std::int32_t>(json.integer(0, max_id)));
    });
    json.end();
    const std::string mpath = merges_txt.string();
    std::istringstream lines(std::string(checked_utf8(mtext, merges_txt)));
    std::size_t number = 0;
    for (std::string line; std::getline(lines, line);) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
      const auto space = line.find(' ');
      if (space == 0 || space == std::string::npos || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string::npos) {
        throw TokenizerFileError(detail::cat(
            "fourway: tokenizer file ", mpath, " line ", number, ": \"", line,
            "\" is not a merge; expected two tokens separated by one space (GPT-2's merges.txt)"));
      }
      raw.merges.push_back(
          {line.substr(0, space), line.substr(space + 1), detail::cat(mpath, " line ", number)});
    }
    for (const auto& [token, id] : raw.vocab) {
      if (token == "<|endoftext|>") raw.specials.push_back({token, id});
    }
    t.build(raw);
    return t;
  }

  /// Hugging Face's tokenizer.json of a byte-level BPE (GPT-2's kind): the model's vocab and
  /// merges (as "a b" strings or as pairs), and the added tokens.
  static Tokenizer from_tokenizer_json(const std::filesystem::path& path) {
    Tokenizer t;
    t.source_ = path.string();
    const std::string text = detail::read_tokenizer_file(path, "Hugging Face's tokenizer.json");
    Raw raw;
    detail::JsonReader json(checked_utf8(text, path), t.source_,
                            "Hugging Face's tokenizer.json of a byte-level BPE (GPT-2's kind)");
    bool has_model = false, has_pre_tokenizer = false;
    json.object([&](const std::string& key) {
      if (key == "model") {
        has_model = true;
        read_model(json, raw, t.source_);
      } else if (key == "added_tokens") {
        json.array([&](std::size_t) { raw.specials.push_back(read_added_token(json)); });
      } else if (key == "normalizer") {
        if (!json.null()) json.fail("\"normalizer\" must be null (GPT-2 has none)");
      } else if (key == "pre_tokenizer" || key == "post_processor") {
        has_pre_tokenizer = has_pre_tokenizer || key == "pre_tokenizer";
        read_byte_level(json, key);
      } else {
        json.skip();  // version, truncation, padding, decoder: decode is byte-level regardless
      }
    });
    json.end();
    if (!has_model) json.fail("no \"model\" object");
    if (!has_pre_tokenizer) json.fail("no \"pre_tokenizer\" (GPT-2's is ByteLevel)");
    t.build(raw);
    return t;
  }

  /// Token ids of `text`; special tokens in the text become their ids.
  [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text) const {
    return encode_impl(text, true);
  }

  /// Token ids of `text` with special tokens' text encoded as ordinary text (tiktoken's
  /// `encode_ordinary`): for text from users that must not inject `<|endoftext|>`.
  [[nodiscard]] std::vector<std::int32_t> encode_ordinary(std::string_view text) const {
    return encode_impl(text, false);
  }

  /// The text of `ids`; ill-formed UTF-8 (ids that end or start inside a character) is
  /// replaced by U+FFFD.
  [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const {
    return lossy_utf8(decode_bytes(ids));
  }

  /// The tokens' bytes, concatenated, unchecked as UTF-8.
  [[nodiscard]] std::string decode_bytes(std::span<const std::int32_t> ids) const {
    std::string out;
    for (const auto id : ids) out.append(token_bytes(id));
    return out;
  }

  /// One token's bytes (a special token's text).
  [[nodiscard]] std::string_view token_bytes(std::int32_t id) const {
    if (id < 0 || id >= vocab_size()) {
      throw TokenIdError(detail::cat("fourway: token id ", id,
                                     " is outside the tokenizer's ids 0..", vocab_size() - 1, " (",
                                     source_, "); were the ids made with another tokenizer?"));
    }
    if (!present_[static_cast<std::size_t>(id)]) {
      throw TokenIdError(detail::cat("fourway: no token has id ", id, " in the tokenizer (",
                                     source_, "); were the ids made with another tokenizer?"));
    }
    return bytes_[static_cast<std::size_t>(id)];
  }

  /// The largest id plus one: a model's embedding needs at least this many rows.
  [[nodiscard]] std::int32_t vocab_size() const { return static_cast<std::int32_t>(bytes_.size()); }
  [[nodiscard]] std::size_t merge_count() const { return merges_.size(); }
  [[nodiscard]] const std::vector<SpecialToken>& special_tokens() const { return specials_; }
  /// The id of a special token, -1 when there is none of that text.
  [[nodiscard]] std::int32_t special_id(std::string_view text) const {
    for (const auto& s : specials_) {
      if (s.text == text) return s.id;
    }
    return -1;
  }
  /// The files it was read from.
  [[nodiscard]] const std::string& source() const { return source_; }

  /// `text` split by GPT-2's pattern (no special tokens): the pieces BPE runs on, in order.
  [[nodiscard]] static std::vector<std::string_view> pre_tokenize(std::string_view text) {
    validate_utf8(text);
    std::vector<std::string_view> pieces;
    for (std::size_t i = 0; i < text.size();) {
      const std::size_t j = piece_end(text, i);
      pieces.push_back(text.substr(i, j - i));
      i = j;
    }
    return pieces;
  }

 private:
  static constexpr std::int64_t max_id = (std::int64_t{1} << 24) - 1;  // bounds the tables

  struct RawMerge {
    std::string left, right, where;  // byte-level spellings; where: file and line, for errors
  };
  struct Raw {
    std::vector<std::pair<std::string, std::int32_t>> vocab;  // byte-level spellings
    std::vector<RawMerge> merges;                             // in rank order
    std::vector<SpecialToken> specials;                       // raw text
  };
  struct Merge {
    std::int32_t rank, id;
  };

  static std::string_view checked_utf8(const std::string& text, const std::filesystem::path& p) {
    try {
      validate_utf8(text, p.string());
    } catch (const TextError& e) {
      throw TokenizerFileError(e.what());
    }
    return text;
  }

  static void read_model(detail::JsonReader& json, Raw& raw, const std::string& source) {
    json.object([&](const std::string& key) {
      if (key == "vocab") {
        json.object([&](const std::string& token) {
          raw.vocab.emplace_back(token, static_cast<std::int32_t>(json.integer(0, max_id)));
        });
      } else if (key == "merges") {
        json.array([&](std::size_t i) {
          RawMerge m{"", "", detail::cat(source, " model.merges[", i, "]")};
          if (json.peek() == '"') {  // "left right", the format before tokenizers 0.20
            const std::string s = json.string();
            const auto sp = s.find(' ');
            if (sp == 0 || sp == std::string::npos || sp + 1 == s.size() ||
                s.find(' ', sp + 1) != std::string::npos) {
              json.fail(detail::cat("merge \"", s, "\" is not two tokens separated by a space"));
            }
            m.left = s.substr(0, sp);
            m.right = s.substr(sp + 1);
          } else {
            json.array([&](std::size_t k) {
              if (k > 1) json.fail("a merge pair has more than two tokens");
              (k == 0 ? m.left : m.right) = json.string();
            });
            if (m.right.empty()) json.fail("a merge pair needs two tokens");
          }
          raw.merges.push_back(std::move(m));
        });
      } else if (key == "type") {
        if (json.string() != "BPE") json.fail("model type is not \"BPE\"");
      } else if (key == "dropout") {
        if (!json.null()) json.fail("model.dropout must be null: BPE dropout merges at random");
      } else if (key == "continuing_subword_prefix" || key == "end_of_word_suffix") {
        if (!json.null() && (json.peek() != '"' || !json.string().empty())) {
          json.fail(detail::cat("model.", key, " must be null for GPT-2's BPE"));
        }
      } else if (key == "byte_fallback" || key == "ignore_merges") {
        if (json.boolean()) json.fail(detail::cat("model.", key, " must be false for GPT-2's BPE"));
      } else {
        json.skip();  // unk_token, fuse_unk: no effect on a byte-level vocabulary
      }
    });
  }

  static SpecialToken read_added_token(detail::JsonReader& json) {
    SpecialToken s{"", -1};
    json.object([&](const std::string& key) {
      if (key == "id") {
        s.id = static_cast<std::int32_t>(json.integer(0, max_id));
      } else if (key == "content") {
        s.text = json.string();
      } else if (key == "lstrip" || key == "rstrip" || key == "single_word") {
        if (json.boolean()) {
          json.fail(detail::cat("added token option \"", key,
                                "\" is not supported (GPT-2's "
                                "<|endoftext|> has it false)"));
        }
      } else {
        json.skip();  // special, normalized: no normalizer, so both match the raw text
      }
    });
    if (s.id < 0 || s.text.empty()) json.fail("an added token needs an \"id\" and a \"content\"");
    return s;
  }

  // pre_tokenizer: ByteLevel without a prefix space, with GPT-2's pattern; post_processor:
  // null or ByteLevel (which adds no tokens).
  static void read_byte_level(detail::JsonReader& json, const std::string& what) {
    if (what == "post_processor" && json.null()) return;
    if (json.peek() != '{') json.fail(detail::cat("\"", what, "\" must be a ByteLevel object"));
    json.object([&](const std::string& key) {
      if (key == "type") {
        const std::string type = json.string();
        if (type != "ByteLevel") {
          json.fail(detail::cat(what, " type \"", type, "\" is not GPT-2's ByteLevel"));
        }
      } else if (key == "add_prefix_space" && what == "pre_tokenizer") {
        if (json.boolean()) json.fail("pre_tokenizer.add_prefix_space must be false, as GPT-2's");
      } else if (key == "use_regex") {
        if (!json.boolean()) json.fail(detail::cat(what, ".use_regex must be true, as GPT-2's"));
      } else {
        json.skip();  // trim_offsets: offsets only
      }
    });
  }

  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }

  // Byte-level spelling -> bytes; "" when a character spells no byte.
  static bool unspell(std::string_view spelled, std::string& bytes) {
    bytes.clear();
    for (std::size_t i = 0; i < spelled.size();) {
      const auto st = detail::utf8_step(spelled, i);
      if (!st.ok || st.cp >= detail::byte_spelling_end || detail::spelling_byte[st.cp] < 0) {
        return false;
      }
      bytes += static_cast<char>(detail::spelling_byte[st.cp]);
      i += static_cast<std::size_t>(st.length);
    }
    return !bytes.empty();
  }

  void build(Raw& raw) {
    const auto bad = [&](const auto&... what) {
      throw TokenizerFileError(detail::cat("fourway: tokenizer file ", source_, ": ", what...));
    };
    if (raw.vocab.empty()) bad("the vocabulary is empty; expected a GPT-2-style vocabulary");
    std::int32_t top = 0;
    for (const auto& [token, id] : raw.vocab) top = std::max(top, id);
    for (const auto& s : raw.specials) top = std::max(top, s.id);
    bytes_.assign(static_cast<std::size_t>(top) + 1, std::string());
    present_.assign(bytes_.size(), false);
    const auto place = [&](std::int32_t id, std::string bytes, std::string_view name) {
      auto& slot = bytes_[static_cast<std::size_t>(id)];
      if (present_[static_cast<std::size_t>(id)] && slot != bytes) {
        bad("id ", id, " names two different tokens (the second is \"", name, "\")");
      }
      present_[static_cast<std::size_t>(id)] = true;
      slot = std::move(bytes);
    };
    std::string bytes;
    for (const auto& s : raw.specials) place(s.id, s.text, s.text);
    byte_id_.fill(-1);
    for (const auto& [token, id] : raw.vocab) {
      // a special token listed in the vocabulary too (GPT-2's <|endoftext|>): kept out of BPE
      const bool special =
          std::any_of(raw.specials.begin(), raw.specials.end(),
                      [&](const SpecialToken& s) { return s.id == id && s.text == token; });
      if (special) continue;
      if (!unspell(token, bytes)) {
        bad("vocabulary token \"", token, "\" (id ", id,
            ") is not spelled in GPT-2's byte-level "
            "alphabet; this is not a byte-level BPE vocabulary");
      }
      if (!id_of_.emplace(bytes, id).second) bad("token \"", token, "\" appears twice");
      if (bytes.size() == 1) byte_id_[static_cast<unsigned char>(bytes[0])] = id;
      place(id, bytes, token);
    }
    for (int b = 0; b < 256; ++b) {
      if (byte_id_[static_cast<std::size_t>(b)] < 0) {
        bad("no token for byte ", detail::hex_byte(static_cast<unsigned char>(b)),
            "; a byte-level BPE vocabulary has all 256 (is this GPT-2's kind of tokenizer?)");
      }
    }
    const auto id_of = [&](const std::string& spelled, const RawMerge& m) {
      std::string b;
      const auto it = unspell(spelled, b) ? id_of_.find(b) : id_of_.end();
      if (it == id_of_.end()) {
        bad("merge \"", m.left, " ", m.right, "\" (", m.where, ") uses \"", spelled,
            "\", which is not in the vocabulary");
      }
      return it->second;
    };
    merges_.reserve(raw.merges.size());
    for (std::size_t r = 0; r < raw.merges.size(); ++r) {
      const auto& m = raw.merges[r];
      const std::int32_t a = id_of(m.left, m), b = id_of(m.right, m);
      const std::int32_t merged = id_of(m.left + m.right, m);
      merges_.emplace(pair_key(a, b), Merge{static_cast<std::int32_t>(r), merged});
    }
    specials_ = std::move(raw.specials);
    // longest first, so that of two specials starting at one place the longer wins
    std::stable_sort(specials_.begin(), specials_.end(),
                     [](const auto& x, const auto& y) { return x.text.size() > y.text.size(); });
  }

  // The class of the character at s[i] and its length in bytes (s is valid UTF-8).
  static std::pair<UnicodeClass, std::size_t> class_at(std::string_view s, std::size_t i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return {UnicodeClass::letter, 1};
      if (c >= '0' && c <= '9') return {UnicodeClass::number, 1};
      if (c == ' ' || (c >= '\t' && c <= '\r')) return {UnicodeClass::space, 1};
      return {UnicodeClass::other, 1};
    }
    const auto st = detail::utf8_step(s, i);
    return {unicode_class(st.cp), static_cast<std::size_t>(st.length)};
  }

  // End of the piece that GPT-2's pattern matches at s[i] (alternatives tried in its order).
  static std::size_t piece_end(std::string_view s, std::size_t i) {
    const std::size_t n = s.size();
    if (s[i] == '\'' && i + 1 < n) {  // 's|'t|'re|'ve|'m|'ll|'d
      const char a = s[i + 1], b = i + 2 < n ? s[i + 2] : '\0';
      if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class
    std::size_t j = i;
    auto [cls, len] = class_at(s, j);
    if (s[i] == ' ' && i + 1 < n) {
      const auto next = class_at(s, i + 1);
      if (next.first != UnicodeClass::space) {
        j = i + 1;
        std::tie(cls, len) = next;
      }
    }
    if (cls != UnicodeClass::space) {
      const UnicodeClass run = cls;
      while (j < n && cls == run) {
        j += len;
        if (j < n) std::tie(cls, len) = class_at(s, j);
      }
      return j;
    }
    // `\s+(?!\S)|\s+`: a whitespace run; before a non-space it gives back its last character
    // (which then leads the next piece), unless it has only one
    std::size_t last = j;
    while (j < n && cls == UnicodeClass::space) {
      last = j;
      j += len;
      if (j < n) std::tie(cls, len) = class_at(s, j);
    }
    return (j < n && last > i) ? last : j;
  }

  // BPE over one piece's bytes, appending its ids to `out`: a min-heap of (rank, position) over
  // adjacent pairs, entries checked against the pieces as they are when popped.
  void bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
    const std::size_t n = piece.size();
    if (n == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
      return;
    }
    std::vector<std::int32_t> id(n);
    std::vector<std::size_t> next(n), prev(n);
    for (std::size_t k = 0; k < n; ++k) {
      id[k] = byte_id_[static_cast<unsigned char>(piece[k])];
      next[k] = k + 1;
      prev[k] = k - 1;  // wraps for k = 0: never read
    }
    using Entry = std::pair<std::int32_t, std::size_t>;  // (rank, left position)
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    const auto offer = [&](std::size_t left) {
      if (left >= n || next[left] >= n) return;
      const auto it = merges_.find(pair_key(id[left], id[next[left]]));
      if (it != merges_.end()) heap.emplace(it->second.rank, left);
    };
    for (std::size_t k = 0; k + 1 < n; ++k) offer(k);
    while (!heap.empty()) {
      const auto [rank, left] = heap.top();
      heap.pop();
      if (id[left] < 0 || next[left] >= n) continue;
      const auto it = merges_.find(pair_key(id[left], id[next[left]]));
      if (it == merges_.end() || it->second.rank != rank) continue;  // stale
      const std::size_t gone = next[left];
      id[left] = it->second.id;
      id[gone] = -1;
      next[left] = next[gone];
      if (next[left] < n) prev[next[left]] = left;
      if (left > 0) offer(prev[left]);
      offer(left);
    }
    for (std::size_t k = 0; k < n; k = next[k]) out.push_back(id[k]);
  }

  std::vector<std::int32_t> encode_impl(std::string_view text, bool specials) const {
    validate_utf8(text);
    std::vector<std::int32_t> out;
    out.reserve(text.size() / 3 + 1);
    // pieces already encoded in this call -> their ids' [start, end) in `out`
    std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> seen;
    const auto ordinary = [&](std::string_view segment) {
      for (std::size_t i = 0; i < segment.size();) {
        const std::size_t j = piece_end(segment, i);
        const std::string_view piece = segment.substr(i, j - i);
        i = j;
        if (const auto it = seen.find(piece); it != seen.end()) {
          const auto [b, e] = it->second;
          for (std::size_t k = b; k < e; ++k) {
            const std::int32_t repeat = out[k];
            out.push_back(repeat);
          }
          continue;
        }
        const std::size_t start = out.size();
        bpe(piece, out);
        seen.emplace(piece, std::pair{start, out.size()});
      }
    };
    const std::size_t none = std::string_view::npos;
    std::vector<std::size_t> at;  // the next occurrence of each special token, npos: none left
    for (std::size_t k = 0; specials && k < specials_.size(); ++k) {
      at.push_back(text.find(specials_[k].text));
    }
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t first = none, which = 0;
      for (std::size_t k = 0; k < at.size(); ++k) {
        if (at[k] != none && at[k] < pos) at[k] = text.find(specials_[k].text, pos);
        if (at[k] < first) {  // ties keep the earlier k: the longer text
          first = at[k];
          which = k;
        }
      }
      ordinary(text.substr(pos, first == none ? none : first - pos));
      if (first == none) break;
      out.push_back(specials_[which].id);
      pos = first + specials_[which].text.size();
    }
    return out;
  }

  std::string source_;
  std::vector<std::string> bytes_;                       // id -> bytes (a special token's text)
  std::vector<bool> present_;                            // id -> whether a token has it
  std::unordered_map<std::string, std::int32_t> id_of_;  // bytes -> id (the BPE vocabulary)
  std::unordered_map<std::uint64_t, Merge> merges_;      // (left id, right id) -> rank, result
  std::array<std::int32_t, 256> byte_id_{};
  std::vector<SpecialToken> specials_;  // longest first
};

/// Decodes token ids one at a time into text, for printing tokens as a model generates them:
/// `push(id)` returns the text that is complete after this token (empty while a character is
/// split across tokens), `finish()` the rest (a character never completed becomes U+FFFD). The
/// pieces joined equal `tokenizer.decode(ids)`.
class DecodeStream {
 public:
  explicit DecodeStream(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}
  std::string push(std::int32_t id) { return utf8_.push(tokenizer_->token_bytes(id)); }
  std::string finish() { return utf8_.finish(); }

 private:
  const Tokenizer* tokenizer_;
  Utf8Stream utf8_;
};

}  // namespace fourway
