//! A pipeline schedule as data: for every pipeline rank, the list of actions it runs, in order.
//!
//! The model is cut into `chunks() = ranks * chunks_per_rank` consecutive chunks. Where chunk c
//! lives is the placement:
//!
//!     loop     (GPipe, 1F1B, ZB-H1, interleaved)   chunk c on rank c % ranks
//!              ranks=2, v=2:   rank 0: c0 c2    rank 1: c1 c3
//!     v_shape  (ZB-V, two chunks per rank)         down then up: rank r holds r and 2p-1-r
//!              ranks=2:        rank 0: c0 c3    rank 1: c1 c2     (c1 -> c2 stays on rank 1)
//!
//! A table is plain data: `constexpr`-constructible (a generator's result can be checked in a
//! `static_assert`), printable, and writable by hand — one executor runs any table that
//! `schedule::check` accepts.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"
#include "fourway/schedule/action.hpp"

namespace fourway::schedule {

enum class Placement : std::uint8_t { loop, v_shape };

struct Table {
  std::string_view name = "custom";
  int ranks = 1;
  int chunks_per_rank = 1;
  int micro_batches = 1;
  Placement placement = Placement::loop;
  /// Forwards only (evaluation, `schedule::forward_only`): no backward may appear, none is
  /// required.
  bool forward_only = false;
  std::vector<std::vector<Action>> actions;  // [rank] -> program order

  [[nodiscard]] constexpr int chunks() const { return ranks * chunks_per_rank; }

  /// The pipeline rank that holds model chunk `c`.
  [[nodiscard]] constexpr int rank_of(int c) const {
    if (placement == Placement::v_shape) return c < ranks ? c : 2 * ranks - 1 - c;
    return c % ranks;
  }

  /// The chunks rank `r` holds, in model order.
  [[nodiscard]] constexpr std::vector<int> chunks_of(int r) const {
    std::vector<int> out;
    for (int c = 0; c < chunks(); ++c)
      if (rank_of(c) == r) out.push_back(c);
    return out;
  }
};

/// `F0.1` (action, micro-batch, chunk), `send_F0.0>1` (to rank 1), `recv_B0.1<1` (from rank 1).
inline std::string to_string(const Action& a) {
  const char* dir = is_send(a.op) ? ">" : is_recv(a.op) ? "<" : "";
  return fourway::detail::cat(op_name(a.op), a.micro_batch, ".", a.chunk, dir,
                              is_p2p(a.op) ? fourway::detail::cat(a.peer) : std::string());
}

/// One line per rank.
inline std::string to_string(const Table& t) {
  std::ostringstream os;
  os << t.name << ": " << t.ranks << " ranks x " << t.chunks_per_rank << " chunks, "
     << t.micro_batches << " micro-batches\n";
  for (int r = 0; r < t.ranks; ++r) {
    os << "  rank " << r << ":";
    for (const Action& a : t.actions[static_cast<std::size_t>(r)]) os << " " << to_string(a);
    os << "\n";
  }
  return os.str();
}

}  // namespace fourway::schedule
