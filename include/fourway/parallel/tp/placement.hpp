//! Tensor-parallel placement beyond the `Placement` record itself (layers/placement.hpp, where the
//! tensor-parallel-ready layers write it on their parameters): the padded vocabulary and the
//! one-line map of what a rank holds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/layers/placement.hpp"

namespace fourway::tp {

/// What rank r of n holds of the tensors in `table`, for the map fourway-train prints
/// (train/holdings.hpp): "column slice 1/2 of 8 tensors, row slice 1/2 of 4, vocab rows
/// [2048,4096) of wte.weight, 13 replicated" (slices numbered like ranks, from 0).
inline std::string describe_slice(std::span<const Placement> table, int n, int r) {
  int column = 0, row = 0, replicated = 0;
  std::string vocab;
  for (const Placement& p : table) {
    switch (p.split) {
      case Split::column: ++column; break;
      case Split::row: ++row; break;
      case Split::replicated: ++replicated; break;
      case Split::vocab:
        vocab += detail::cat(vocab.empty() ? "" : ", ", "vocab rows [", p.vocab_start(n, r), ",",
                             p.vocab_start(n, r) + p.valid_rows(n, r), ") of ", p.name);
        if (p.valid_rows(n, r) < p.local_rows(n)) {
          vocab += detail::cat(" (+", p.local_rows(n) - p.valid_rows(n, r), " padding rows)");
        }
        break;
    }
  }
  std::string out;
  const auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  if (column > 0) add(detail::cat("column slice ", r, "/", n, " of ", column, " tensors"));
  if (row > 0) add(detail::cat("row slice ", r, "/", n, " of ", row));
  if (!vocab.empty()) add(vocab);
  if (replicated > 0) add(detail::cat(replicated, " replicated"));
  return out;
}

}  // namespace fourway::tp
