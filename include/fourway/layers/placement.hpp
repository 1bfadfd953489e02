//! How a parameter is split over the N ranks of a tensor-parallel group: one `Placement` per
//! parameter. A tensor-parallel-ready layer (layers/parallel_linear.hpp, layers/vocab_parallel.hpp)
//! writes it on the parameters it builds (`Parameter::placement`), so a model's placement table is
//! read off its parameters (layers/sliced_model.hpp `placements_of`), never written by its author.
//! `StateView` (below) says where a rank's slice lies in the unsplit tensor (checkpoints).
//! The table drives everything that depends on the split — local shapes, initialisation and
//! checkpoint slices, gathering the full tensor back, which ranks count a parameter in the global
//! gradient norm, and the bytes each rank holds.
//!
//! Full tensors are the unsplit ones (Hugging Face layout), seen as (rows, cols) row-major (1-D
//! tensors are (1, n)); rank r of N holds:
//! ```
//!   replicated  (rows, cols)            all of it (norms, position embeddings, biases after a
//!                                       row split)
//!   column      (rows, cols/N)          in each of `parts` side-by-side blocks of cols/parts
//!                                       columns, columns [r·cols/(parts·N), (r+1)·...)
//!                                       (q|k|v, so the heads split; an MLP's first matrix)
//!   row         (rows/N, cols)          rows [r·rows/N, (r+1)·rows/N)  (output projections)
//!   vocab       (padded_rows/N, cols)   rows [r·Vp/N, (r+1)·Vp/N) of the vocabulary padded
//!                                       to Vp; rows >= rows (the padding) are zero
//! ```
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/core/error.hpp"

namespace fourway {

/// `rows` runs of `count` local elements, run i at local + i·local_stride, that are global
/// elements global + i·global_stride of the parameter's global tensor.
struct StateBlock {
  std::int64_t local = 0;
  std::int64_t local_stride = 0;
  std::int64_t global = 0;
  std::int64_t global_stride = 0;
  std::int64_t count = 0;
  std::int64_t rows = 1;
};

/// Where a local parameter lies in its global tensor (same name): local elements outside every
/// block are padding. `writes`: this rank writes it (every element is written by one rank).
struct StateView {
  std::vector<std::int64_t> shape;  // global
  std::vector<StateBlock> blocks;
  bool writes = true;
};

}  // namespace fourway

namespace fourway::tp {

enum class Split : std::uint8_t { replicated, column, row, vocab };

constexpr std::string_view split_name(Split s) {
  switch (s) {
    case Split::replicated: return "replicated";
    case Split::column: return "column";
    case Split::row: return "row";
    case Split::vocab: return "vocab";
  }
  return "?";
}

/// How a parameter is initialised (GPT-2's rules, from the (seed, name) stream of
/// layers/parameter.hpp): normal(0, value) or the constant `value`.
struct InitRule {
  bool normal = false;
  float value = 0.0f;
};

/// One parameter of the table.
struct Placement {
  std::string name;
  Split split = Split::replicated;
  std::int64_t rows = 1;  // full shape (rows, cols)
  std::int64_t cols = 1;
  int parts = 1;                 // column: blocks split separately (3 for q|k|v)
  std::int64_t padded_rows = 1;  // vocab: Vp, a multiple of N (and of the alignment)
  bool matrix = false;           // a 2-D tensor (weight decay applies)
  InitRule init{};

  /// The unsplit (rows, cols) tensor split as `split`: `parts` column blocks, a vocabulary
  /// padded to `padded_rows` (0: rows); `matrix` for a 2-D tensor. The name and the init rule
  /// are the parameter's it describes (layers/parallel_linear.hpp `place_slice`).
  static Placement of(Split split, std::int64_t rows, std::int64_t cols, bool matrix, int parts = 1,
                      std::int64_t padded_rows = 0) {
    Placement p;
    p.split = split;
    p.rows = rows;
    p.cols = cols;
    p.parts = parts;
    p.padded_rows = padded_rows > 0 ? padded_rows : rows;
    p.matrix = matrix;
    return p;
  }

