//! Proves a schedule table before it runs: at compile time for a `constexpr` table
//! (`static_assert(fw::schedule::check(table).ok())`), at start for one built at run time
//! (`fw::schedule::verify(table)` throws `ScheduleError` naming the rank, the action and the fix).
//!
//! What a table must satisfy:
//!   1. every action names a micro-batch and chunk that exist; compute runs on the rank that holds
//!      its chunk; a message goes between the ranks of the neighbouring chunks it joins;
//!   2. every (micro-batch, chunk) has exactly one F and either one BW or one B and one W (a
//!      `forward_only` table: exactly one F and no backward at all);
//!   3. per micro-batch and chunk: F before B (or BW) before W;
//!   4. an F has its input before it (the previous chunk's F earlier on this rank, or a recv of
//!      it), a B likewise its output gradient; a send comes after the compute that produced it;
//!   5. every send has exactly one recv on its peer, with the same tag and size, and back;
//!   6. the messages of one stream — one (sender, receiver, kind) — are received in the order
//!      they are sent: NCCL matches point-to-point by order, not tag (parallel/pp/links.hpp);
//!   7. no deadlock when point-to-point calls block (see `Blocking`, schedule/progress.hpp):
//!      consecutive p2p actions form a group that is posted together (NCCL groups,
//!      `batch_isend_irecv`); the simulation runs every rank until all finish or none can move.
//!      Under eager sends the interleaved and ZB-V tables need them once m > p: fourway's
//!      executor gives each (sender, receiver, kind) a communicator of its own
//!      (parallel/pp/links.hpp), so a send waits only for its own recv.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"
#include "fourway/schedule/action.hpp"
#include "fourway/schedule/progress.hpp"
#include "fourway/schedule/table.hpp"

