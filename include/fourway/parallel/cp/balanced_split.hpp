//! Context parallelism's split of a sequence (Megatron-Core's load balancing): T tokens in 2c
//! chunks of T/(2c); rank r of the context-parallel group of c holds chunks r and 2c − 1 − r, local
//! rows [0, T/2c) and [T/2c, T/c). Under the causal mask a chunk's work grows with its position,
//! and each rank pairs an early chunk with a late one, so every rank scores the same number of
//! (query, key) pairs (`BalancedSplit::visible_pairs`).
//!
//!   T = 8 tokens, c = 2:   chunks  0 1 2 3   rank 0 holds chunks 0 and 3
//!                                            rank 1 holds chunks 1 and 2
//!
//! Plain data, its positions callable in device code (the CUDA ring's mask).
#pragma once

#include <algorithm>
#include <cstdint>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"

namespace fourway::cp {

/// Rank `rank` of `ranks`'s share of a sequence of `seq` tokens: chunks `rank` and
/// 2·ranks − 1 − rank of 2·ranks.
struct BalancedSplit {
  std::int64_t seq = 0;
  int ranks = 1;
  int rank = 0;

  [[nodiscard]] FOURWAY_HOST_DEVICE std::int64_t chunk() const { return seq / (2 * ranks); }
  /// Local rows: T/c.
  [[nodiscard]] FOURWAY_HOST_DEVICE std::int64_t local() const { return 2 * chunk(); }
  /// The position in the whole sequence of local row `row`.
  [[nodiscard]] FOURWAY_HOST_DEVICE std::int64_t position(std::int64_t row) const {
    const std::int64_t c = chunk();
    return row < c ? rank * c + row : (2 * ranks - 1 - rank) * c + (row - c);
  }
  /// The same split seen from rank `other`.
  [[nodiscard]] FOURWAY_HOST_DEVICE BalancedSplit of(int other) const {
    return {seq, ranks, other};
  }
  /// (query, key) pairs the causal mask leaves this rank to score, over every block: the same
  /// on every rank, T/c · (T + 1)/2.
  [[nodiscard]] std::int64_t visible_pairs() const {
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < local(); ++i) n += position(i) + 1;
    return n;
  }
};

/// The split of a context-parallel group of `ranks`; a sequence that does not cut into 2·ranks
/// chunks is a `ShapeError` naming both numbers.
inline BalancedSplit balanced_split(std::int64_t seq, int ranks, int rank) {
  check<ConfigError>(ranks >= 1 && rank >= 0 && rank < ranks, "fourway: context-parallel rank ",
                     rank, " of ", ranks, " does not exist");
  check<ShapeError>(seq >= 1 && seq % (2 * static_cast<std::int64_t>(ranks)) == 0,
                    "fourway: context parallelism over ", ranks, " ranks cuts each sequence into ",
                    "2 × ", ranks, " = ", 2 * ranks, " chunks (rank r holds chunks r and ",
                    2 * ranks - 1, " − r), but a sequence of ", seq, " tokens does not divide by ",
                    2 * ranks, "; use a sequence length divisible ", "by ", 2 * ranks);
  return {seq, ranks, rank};
}

/// local (B, T/c, W) = this rank's rows of full (B, T, W).
template <class E>
void take_local_rows(E* local, const E* full, std::int64_t B, std::int64_t W,
                     const BalancedSplit& s) {
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < s.local(); ++i) {
      const E* src = full + (b * s.seq + s.position(i)) * W;
      std::copy(src, src + W, local + (b * s.local() + i) * W);
    }
  }
}

/// full (B, T, W) rows of this rank = local (B, T/c, W); every rank's call fills the whole.
template <class E>
void put_local_rows(E* full, const E* local, std::int64_t B, std::int64_t W,
                    const BalancedSplit& s) {
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t i = 0; i < s.local(); ++i) {
      const E* src = local + (b * s.local() + i) * W;
      std::copy(src, src + W, full + (b * s.seq + s.position(i)) * W);
    }
  }
}

}  // namespace fourway::cp