  [[nodiscard]] std::int64_t full_numel() const { return rows * cols; }
  [[nodiscard]] std::int64_t local_rows(int n) const {
    switch (split) {
      case Split::row: return rows / n;
      case Split::vocab: return padded_rows / n;
      default: return rows;
    }
  }
  [[nodiscard]] std::int64_t local_cols(int n) const {
    return split == Split::column ? cols / n : cols;
  }
  [[nodiscard]] std::int64_t local_numel(int n) const { return local_rows(n) * local_cols(n); }
  /// Vocabulary rows of rank r that are real (not padding): [vocab_start, vocab_start + valid).
  [[nodiscard]] std::int64_t vocab_start(int n, int r) const { return r * (padded_rows / n); }
  [[nodiscard]] std::int64_t valid_rows(int n, int r) const {
    return std::clamp<std::int64_t>(rows - vocab_start(n, r), 0, local_rows(n));
  }
  /// Every rank holds a different part (the norm sums it over the group); a replicated
  /// parameter is counted by rank 0 of the group only.
  [[nodiscard]] bool counts_in_norm(int r) const { return split != Split::replicated || r == 0; }

  /// Where rank r of n's slice lies in the full tensor (layers/state_view.hpp), seen as the
  /// model's shape ((rows, cols) for a matrix, else 1-D): a replicated parameter is written by
  /// rank 0 only; vocabulary padding is in no block.
  [[nodiscard]] StateView state_view(int n, int r) const {
    StateView v;
    v.shape =
        matrix ? std::vector<std::int64_t>{rows, cols} : std::vector<std::int64_t>{rows * cols};
    v.writes = counts_in_norm(r);
    switch (split) {
      case Split::replicated: v.blocks.push_back({0, 0, 0, 0, full_numel(), 1}); break;
      case Split::row:
        v.blocks.push_back({0, 0, r * local_rows(n) * cols, 0, local_numel(n), 1});
        break;
      case Split::vocab:
        if (valid_rows(n, r) > 0)
          v.blocks.push_back({0, 0, vocab_start(n, r) * cols, 0, valid_rows(n, r) * cols, 1});
        break;
      case Split::column: {
        const std::int64_t part = cols / parts;
        const std::int64_t mine = part / n;
        for (int k = 0; k < parts; ++k) {
          v.blocks.push_back({k * mine, local_cols(n), k * part + r * mine, cols, mine, rows});
        }
        break;
      }
    }
    return v;
  }

  /// Calls f(full_offset, local_offset, count) for the contiguous runs rank r of n holds (the
  /// runs of `state_view`'s blocks), in increasing offsets; padding is not visited.
  template <class F>
  void for_each_run(int n, int r, F&& f) const {
    const StateView v = state_view(n, r);
    std::int64_t most = 0;
    for (const auto& b : v.blocks) most = std::max(most, b.rows);
    for (std::int64_t i = 0; i < most; ++i) {
      for (const auto& b : v.blocks) {
        if (i < b.rows) f(b.global + i * b.global_stride, b.local + i * b.local_stride, b.count);
      }
    }
  }
};

/// Vp: the vocabulary rounded up to a multiple of n·alignment (Megatron-LM's
/// make-vocab-size-divisible-by, applied per rank).
inline std::int64_t padded_vocab(std::int64_t vocab, int n, int alignment) {
  check<ConfigError>(vocab >= 1 && n >= 1 && alignment >= 1, "fourway: padded_vocab needs vocab, ",
                     "tp and alignment >= 1, got ", vocab, ", ", n, ", ", alignment);
  const std::int64_t m = static_cast<std::int64_t>(n) * alignment;
  return (vocab + m - 1) / m * m;
}

}  // namespace fourway::tp
