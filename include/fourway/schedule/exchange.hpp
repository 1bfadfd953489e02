//! A point-to-point exchange as data, proved before it runs: for every rank of a group, its
//! messages and computes in order — context parallelism's ring (parallel/cp/ring_schedule.hpp) is
//! one. Where a pipeline table (schedule/table.hpp) names each message by the micro-batch and chunk
//! that produced it, an exchange's messages are named by where they go and their tag, and all of
//! them travel on one communicator, the group's.
//!
//! What an exchange must satisfy (`check`, or `verify`, which throws `ScheduleError`):
//!   1. one row per rank; every message goes to another rank of the group and carries elements;
//!   2. per stream — one (sender, receiver) — the k-th send is the k-th recv on the receiver, with
//!      the same tag and size: NCCL matches point-to-point by order on a communicator, MPI by
//!      order within a tag, so a recv that expects another tag or size takes the wrong message
//!      (or waits for one that never comes);
//!   3. no deadlock (schedule/progress.hpp): consecutive messages form a group posted together,
//!      under rendezvous (the strictest: one NCCL communicator) or eager sends.
//! A rank that posts a group and waits for it after a compute (the ring's overlap) finishes
//! whenever the program that waits at once does: a compute never waits for anything.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"
#include "fourway/schedule/check.hpp"
#include "fourway/schedule/progress.hpp"

namespace fourway::schedule {

enum class Move : std::uint8_t { compute, send, recv };

/// One entry of a rank's list: a compute (its `step`, a label) or a message to / from `peer`.
struct Transfer {
  Move move = Move::compute;
  int peer = -1;
  int tag = 0;
  std::int64_t elements = 0;
  int step = 0;  // compute: which step of the rank's work

