//! How the blockwise attention (`cuda/blockwise_attention.cuh`) cuts one call into GEMM launches:
//! query rows per block and sequences per group, so that one block's fp32 scores — (sequences
//! in the group) · NH · (rows) · T of them — stay within a budget. Host code, so the plan and the
//! workspace it implies are tested and counted without a GPU.
//!
//! Every launch covers all NH heads of every sequence of a group (B · NH matrices when the whole
//! batch fits), because a launch per sequence of 12 GPT-2 heads leaves most of a large GPU idle.
//! The rows shrink before the batch is split: the full batch with 64-row blocks before two
//! groups of sequences with 256-row blocks. Rows are a multiple of 32 when they are cut to fit.
#pragma once

#include <algorithm>
#include <cstdint>

#include "fourway/core/error.hpp"

namespace fourway {

/// Query rows per block, at most (the blocks above the diagonal are skipped, so smaller blocks
/// waste less of the causal triangle; larger ones launch fewer, fuller GEMMs).
inline constexpr std::int64_t attention_query_chunk = 256;
/// fp32 scores one block may hold (64 MiB of them): the largest transient of the blockwise path.
inline constexpr std::int64_t attention_score_budget = std::int64_t{1} << 24;

struct BlockwisePlan {
  std::int64_t rows;       ///< query rows per block (the last block of a sequence may be shorter)
  std::int64_t sequences;  ///< sequences per group (the last group may be smaller)
  /// fp32 scores of one block: sequences · NH · rows · T.
  [[nodiscard]] std::int64_t scores(std::int64_t T, std::int64_t NH) const {
    return sequences * NH * rows * T;
  }
};

/// The blocks of one (B, T, NH) call: `chunk` rows and the whole batch if that fits `budget`;
/// else the whole batch with rows cut to fit (a multiple of 32, at least min(chunk, T, 64)); else
/// min(chunk, T, 64) rows and as many sequences as fit (at least one, and then as many rows as
/// fit, at least one: a budget below one row of one sequence's heads is exceeded by that row).
inline BlockwisePlan blockwise_plan(std::int64_t B, std::int64_t T, std::int64_t NH,
                                    std::int64_t chunk = attention_query_chunk,
                                    std::int64_t budget = attention_score_budget) {
  check<ShapeError>(chunk > 0 && budget > 0, "fourway: blockwise attention needs a query chunk > 0",
                    " and a score budget > 0, got chunk=", chunk, ", budget=", budget);
  check<ShapeError>(B >= 0 && T >= 0 && NH > 0, "fourway: blockwise attention: B=", B, ", T=", T,
                    ", NH=", NH, " out of range");
  const std::int64_t t = std::max<std::int64_t>(T, 1), b = std::max<std::int64_t>(B, 1);
  const std::int64_t full = std::min(chunk, t);
  const std::int64_t fit = budget / (NH * t);  // query rows (of all heads of one sequence) that fit
  if (b * full <= fit) return {full, b};
  const std::int64_t floor_rows = std::min(full, std::int64_t{64});
  const std::int64_t per_sequence = fit / b / 32 * 32;
  if (per_sequence >= floor_rows) return {std::min(full, per_sequence), b};
  if (fit >= floor_rows) return {floor_rows, std::min(b, fit / floor_rows)};
  return {std::max<std::int64_t>(fit, 1), 1};
}

}  // namespace fourway