namespace fourway::schedule {

enum class Problem : std::uint8_t {
  none,
  bad_table,        // ranks / chunks / micro-batches / rows inconsistent
  out_of_range,     // micro-batch or chunk that does not exist
  wrong_rank,       // compute on a chunk another rank holds
  wrong_peer,       // a message between ranks that do not hold the neighbouring chunks
  duplicate,        // an action (compute or message) that appears twice
  missing_compute,  // a micro-batch's F, or its backward, never runs on a chunk
  mixed_backward,   // both BW and B/W for the same micro-batch and chunk
  out_of_order,     // B before F, W before B, or a send before what it sends was computed
  missing_input,    // F / B without its input from the previous / next chunk
  unmatched,        // a send without its recv, or a recv without its send
  size_mismatch,    // send and recv disagree on the message size
  stream_order,     // a stream's messages received in another order than sent (NCCL: by order)
  deadlock,         // no rank can progress
  backward_in_forward_only,  // a BW, B or W in a table marked forward_only
};

struct CheckResult {
  Problem problem = Problem::none;
  int rank = -1;   // where it was found
  int index = -1;  // the action's position in that rank's list
  Action action{};
  [[nodiscard]] constexpr bool ok() const { return problem == Problem::none; }
};

namespace detail {

/// Where each compute of each (micro-batch, chunk) sits in its rank's list (-1: absent).
struct Positions {
  int C = 0;
  std::vector<int> f, bw, b, w;
  constexpr Positions(int micro_batches, int chunks)
      : C(chunks),
        f(static_cast<std::size_t>(micro_batches * chunks), -1),
        bw(f.size(), -1),
        b(f.size(), -1),
        w(f.size(), -1) {}
  [[nodiscard]] constexpr std::size_t at(int mb, int c) const {
    return static_cast<std::size_t>(mb) * static_cast<std::size_t>(C) + static_cast<std::size_t>(c);
  }
  [[nodiscard]] constexpr std::vector<int>& of(Op op) {
    return op == Op::forward ? f : op == Op::backward ? bw : op == Op::backward_input ? b : w;
  }
  /// The action that produces the input gradient of (mb, c): BW or B.
  [[nodiscard]] constexpr int grad(int mb, int c) const {
    return bw[at(mb, c)] >= 0 ? bw[at(mb, c)] : b[at(mb, c)];
  }
};

constexpr CheckResult fail(Problem p, int rank, int index, const Action& a) {
  return {p, rank, index, a};
}

/// Finds `op(mb, c)` in rank r's list; -1 if absent.
constexpr int find(const Table& t, int r, Op op, int mb, int c) {
  const auto& row = t.actions[static_cast<std::size_t>(r)];
  for (std::size_t i = 0; i < row.size(); ++i)
    if (row[i].op == op && row[i].micro_batch == mb && row[i].chunk == c)
      return static_cast<int>(i);
  return -1;
}

/// Whether message action `a` joins the ranks it must: sends leave the producing chunk's rank
/// for the consumer's, recvs the other way.
constexpr bool peer_ok(const Table& t, int r, const Action& a) {
  const int C = t.chunks();
  const bool act = a.op == Op::send_activation || a.op == Op::recv_activation;
  const int consumer = act ? a.chunk + 1 : a.chunk - 1;
  if (consumer < 0 || consumer >= C) return false;
  const int from = t.rank_of(a.chunk);
  const int to = t.rank_of(consumer);
  if (from == to) return false;
  return is_send(a.op) ? (r == from && a.peer == to) : (r == to && a.peer == from);
}

/// End (exclusive) of the group of consecutive p2p actions starting at `i`.
constexpr std::size_t group_end(const std::vector<Action>& row, std::size_t i) {
  while (i < row.size() && is_p2p(row[i].op)) ++i;
  return i;
}

/// The table as the deadlock rule sees it: every message with its partner on the peer (rule 5
/// has found them all).
constexpr Steps steps_of(const Table& t) {
  Steps out(static_cast<std::size_t>(t.ranks));
  for (std::size_t r = 0; r < out.size(); ++r) {
    for (const Action& a : t.actions[r]) {
      if (!is_p2p(a.op)) {
        out[r].push_back({});
        continue;
      }
      out[r].push_back({true, is_send(a.op), a.peer,
                        find(t, a.peer, matching_op(a.op), a.micro_batch, a.chunk)});
    }
  }
  return out;
}

}  // namespace detail

/// Checks a table against rules 1-6 above; the first problem found, or `ok()`.
constexpr CheckResult check(const Table& t, Blocking blocking = Blocking::eager) {
  using detail::fail;
  if (t.ranks < 1 || t.chunks_per_rank < 1 || t.micro_batches < 1 ||
      t.actions.size() != static_cast<std::size_t>(t.ranks) ||
      (t.placement == Placement::v_shape && t.chunks_per_rank != 2))
    return fail(Problem::bad_table, -1, -1, {});
  const int C = t.chunks();
  const int m = t.micro_batches;
  detail::Positions pos(m, C);
  // 1 and the duplicate half of 2
  for (int r = 0; r < t.ranks; ++r) {
    const auto& row = t.actions[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < row.size(); ++i) {
      const Action& a = row[i];
      const int ii = static_cast<int>(i);
      if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= C)
        return fail(Problem::out_of_range, r, ii, a);
      if (is_compute(a.op)) {
        if (t.rank_of(a.chunk) != r) return fail(Problem::wrong_rank, r, ii, a);
        int& slot = pos.of(a.op)[pos.at(a.micro_batch, a.chunk)];
        if (slot >= 0) return fail(Problem::duplicate, r, ii, a);
        slot = ii;
      } else {
        if (a.peer < 0 || a.peer >= t.ranks || !detail::peer_ok(t, r, a))
          return fail(Problem::wrong_peer, r, ii, a);
        if (detail::find(t, r, a.op, a.micro_batch, a.chunk) != ii)
          return fail(Problem::duplicate, r, ii, a);
      }
    }
  }
  // 2, 3, 4 for computes
  for (int mb = 0; mb < m; ++mb) {
    for (int c = 0; c < C; ++c) {
      const int r = t.rank_of(c);
      const std::size_t k = pos.at(mb, c);
      const Action F = forward(mb, c);
      if (pos.f[k] < 0) return fail(Problem::missing_compute, r, -1, F);
      if (t.forward_only) {
        const int bad = std::max(pos.bw[k], std::max(pos.b[k], pos.w[k]));
        if (bad >= 0)
          return fail(Problem::backward_in_forward_only, r, bad,
                      t.actions[static_cast<std::size_t>(r)][static_cast<std::size_t>(bad)]);
        if (c > 0) {
          const bool local = t.rank_of(c - 1) == r;
          const int in =
              local ? pos.f[pos.at(mb, c - 1)] : detail::find(t, r, Op::recv_activation, mb, c - 1);
          if (in < 0 || in > pos.f[k]) return fail(Problem::missing_input, r, pos.f[k], F);
        }
        continue;
      }
      const bool split = pos.b[k] >= 0 || pos.w[k] >= 0;
      if (pos.bw[k] >= 0 && split)
        return fail(Problem::mixed_backward, r, pos.bw[k], backward(mb, c));
      if (pos.bw[k] < 0 && (pos.b[k] < 0 || pos.w[k] < 0))
        return fail(Problem::missing_compute, r, -1,
                    pos.b[k] < 0 ? backward_input(mb, c) : backward_weight(mb, c));
      const int g = pos.grad(mb, c);
      const Action G = pos.bw[k] >= 0 ? backward(mb, c) : backward_input(mb, c);
      if (g < pos.f[k]) return fail(Problem::out_of_order, r, g, G);
      if (pos.w[k] >= 0 && pos.w[k] < pos.b[k])
        return fail(Problem::out_of_order, r, pos.w[k], backward_weight(mb, c));
      if (c > 0) {  // the forward's input
        const bool local = t.rank_of(c - 1) == r;
        const int in =
            local ? pos.f[pos.at(mb, c - 1)] : detail::find(t, r, Op::recv_activation, mb, c - 1);
        if (in < 0 || in > pos.f[k]) return fail(Problem::missing_input, r, pos.f[k], F);
      }
      if (c + 1 < C) {  // the backward's output gradient
        const bool local = t.rank_of(c + 1) == r;
        const int in =
            local ? pos.grad(mb, c + 1) : detail::find(t, r, Op::recv_gradient, mb, c + 1);
        if (in < 0 || in > g) return fail(Problem::missing_input, r, g, G);
      }
    }
  }
  // 4 for sends, 5
  for (int r = 0; r < t.ranks; ++r) {
    const auto& row = t.actions[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < row.size(); ++i) {
      const Action& a = row[i];
      const int ii = static_cast<int>(i);
      if (!is_p2p(a.op)) continue;
      if (t.forward_only && (a.op == Op::send_gradient || a.op == Op::recv_gradient))
        return fail(Problem::backward_in_forward_only, r, ii, a);
      if (is_send(a.op)) {
        const int made = a.op == Op::send_activation ? pos.f[pos.at(a.micro_batch, a.chunk)]
                                                     : pos.grad(a.micro_batch, a.chunk);
        if (made > ii) return fail(Problem::out_of_order, r, ii, a);
      }
      const int j = detail::find(t, a.peer, matching_op(a.op), a.micro_batch, a.chunk);
      if (j < 0) return fail(Problem::unmatched, r, ii, a);
      if (t.actions[static_cast<std::size_t>(a.peer)][static_cast<std::size_t>(j)].elements !=
          a.elements)
        return fail(Problem::size_mismatch, r, ii, a);
    }
  }
  // 6: per stream, the receiver's recvs name the sender's sends in order
  for (int r = 0; r < t.ranks; ++r) {
    const auto& row = t.actions[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < row.size(); ++i) {
      const Action& a = row[i];
      if (!is_recv(a.op)) continue;
      // the k-th recv of this stream on r must match the k-th send of it on the peer
      int k = 0;
      for (std::size_t j = 0; j < i; ++j) k += row[j].op == a.op && row[j].peer == a.peer ? 1 : 0;
      const auto& prow = t.actions[static_cast<std::size_t>(a.peer)];
      const Op send = matching_op(a.op);
      int seen = 0;
      for (const Action& b : prow) {
        if (b.op != send || b.peer != r) continue;
        if (seen++ != k) continue;
        if (b.micro_batch != a.micro_batch || b.chunk != a.chunk)
          return fail(Problem::stream_order, r, static_cast<int>(i), a);
        break;
      }
    }
  }
  // 7
  const detail::Stuck stuck = detail::simulate_groups(detail::steps_of(t), blocking);
  if (stuck.finished()) return {};
  return fail(
      Problem::deadlock, stuck.rank, stuck.index,
      t.actions[static_cast<std::size_t>(stuck.rank)][static_cast<std::size_t>(stuck.index)]);
}