  constexpr bool operator==(const Transfer&) const = default;
};

constexpr Transfer compute_step(int step) { return {Move::compute, -1, 0, 0, step}; }
constexpr Transfer send_to(int peer, int tag, std::int64_t elements) {
  return {Move::send, peer, tag, elements, 0};
}
constexpr Transfer recv_from(int peer, int tag, std::int64_t elements) {
  return {Move::recv, peer, tag, elements, 0};
}

struct Exchange {
  std::string_view name = "exchange";
  int ranks = 1;
  std::vector<std::vector<Transfer>> moves;  // [rank] -> program order
};

struct ExchangeResult {
  Problem problem = Problem::none;
  int rank = -1;
  int index = -1;
  Transfer transfer{};
  [[nodiscard]] constexpr bool ok() const { return problem == Problem::none; }
};

namespace detail {

/// The index in `row` of the k-th message `move` with `peer`; -1 if there are fewer.
constexpr int kth(const std::vector<Transfer>& row, Move move, int peer, int k) {
  for (std::size_t i = 0; i < row.size(); ++i)
    if (row[i].move == move && row[i].peer == peer && k-- == 0) return static_cast<int>(i);
  return -1;
}

/// Each message's partner on its peer: the recv of the same stream at the same position.
constexpr std::vector<std::vector<int>> partners(const Exchange& x) {
  std::vector<std::vector<int>> out(x.moves.size());
  for (std::size_t r = 0; r < x.moves.size(); ++r) {
    const auto& row = x.moves[r];
    for (std::size_t i = 0; i < row.size(); ++i) {
      const Transfer& t = row[i];
      if (t.move == Move::compute) {
        out[r].push_back(-1);
        continue;
      }
      int k = 0;  // this message's position in its stream
      for (std::size_t j = 0; j < i; ++j) k += row[j].move == t.move && row[j].peer == t.peer;
      const Move other = t.move == Move::send ? Move::recv : Move::send;
      out[r].push_back(
          kth(x.moves[static_cast<std::size_t>(t.peer)], other, static_cast<int>(r), k));
    }
  }
  return out;
}

}  // namespace detail

/// Checks an exchange against rules 1-3 above; the first problem found, or `ok()`.
constexpr ExchangeResult check(const Exchange& x, Blocking blocking = Blocking::rendezvous) {
  const auto fail = [&](Problem p, std::size_t r, std::size_t i) {
    return ExchangeResult{p, static_cast<int>(r), static_cast<int>(i), x.moves[r][i]};
  };
  if (x.ranks < 1 || x.moves.size() != static_cast<std::size_t>(x.ranks))
    return {Problem::bad_table, -1, -1, {}};
  for (std::size_t r = 0; r < x.moves.size(); ++r) {
    for (std::size_t i = 0; i < x.moves[r].size(); ++i) {
      const Transfer& t = x.moves[r][i];
      if (t.move == Move::compute) continue;
      if (t.peer < 0 || t.peer >= x.ranks || t.peer == static_cast<int>(r) || t.elements < 1)
        return fail(Problem::wrong_peer, r, i);
    }
  }
  const auto partner = detail::partners(x);
  detail::Steps steps(x.moves.size());
  for (std::size_t r = 0; r < x.moves.size(); ++r) {
    for (std::size_t i = 0; i < x.moves[r].size(); ++i) {
      const Transfer& t = x.moves[r][i];
      if (t.move == Move::compute) {
        steps[r].push_back({});
        continue;
      }
      const int j = partner[r][i];
      if (j < 0) return fail(Problem::unmatched, r, i);
      const Transfer& u = x.moves[static_cast<std::size_t>(t.peer)][static_cast<std::size_t>(j)];
      if (u.tag != t.tag) return fail(Problem::stream_order, r, i);
      if (u.elements != t.elements) return fail(Problem::size_mismatch, r, i);
      steps[r].push_back({true, t.move == Move::send, t.peer, j});
    }
  }
  const detail::Stuck stuck = detail::simulate_groups(steps, blocking);
  if (stuck.finished()) return {};
  return fail(Problem::deadlock, static_cast<std::size_t>(stuck.rank),
              static_cast<std::size_t>(stuck.index));
}

/// `send>1#30001:96`, `recv<3#30001:96`, `compute2`.
inline std::string to_string(const Transfer& t) {
  using fourway::detail::cat;
  if (t.move == Move::compute) return cat("compute", t.step);
  return cat(t.move == Move::send ? "send>" : "recv<", t.peer, "#", t.tag, ":", t.elements);
}

/// One line per rank.
inline std::string to_string(const Exchange& x) {
  std::ostringstream os;
  os << x.name << ": " << x.ranks << " ranks\n";
  for (std::size_t r = 0; r < x.moves.size(); ++r) {
    os << "  rank " << r << ":";
    for (const Transfer& t : x.moves[r]) os << " " << to_string(t);
    os << "\n";
  }
  return os.str();
}

/// A sentence for a refused exchange: what, where, and how to fix it.
inline std::string describe(const ExchangeResult& res, const Exchange& x) {
  using fourway::detail::cat;
  if (res.ok()) return cat(x.name, ": valid");
  std::string where = res.rank < 0 ? std::string(x.name)
                                   : cat(x.name, ", rank ", res.rank, ", entry ", res.index, " (",
                                         to_string(res.transfer), ")");
  const Transfer& t = res.transfer;
  switch (res.problem) {
    case Problem::bad_table:
      return cat(where, ": the exchange has ", x.moves.size(), " rows for ", x.ranks,
                 " ranks; give one row per rank");
    case Problem::wrong_peer:
      return cat(where, ": a message must go to another rank of the group (0..", x.ranks - 1,
                 ") and carry at least one element");
    case Problem::unmatched:
      return cat(where, ": rank ", t.peer, " has no ", t.move == Move::send ? "recv" : "send",
                 " at this position of the stream; every send needs exactly one recv");
    case Problem::stream_order:
      return cat(where, ": rank ", t.peer,
                 " has a message of another tag at this position of the stream; NCCL matches "
                 "point-to-point by order, so it would take this one: send and receive each "
                 "stream in the same order");
    case Problem::size_mismatch:
      return cat(where, ": rank ", t.peer, "'s matching message has another size than ", t.elements,
                 " elements");
    case Problem::deadlock:
      return cat(where,
                 ": deadlock: no rank can progress; post each rank's send in the same group as "
                 "the recv it waits on");
    default: break;
  }
  return where;
}

/// Throws `ScheduleError` unless `check(x, blocking)` accepts the exchange.
inline void verify(const Exchange& x, Blocking blocking = Blocking::rendezvous) {
  const ExchangeResult res = check(x, blocking);
  if (!res.ok()) throw ScheduleError(fourway::detail::cat("fourway: exchange ", describe(res, x)));
}

}  // namespace fourway::schedule
