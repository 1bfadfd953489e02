//! llm.c token files and the sequential batch loader llm.c uses.
//!
//! File: 256 little-endian int32 (magic 20240520, version 1, token count N, the rest 0), then N
//! uint16 tokens; the file size must be exactly 1024 + 2N bytes. Batch k of B sequences of T
//! reads the B·T+1 tokens starting at token `(k mod K)·B·T`, where K = ⌊(N − 1) / (B·T)⌋ is the
//! number of whole batches the file holds: inputs are the first B·T, targets the last B·T (the
//! same tokens shifted by one), as B rows of T. After K batches the loader wraps to the start,
//! as llm.c's `dataloader_next_batch` does with one shard and no shuffling (the partial batch at
//! the end of the file is never used).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

inline constexpr std::int32_t llmc_token_magic = 20240520;
inline constexpr std::int32_t llmc_token_version = 1;
inline constexpr std::size_t llmc_header_ints = 256;

/// Tokens of an llm.c file (or any token sequence), held in memory.
class TokenData {
 public:
  TokenData() = default;
  explicit TokenData(std::vector<std::uint16_t> tokens, std::string source = "<memory>")
      : tokens_(std::move(tokens)), source_(std::move(source)) {}

  /// Reads and validates an llm.c token file.
  static TokenData read(const std::filesystem::path& path) {
    const auto bytes = detail::read_whole_file(path, "token file");
    const std::string src = path.string();
    constexpr std::size_t header = llmc_header_ints * 4;
    check<CheckpointError>(bytes.size() >= header, "fourway: token file ", src, " has ",
                           bytes.size(), " B, less than the ", header,
                           " B header of an llm.c token file");
    auto word = [&](std::size_t i) {
      std::uint32_t v = 0;
      for (int b = 3; b >= 0; --b) v = (v << 8) | bytes[4 * i + static_cast<std::size_t>(b)];
      return static_cast<std::int32_t>(v);
    };
    check<CheckpointError>(word(0) == llmc_token_magic, "fourway: token file ", src,
                           ": magic number ", word(0), " is not llm.c's ", llmc_token_magic,
                           " (is this an llm.c .bin token file?)");
    check<CheckpointError>(word(1) == llmc_token_version, "fourway: token file ", src, ": version ",
                           word(1), " is not supported (only ", llmc_token_version,
                           ", uint16 tokens)");
    const std::int32_t n = word(2);
    check<CheckpointError>(n >= 0, "fourway: token file ", src, ": negative token count ", n);
    const std::uint64_t expect = header + 2ull * static_cast<std::uint64_t>(n);
    check<CheckpointError>(bytes.size() == expect, "fourway: token file ", src, ": header says ", n,
                           " tokens (", expect, " B) but the file has ", bytes.size(), " B");
    std::vector<std::uint16_t> t(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < t.size(); ++i) {
      t[i] = static_cast<std::uint16_t>(bytes[header + 2 * i] | (bytes[header + 2 * i + 1] << 8));
    }
    return TokenData(std::move(t), src);
  }

  /// Writes `tokens` as an llm.c token file.
  static void write(const std::filesystem::path& path, std::span<const std::uint16_t> tokens) {
    check<CheckpointError>(tokens.size() <= 0x7fffffffu, "fourway: ", tokens.size(),
                           " tokens do not fit an llm.c header's int32 count");
    std::vector<unsigned char> bytes(llmc_header_ints * 4 + 2 * tokens.size(), 0);
    auto put32 = [&](std::size_t i, std::int32_t v) {
      for (int b = 0; b < 4; ++b) {
        bytes[4 * i + static_cast<std::size_t>(b)] =
            static_cast<unsigned char>(static_cast<std::uint32_t>(v) >> (8 * b));
      }
    };
    put32(0, llmc_token_magic);
    put32(1, llmc_token_version);
    put32(2, static_cast<std::int32_t>(tokens.size()));
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      bytes[1024 + 2 * i] = static_cast<unsigned char>(tokens[i] & 0xff);
      bytes[1024 + 2 * i + 1] = static_cast<unsigned char>(tokens[i] >> 8);
    }
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    check<CheckpointError>(out.good(), "fourway: cannot create ", path.string());
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    check<CheckpointError>(out.good(), "fourway: writing ", path.string(), " failed");
  }

  [[nodiscard]] std::span<const std::uint16_t> tokens() const { return tokens_; }
  [[nodiscard]] std::size_t size() const { return tokens_.size(); }
  [[nodiscard]] const std::string& source() const { return source_; }

  /// The largest token id plus one (0 for an empty file).
  [[nodiscard]] std::int64_t vocab_needed() const {
    std::int64_t m = 0;
    for (auto t : tokens_) m = std::max<std::int64_t>(m, std::int64_t{t} + 1);
    return m;
  }

 private:
  std::vector<std::uint16_t> tokens_;
  std::string source_;
};

/// One batch: B rows of T inputs and the T targets that follow each (token ids as int32).
struct SequenceBatch {
  std::int64_t B = 0, T = 0;
  std::vector<std::int32_t> inputs;   // (B, T)
  std::vector<std::int32_t> targets;  // (B, T)
};

/// llm.c's sequential loader over `data`: `next()` returns batch 0, 1, ..., K-1, 0, ...
class TokenLoader {
 public:
  /// Checks that the data holds at least one batch and every token is below `vocab`.
  TokenLoader(const TokenData& data, std::int64_t B, std::int64_t T, std::int64_t vocab)
      : data_(&data), B_(B), T_(T) {
    check<ConfigError>(B > 0 && T > 0, "fourway: batch ", B, " and sequence ", T,
                       " must be positive");
    const std::int64_t n = static_cast<std::int64_t>(data.size());
    check<ConfigError>(n >= B * T + 1, "fourway: ", data.source(), " holds ", n,
                       " tokens; a batch of ", B, " x ", T, " needs ", B * T + 1,
                       "; lower --batch or --seq, or use more data");
    batches_ = (n - 1) / (B * T);
    const std::int64_t need = data.vocab_needed();
    check<ConfigError>(need <= vocab, "fourway: ", data.source(), " contains token id ", need - 1,
                       " but the model's vocabulary has ", vocab,
                       " entries; use a model with vocab >= ", need);
  }

  /// Whole batches in the file before the loader wraps.
  [[nodiscard]] std::int64_t batches_per_epoch() const { return batches_; }
  /// The batch `next()` returns next.
  [[nodiscard]] std::int64_t position() const { return next_; }
  void reset(std::int64_t batch_index = 0) { next_ = batch_index % batches_; }

  /// Batch `k` (taken modulo the batches in the file).
  [[nodiscard]] SequenceBatch batch(std::int64_t k) const {
    SequenceBatch b;
    b.B = B_;
    b.T = T_;
    const std::int64_t bt = B_ * T_;
    const auto start = static_cast<std::size_t>((k % batches_) * bt);
    const auto tok = data_->tokens();
    b.inputs.resize(static_cast<std::size_t>(bt));
    b.targets.resize(static_cast<std::size_t>(bt));
    for (std::size_t i = 0; i < static_cast<std::size_t>(bt); ++i) {
      b.inputs[i] = tok[start + i];
      b.targets[i] = tok[start + i + 1];
    }
    return b;
  }

  SequenceBatch next() {
    SequenceBatch b = batch(next_);
    next_ = (next_ + 1) % batches_;
    return b;
  }

 private:
  const TokenData* data_;
  std::int64_t B_, T_;
  std::int64_t batches_ = 0;
  std::int64_t next_ = 0;
};

}  // namespace fourway
