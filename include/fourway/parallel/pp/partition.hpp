//! How a model is cut into pipeline chunks: contiguous runs of blocks, the embedding on the first
//! chunk, the head (final norm, LM head, loss) on the last. The model says what its units cost
//! (`CutCosts`, layers/model_part.hpp; GPT-2's: `models::cut_costs`) and builds the units a
//! chunk's `ModelPart` names.
//!
//!     layers = 5, chunks = 2 (balanced)      chunk 0: embedding  h.0 h.1 h.2
//!                                            chunk 1:            h.3 h.4   ln_f, head (wte)
//!
//! `balanced` minimises the largest chunk's parameter count (GPT-2: the embedding's wte and wpe
//! count on chunk 0, ln_f and the tied head's copy of wte on the last chunk); ties go to the cut
//! that puts more blocks early. `at_cuts` takes the first block of every chunk after the first
//! (Megatron's `--pipeline-model-parallel-layout`-style explicit split). Every chunk holds at
//! least one block. A chunk is placed on a pipeline rank by the schedule table (`Table::rank_of`).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/model_part.hpp"

namespace fourway::pp {

/// What `Partition::balanced` weighs (layers/model_part.hpp).
using CutCosts = ::fourway::CutCosts;

class Partition {
 public:
  /// Chunk c holds blocks [first(c), first(c + 1)).
  [[nodiscard]] int chunks() const { return static_cast<int>(bounds_.size()) - 1; }
  [[nodiscard]] int first(int c) const { return bounds_[static_cast<std::size_t>(c)]; }
  [[nodiscard]] int end(int c) const { return bounds_[static_cast<std::size_t>(c) + 1]; }
  [[nodiscard]] ModelPart part(int c) const {
    return ModelPart{first(c), end(c), c == 0, c == chunks() - 1};
  }
  /// "[0,3) [3,5)".
  [[nodiscard]] std::string describe() const {
    std::string out;
    for (int c = 0; c < chunks(); ++c)
      out += detail::cat(c ? " " : "", "[", first(c), ",", end(c), ")");
    return out;
  }

  /// Explicit cut points: `cuts[k]` is the first block of chunk k + 1 (strictly increasing).
  static Partition at_cuts(int layers, const std::vector<int>& cuts) {
    Partition p;
    p.bounds_.push_back(0);
    for (int c : cuts) {
      check<ConfigError>(c > p.bounds_.back() && c < layers, "fourway: pipeline cut points ",
                         list(cuts), " for ", layers, " layers must increase strictly within 1 .. ",
                         layers - 1, " (every chunk needs at least one block)");
      p.bounds_.push_back(c);
    }
    p.bounds_.push_back(layers);
    return p;
  }

  /// Contiguous chunks with the largest cost (parameter count) as small as possible, any model
  /// of `costs.layers` equal blocks.
  static Partition balanced(const CutCosts& costs, int chunks) {
    check<ConfigError>(chunks >= 1 && chunks <= costs.layers, "fourway: cannot cut ", costs.layers,
                       " layers into ", chunks,
                       " pipeline chunks (stages x virtual stages); every chunk needs at least one "
                       "block: use at most ",
                       costs.layers, " chunks or a deeper model");
    const std::int64_t block = costs.block;
    const std::int64_t embed = costs.embedding;
    const std::int64_t head = costs.head;
    const int L = costs.layers;
    const auto cost = [&](int c, int lo, int hi) {
      return (hi - lo) * block + (c == 0 ? embed : 0) + (c == chunks - 1 ? head : 0);
    };
    // best[c][l]: the smallest possible max cost of chunks 0..c-1 covering blocks [0, l)
    constexpr std::int64_t inf = std::numeric_limits<std::int64_t>::max();
    const std::size_t row = static_cast<std::size_t>(L) + 1;
    const auto idx = [row](int c, int l) {
      const auto uc = static_cast<std::size_t>(c);
      const auto ul = static_cast<std::size_t>(l);
      return uc * row + ul;
    };
    std::vector<std::int64_t> best(
        static_cast<std::size_t>(chunks + 1) * static_cast<std::size_t>(L + 1), inf);
    std::vector<int> from(best.size(), -1);
    best[idx(0, 0)] = 0;
    for (int c = 1; c <= chunks; ++c) {
      for (int l = c; l <= L; ++l) {
        for (int k = l - 1; k >= c - 1; --k) {  // chunk c-1 holds [k, l)
          if (best[idx(c - 1, k)] == inf) continue;
          const std::int64_t v = std::max(best[idx(c - 1, k)], cost(c - 1, k, l));
          if (v < best[idx(c, l)]) {
            best[idx(c, l)] = v;
            from[idx(c, l)] = k;
          }
        }
      }
    }
    Partition p;
    p.bounds_.assign(static_cast<std::size_t>(chunks) + 1, 0);
    int l = L;
    for (int c = chunks; c >= 1; --c) {
      p.bounds_[static_cast<std::size_t>(c)] = l;
      l = from[idx(c, l)];
    }
    return p;
  }

 private:
  static std::string list(const std::vector<int>& v) {
    std::string s = "{";
    for (std::size_t i = 0; i < v.size(); ++i) s += detail::cat(i ? ", " : "", v[i]);
    return s + "}";
  }
  std::vector<int> bounds_;
};

}  // namespace fourway::pp
