//! What one rank holds, as text: the map `fourway-train` prints at start (docs/mesh.md, "The
//! map"). One entry per rank:
//! ```
//!   rank 5 (tp 1/2, pp 0/2, dp 1/2)
//!     layers     blocks [0,2), embedding
//!     tp slice   column part 1/2 of 8 tensors, row part 1/2 of 4, vocab rows [2048,4096) of
//!                wte.weight, 13 replicated
//!     ZeRO-1     fp32 masters and Adam moments of wte.weight[262144:524288) .. h.0.ln_1.bias
//!                (3 tensors); h.1.attn.c_attn.weight[0:98304)
//!     bytes      model states 4719104 B (weights 1179776, grads 1179776, masters and
//!                moments 2359552); one rank alone 9437184 B, 2.00x more
//! ```
//! The optimizer-state pieces come from the strategy's `saved_state_runs()` (what a checkpoint
//! of that rank writes, train/state_runs.hpp), the bytes from the rank's accountant: both are
//! what the rank holds, not a formula.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"

namespace fourway {

/// Elements [first, first + count) of `tensor`, which has `numel` elements.
struct TensorPiece {
  std::string tensor;
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t numel = 0;
  [[nodiscard]] bool whole() const { return first == 0 && count == numel; }
  [[nodiscard]] bool reaches_end() const { return first + count == numel; }
};

namespace detail {
/// "name", or "name[a:b)" for part of it.
inline std::string piece_text(const TensorPiece& p) {
  if (p.whole()) return p.tensor;
  return cat(p.tensor, "[", p.first, ":", p.first + p.count, ")");
}
}  // namespace detail

/// The pieces in the order given, a piece that runs to the end of its tensor merged with the
/// next when that one starts at element 0 (a contiguous run of a flat buffer):
/// "wte.weight[262144:524288) .. h.0.ln_1.bias (3 tensors); h.1.attn.c_attn.weight[0:98304)".
/// "nothing" for no pieces.
inline std::string describe_pieces(std::span<const TensorPiece> pieces) {
  std::string out;
  std::size_t i = 0;
  while (i < pieces.size()) {
    std::size_t j = i;  // the run is pieces [i, j]
    while (j + 1 < pieces.size() && pieces[j].reaches_end() && pieces[j + 1].first == 0 &&
           pieces[j + 1].tensor != pieces[j].tensor) {
      ++j;
    }
    out += out.empty() ? "" : "; ";
    out += detail::piece_text(pieces[i]);
    if (j > i)
      out += detail::cat(" .. ", detail::piece_text(pieces[j]), " (", j - i + 1, " tensors)");
    i = j + 1;
  }
  return out.empty() ? std::string("nothing") : out;
}

/// The pieces of the optimizer state (fp32 masters and Adam moments) a sharding strategy's rank
/// owns: its `saved_state_runs()`, in its order.
template <class Strategy>
std::vector<TensorPiece> optimizer_pieces(const Strategy& s) {
  std::vector<TensorPiece> out;
  for (const auto& r : s.saved_state_runs()) {
    out.push_back({r.param->name, r.first, r.count, r.param->numel()});
  }
  return out;
}

/// One rank's entry of the map.
struct RankHoldings {
  int rank = 0;
  std::string position;   // the mesh coordinate, `Mesh::position(rank)`: "tp 1/2, pp 0/2, dp 1/2"
  std::string layers;     // which blocks: "all 4 blocks, embedding and head"
  std::string tp_slice;   // `tp::describe_slice`; empty without tensor parallelism
  std::string sharding;   // "DataParallel", "ZeRO-1", ...
  std::string optimizer;  // which optimizer state the rank owns
  std::string layout;     // the flat layout of a sharding strategy (`describe()`), if any
  std::size_t weights = 0, grads = 0, masters_and_moments = 0;  // bytes held now
  std::size_t one_rank_bytes = 0;  // the model states of the whole model on one rank (0: unknown)

  /// The rank's model-state bytes (weights, gradients, fp32 masters and Adam moments), now.
  [[nodiscard]] std::size_t model_state_bytes() const {
    return weights + grads + masters_and_moments;
  }
  /// `sharding` and `optimizer` for a data-parallel policy (`DataParallel`, `Sharded<S>`):
  /// "every tensor's (replicated)" without sharding, else the kinds of state the policy shards
  /// and the pieces (`optimizer_pieces`) the rank owns of them — the same elements for each kind.
  template <class Policy>
  void set_sharding(std::span<const TensorPiece> owned) {
    if constexpr (!Policy::shards_optimizer_state) {
      sharding = "DataParallel";
      optimizer = "fp32 masters and Adam moments of every tensor it holds (replicated)";
    } else {
      sharding = detail::cat("ZeRO-", Policy::stage);
      const char* kinds = Policy::shards_params  ? "weights, grads, fp32 masters and Adam moments"
                          : Policy::shards_grads ? "grads, fp32 masters and Adam moments"
                                                 : "fp32 masters and Adam moments";
      optimizer = detail::cat(kinds, " of ", describe_pieces(owned));
    }
  }
  /// Fills the byte fields from the rank's accountant.
  void count_bytes(const MemoryAccountant& m) {
    weights = m.current(MemTag::weights);
    grads = m.current(MemTag::grads);
    masters_and_moments = m.current(MemTag::master_weights) + m.current(MemTag::optimizer_state);
  }

  /// The entry as printed (see the file comment); every line ends in '\n'.
  [[nodiscard]] std::string text() const {
    std::string out = detail::cat("rank ", rank, " (", position, ")\n");
    const auto line = [&](const char* key, const std::string& value) {
      if (value.empty()) return;
      std::string k(key);
      k.resize(std::max<std::size_t>(k.size() + 1, 11), ' ');  // a column, or one space
      out += detail::cat("  ", k, value, "\n");
    };
    line("layers", layers);
    line("tp slice", tp_slice);
    line(sharding.c_str(), optimizer);
    line("layout", layout);
    std::string bytes =
        detail::cat("model states ", model_state_bytes(), " B (weights ", weights, ", grads ",
                    grads, ", masters and moments ", masters_and_moments, ")");
    if (one_rank_bytes > 0 && model_state_bytes() > 0) {
      bytes += detail::cat(
          "; one rank alone ", one_rank_bytes, " B, ",
          fixed(static_cast<double>(one_rank_bytes) / static_cast<double>(model_state_bytes()), 2),
          "x more");
    }
    line("bytes", bytes);
    return out;
  }

 private:
  static std::string fixed(double v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
  }
};

}  // namespace fourway