/// A sentence for a refused table: what, where, and how to fix it.
inline std::string describe(const CheckResult& res, const Table& t) {
  using fourway::detail::cat;
  if (res.ok()) return cat(t.name, ": valid");
  std::string where = res.rank < 0 ? std::string(t.name)
                                   : cat(t.name, ", rank ", res.rank, ", action ", res.index, " (",
                                         to_string(res.action), ")");
  const Action& a = res.action;
  switch (res.problem) {
    case Problem::none: break;
    case Problem::bad_table:
      return cat(where, ": the table's ranks (", t.ranks, "), chunks per rank (", t.chunks_per_rank,
                 "), micro-batches (", t.micro_batches, ") and rows (", t.actions.size(),
                 ") disagree; give one row per rank (a V places exactly 2 chunks per rank)");
    case Problem::out_of_range:
      return cat(where, ": names a micro-batch or chunk that does not exist (", t.micro_batches,
                 " micro-batches, ", t.chunks(), " chunks)");
    case Problem::wrong_rank:
      return cat(where, ": chunk ", a.chunk, " lives on rank ", t.rank_of(a.chunk),
                 "; move the action to that rank");
    case Problem::wrong_peer:
      return cat(where,
                 ": this message must go between the ranks that hold the neighbouring "
                 "chunks");
    case Problem::duplicate: return cat(where, ": appears twice; every action runs exactly once");
    case Problem::missing_compute:
      return cat(where,
                 ": never runs; every micro-batch needs its forward and backward on every "
                 "chunk");
    case Problem::mixed_backward:
      return cat(where, ": both a full backward and a split B/W; use one or the other");
    case Problem::out_of_order:
      return cat(where,
                 ": runs before what it depends on (F before B before W; a send after the "
                 "compute that produced it)");
    case Problem::missing_input:
      return cat(where,
                 ": has no input before it: add the recv (or run the neighbouring chunk "
                 "first)");
    case Problem::unmatched:
      return cat(where, ": rank ", a.peer, " has no matching ", op_name(matching_op(a.op)),
                 " (tag ", message_tag(a, t.chunks()), ")");
    case Problem::size_mismatch:
      return cat(where, ": the matching action on rank ", a.peer, " expects another size than ",
                 a.elements, " elements");
    case Problem::stream_order:
      return cat(where, ": rank ", a.peer, " sends the ",
                 a.op == Op::recv_gradient ? "gradients" : "activations",
                 " of this stream in another order; NCCL matches point-to-point "
                 "by order, not tag, so this recv would take another message: receive them in "
                 "the order they are sent");
    case Problem::deadlock:
      return cat(where,
                 ": deadlock: no rank can progress; reorder the sends and recvs so that "
                 "each rank sends what its peer waits for before it waits itself");
    case Problem::backward_in_forward_only:
      return cat(where,
                 ": a backward in a forward-only (evaluation) table; an evaluation runs F "
                 "actions and their messages only");
  }
  return where;
}

/// Throws `ScheduleError` unless `check(t, blocking)` accepts the table.
inline void verify(const Table& t, Blocking blocking = Blocking::eager) {
  const CheckResult res = check(t, blocking);
  if (!res.ok()) throw ScheduleError(fourway::detail::cat("fourway: schedule ", describe(res, t)));
}

}  // namespace fourway::schedule
