//! Does a message program finish? The deadlock rule shared by the pipeline tables
//! (schedule/check.hpp) and the ring exchanges (schedule/exchange.hpp): every rank runs its list in
//! order; a compute never waits; a run of consecutive point-to-point steps is one group, posted
//! together (NCCL groups, `batch_isend_irecv`, MPI's requests waited together).
//!
//! The checkers first prove that every message has exactly one partner on its peer; they hand the
//! simulation each step's partner (its index in the peer's list), so the rules below never search.
//!
//!   rendezvous  a group returns when every one of its messages is matched by its partner in the
//!               group the peer is at (one NCCL communicator, which runs its operations in order;
//!               MPI_Ssend);
//!   eager       a group's sends never hold the rank back; its recvs wait until their sends are
//!               posted (a communicator per stream, or a send buffered until waited for).
//!
//! A program safe under rendezvous is safe under eager, not the other way round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fourway/config.hpp"

namespace fourway::schedule {

/// How point-to-point calls block, for the deadlock rule (see the file comment).
enum class Blocking : std::uint8_t { rendezvous, eager };

namespace detail {

/// One step of a rank's list, as the simulation sees it.
struct Step {
  bool p2p = false;
  bool send = false;
  int peer = -1;
  int partner = -1;  // p2p: the index of the matching message in the peer's list
};
using Steps = std::vector<std::vector<Step>>;  // [rank] -> program order

/// Where the simulation stopped: the first unmatched message of a stuck rank's group (rank -1:
/// every rank finished).
struct Stuck {
  int rank = -1;
  int index = -1;
  [[nodiscard]] constexpr bool finished() const { return rank < 0; }
};

/// End (exclusive) of the group of consecutive p2p steps starting at `i`.
constexpr std::size_t group_end(const std::vector<Step>& row, std::size_t i) {
  while (i < row.size() && row[i].p2p) ++i;
  return i;
}

/// Runs every rank until all finish or none can move.
constexpr Stuck simulate_groups(const Steps& steps, Blocking blocking) {
  const std::size_t P = steps.size();
  std::vector<std::size_t> pc(P, 0);
  std::vector<std::vector<bool>> done(P);  // eager: posted; rendezvous: matched
  for (std::size_t r = 0; r < P; ++r) done[r].assign(steps[r].size(), false);
  for (;;) {
    bool progress = false;
    bool finished = true;
    for (std::size_t r = 0; r < P; ++r) {
      const auto& row = steps[r];
      while (pc[r] < row.size()) {
        if (!row[pc[r]].p2p) {
          ++pc[r];
          progress = true;
          continue;
        }
        const std::size_t end = group_end(row, pc[r]);
        bool all = true;
        for (std::size_t i = pc[r]; i < end; ++i) {
          const Step& s = row[i];
          const auto q = static_cast<std::size_t>(s.peer);
          const auto j = static_cast<std::size_t>(s.partner);
          if (blocking == Blocking::eager) {
            if (s.send) {  // posted as the rank reaches its group
              progress = progress || !done[r][i];
              done[r][i] = true;
            } else {
              all = all && done[q][j];
            }
            continue;
          }
          if (done[r][i]) continue;
          // matched when the peer is at the group holding the partner
          const bool hit = pc[q] <= j && j < group_end(steps[q], pc[q]);
          if (hit) {
            done[r][i] = true;
            done[q][j] = true;
            progress = true;
          }
          all = all && hit;
        }
        if (!all) break;
        pc[r] = end;
        progress = true;
      }
      if (pc[r] < row.size()) finished = false;
    }
    if (finished) return {};
    if (!progress) {
      for (std::size_t r = 0; r < P; ++r) {
        const auto& row = steps[r];
        if (pc[r] >= row.size()) continue;
        for (std::size_t i = pc[r]; i < group_end(row, pc[r]); ++i) {
          const bool waiting = blocking == Blocking::eager ? !row[i].send : !done[r][i];
          if (waiting) return {static_cast<int>(r), static_cast<int>(i)};
        }
      }
      return {0, 0};
    }
  }
}

}  // namespace detail
}  // namespace fourway::schedule
