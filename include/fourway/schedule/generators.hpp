//! Generators of the standard schedule tables, and the pass that adds their messages.
//!
//! Each generator writes the compute order of every rank; `with_p2p` then adds the point-to-point
//! actions: a recv right before the compute that consumes it, a send right after the compute that
//! produces it. The p2p actions that stand between two computes form one group (posted together,
//! as with `ncclGroupStart/End` or `batch_isend_irecv`).
//!
//!     GPipe        all forwards, then all backwards (Huang et al. 2019)
//!     1F1B         rank r warms up with  p - r - 1  forwards, then alternates F and BW, then
//!                  drains the backwards (Narayanan et al. 2021, PipeDream-Flush)
//!                    p=3, m=4   rank 0: F0 F1 F2 BW0 F3 BW1 BW2 BW3
//!                               rank 1: F0 F1 BW0 F2 BW1 F3 BW2 BW3
//!                               rank 2: F0 BW0 F1 BW1 F2 BW2 F3 BW3
//!     interleaved  v chunks per rank (chunk c on rank c % p); micro-batches go in groups of p;
//!                  warm-up  2(p - r - 1) + (v - 1)p  chunk-forwards (Narayanan et al. 2021)
//!     ZB-H1        the backward split into B (input gradient) and W (weight gradient); 1F1B's
//!                  order with rank r deferring each W by r micro-batches, so the W's fill what
//!                  would be 1F1B's bubble (Qi et al. 2023, "Zero Bubble Pipeline Parallelism")
//!                    p=2, m=3   rank 0: F0 F1 B0 W0 F2 B1 W1 B2 W2
//!                               rank 1: F0 B0 F1 B1 W0 F2 B2 W1 W2
//!     ZB-V         two chunks per rank placed in a V (rank r holds chunks r and 2p-1-r); each
//!                  rank runs, at every moment, B if one is ready, else F while fewer than 2p
//!                  chunk-activations (p stage-activations, 1F1B's peak) are alive, else a deferred
//!                  W (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory")
//!
//! ZB-V's order is what that rule produces with F = B = W (the papers' design point);
//! `schedule::simulate` then times any table under any costs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"
#include "fourway/schedule/action.hpp"
#include "fourway/schedule/table.hpp"

namespace fourway::schedule {

enum class Kind : std::uint8_t { gpipe, one_f_one_b, interleaved, zb_h1, zb_v };

constexpr std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::gpipe: return "gpipe";
    case Kind::one_f_one_b: return "1f1b";
    case Kind::interleaved: return "interleaved";
    case Kind::zb_h1: return "zb-h1";
    case Kind::zb_v: return "zb-v";
  }
  return "?";
}

/// What a user asks for: a schedule kind over `ranks` pipeline ranks, `micro_batches` per step,
/// and for the interleaved schedule `virtual_stages` chunks per rank.
struct Request {
  Kind kind = Kind::one_f_one_b;
  int ranks = 1;
  int micro_batches = 1;
  int virtual_stages = 1;
  std::int64_t message_elements = 1;  // size of one activation (= one gradient) message
};

enum class RequestProblem : std::uint8_t {
  none,
  ranks,                 // ranks < 1
  micro_batches,         // micro_batches < 1
  fewer_micro_batches,   // 1F1B / interleaved / zero-bubble with m < p
  not_group_multiple,    // interleaved: m not a multiple of p
  virtual_stages,        // interleaved: v < 2; others: v != 1 (ZB-V: 2 is implied)
  interleaved_one_rank,  // interleaved with p = 1
};

/// Whether a request names a schedule that exists (usable in a `static_assert`).
constexpr RequestProblem validate(const Request& q) {
  if (q.ranks < 1) return RequestProblem::ranks;
  if (q.micro_batches < 1) return RequestProblem::micro_batches;
  switch (q.kind) {
    case Kind::gpipe:
      return q.virtual_stages == 1 ? RequestProblem::none : RequestProblem::virtual_stages;
    case Kind::one_f_one_b:
    case Kind::zb_h1:
    case Kind::zb_v:
      if (q.virtual_stages != 1 && !(q.kind == Kind::zb_v && q.virtual_stages == 2))
        return RequestProblem::virtual_stages;
      return q.micro_batches < q.ranks ? RequestProblem::fewer_micro_batches : RequestProblem::none;
    case Kind::interleaved:
      if (q.ranks < 2) return RequestProblem::interleaved_one_rank;
      if (q.virtual_stages < 2) return RequestProblem::virtual_stages;
      if (q.micro_batches < q.ranks) return RequestProblem::fewer_micro_batches;
      if (q.micro_batches % q.ranks != 0) return RequestProblem::not_group_multiple;
      return RequestProblem::none;
  }
  return RequestProblem::none;
}

/// The message for a request `validate` refuses: the numbers, and what would work.
inline std::string explain(const Request& q, RequestProblem p) {
  using fourway::detail::cat;
  std::string what = cat(kind_name(q.kind), " with ", q.ranks, " pipeline ranks, ", q.micro_batches,
                         " micro-batches, ", q.virtual_stages, " virtual stages");
  switch (p) {
    case RequestProblem::none: return cat(what, ": valid");
    case RequestProblem::ranks: return cat(what, ": needs at least 1 pipeline rank");
    case RequestProblem::micro_batches: return cat(what, ": needs at least 1 micro-batch");
    case RequestProblem::fewer_micro_batches:
      return cat(what, ": needs micro-batches >= pipeline ranks (", q.ranks,
                 ") so that every rank reaches its steady state; raise --micro-batches to ",
                 q.ranks, " or more, or use gpipe");
    case RequestProblem::not_group_multiple: {
      const int lo = q.micro_batches / q.ranks * q.ranks;
      return cat(what, ": interleaved runs micro-batches in groups of ", q.ranks,
                 " (the pipeline ranks); use ", lo > 0 ? cat(lo, " or ") : std::string(),
                 lo + q.ranks, " micro-batches, or use 1f1b");
    }
    case RequestProblem::virtual_stages:
      if (q.kind == Kind::interleaved)
        return cat(what, ": interleaved needs --virtual-stages >= 2 (with 1 it is 1f1b)");
      if (q.kind == Kind::zb_v)
        return cat(what, ": zb-v always places 2 chunks per rank (a V); drop --virtual-stages");
      return cat(what, ": ", kind_name(q.kind),
                 " runs one chunk per rank; drop --virtual-stages or use interleaved");
    case RequestProblem::interleaved_one_rank:
      return cat(what, ": interleaving needs at least 2 pipeline ranks; use 1f1b");
  }
  return what;
}

namespace detail {

[[noreturn]] inline void throw_invalid_request(const Request& q, RequestProblem p) {
  throw ScheduleError(fourway::detail::cat("fourway: schedule ", explain(q, p)));
}

/// The empty table a valid request names; throws `ScheduleError` saying what would work if the
/// request names none.
constexpr Table empty_table(std::string_view name, const Request& q, int chunks_per_rank,
                            Placement placement) {
  if (const RequestProblem p = validate(q); p != RequestProblem::none) throw_invalid_request(q, p);
  Table t;
  t.name = name;
  t.ranks = q.ranks;
  t.chunks_per_rank = chunks_per_rank;
  t.micro_batches = q.micro_batches;
  t.placement = placement;
  t.actions.resize(static_cast<std::size_t>(q.ranks));
  return t;
}

/// One rank's 1F1B pattern over `total` (chunk-)forwards with `warmup` of them first.
/// `fwd(k)` / `bwd(k)` make the k-th forward / backward action.
template <class Fwd, class Bwd>
constexpr void warmup_steady_drain(std::vector<Action>& out, int total, int warmup, Fwd fwd,
                                   Bwd bwd) {
  for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(fwd(warmup + i));
    out.push_back(bwd(i));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(bwd(k));
}

/// The B > F > W list-scheduling rule of the zero-bubble schedules, run with unit costs. Rank r
/// keeps at most `limit` chunk-activations alive (counted from F's start to W's end).
constexpr void zero_bubble_order(Table& t, int limit) {
  const int p = t.ranks;
  const int C = t.chunks();
  const int m = t.micro_batches;
  const auto at = [C](int mb, int c) {
    return static_cast<std::size_t>(mb) * static_cast<std::size_t>(C) + static_cast<std::size_t>(c);
  };
  std::vector<int> f_end(static_cast<std::size_t>(m * C), -1);
  std::vector<int> b_end(f_end.size(), -1);
  std::vector<int> w_end(f_end.size(), -1);
  std::vector<int> free_at(static_cast<std::size_t>(p), 0);
  std::vector<int> in_flight(static_cast<std::size_t>(p), 0);
  std::vector<int> left(static_cast<std::size_t>(p), 3 * m * t.chunks_per_rank);
  std::vector<std::vector<int>> mine(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    mine[static_cast<std::size_t>(r)] = t.chunks_of(r);
  }
  const auto ready = [](int end, int now) { return end >= 0 && end <= now; };
  long guard = 0;
  const long max_steps = 64L * (3L * m * C + 1) * (3L * m * C + 1);
  for (;;) {
    int r = -1;
    for (int q = 0; q < p; ++q) {
      const auto uq = static_cast<std::size_t>(q);
      if (left[uq] > 0 && (r < 0 || free_at[uq] < free_at[static_cast<std::size_t>(r)])) r = q;
    }
    if (r < 0) break;
    if (++guard > max_steps) throw ScheduleError("fourway: zero-bubble generator made no progress");
    const auto ur = static_cast<std::size_t>(r);
    const int now = free_at[ur];
    const std::vector<int>& chunks = mine[ur];
    Action pick{};
    bool found = false;
    // B: the earliest micro-batch whose output gradient is here; the deeper chunk first.
    for (int mb = 0; mb < m && !found; ++mb) {
      for (auto it = chunks.rbegin(); it != chunks.rend() && !found; ++it) {
        const int c = *it;
        if (b_end[at(mb, c)] >= 0 || !ready(f_end[at(mb, c)], now)) continue;
        if (c + 1 < C && !ready(b_end[at(mb, c + 1)], now)) continue;
        pick = backward_input(mb, c);
        found = true;
      }
    }
    // F: while under the limit, the deeper chunk first, then the earliest micro-batch.
    if (!found && in_flight[ur] < limit) {
      for (auto it = chunks.rbegin(); it != chunks.rend() && !found; ++it) {
        const int c = *it;
        for (int mb = 0; mb < m && !found; ++mb) {
          if (f_end[at(mb, c)] >= 0) continue;
          if (c > 0 && !ready(f_end[at(mb, c - 1)], now)) continue;
          pick = forward(mb, c);
          found = true;
        }
      }
    }
    // W: the oldest deferred weight gradient.
    for (int mb = 0; mb < m && !found; ++mb) {
      for (const int c : chunks) {
        if (b_end[at(mb, c)] >= 0 && w_end[at(mb, c)] < 0) {
          pick = backward_weight(mb, c);
          found = true;
          break;
        }
      }
    }
    if (!found) {
      free_at[ur] = now + 1;  // idle one unit: a bubble
      continue;
    }
    const std::size_t i = at(pick.micro_batch, pick.chunk);
    if (pick.op == Op::forward) {
      f_end[i] = now + 1;
      ++in_flight[ur];
    } else if (pick.op == Op::backward_input) {
      b_end[i] = now + 1;
    } else {
      w_end[i] = now + 1;
      --in_flight[ur];
    }
    t.actions[ur].push_back(pick);
    free_at[ur] = now + 1;
    --left[ur];
  }
}

}  // namespace detail

/// Adds the messages between ranks: a recv before each compute that needs another rank's output,
/// a send after each compute whose output another rank needs. Chunks that follow each other on
/// the same rank (the turn of a V) hand over in memory, without a message.
constexpr Table with_p2p(Table t, std::int64_t elements) {
  const int C = t.chunks();
  for (int r = 0; r < t.ranks; ++r) {
    std::vector<Action> out;
    for (const Action& a : t.actions[static_cast<std::size_t>(r)]) {
      const int c = a.chunk;
      const int mb = a.micro_batch;
      const bool fwd = a.op == Op::forward;
      const bool bin = produces_input_grad(a.op);
      if (fwd && c > 0 && t.rank_of(c - 1) != r)
        out.push_back({Op::recv_activation, mb, c - 1, t.rank_of(c - 1), elements});
      if (bin && c + 1 < C && t.rank_of(c + 1) != r)
        out.push_back({Op::recv_gradient, mb, c + 1, t.rank_of(c + 1), elements});
      out.push_back(a);
      if (fwd && c + 1 < C && t.rank_of(c + 1) != r)
        out.push_back({Op::send_activation, mb, c, t.rank_of(c + 1), elements});
      if (bin && c > 0 && t.rank_of(c - 1) != r)
        out.push_back({Op::send_gradient, mb, c, t.rank_of(c - 1), elements});
    }
    t.actions[static_cast<std::size_t>(r)] = out;
  }
  return t;
}

/// The forward-only (evaluation) table of a training table `t`: the same ranks, chunks,
/// placement and micro-batches, each rank running its chunks in model order and each chunk's
/// micro-batches in order (GPipe's forward half, so the stages overlap), with their messages.
/// Nothing waits for a backward, so every schedule's evaluation is this table.
constexpr Table forward_only(const Table& t, std::int64_t elements = 1) {
  Table e;
  e.name = "forward-only";
  e.ranks = t.ranks;
  e.chunks_per_rank = t.chunks_per_rank;
  e.micro_batches = t.micro_batches;
  e.placement = t.placement;
  e.forward_only = true;
  e.actions.resize(static_cast<std::size_t>(t.ranks));
  for (int r = 0; r < t.ranks; ++r) {
    for (const int c : t.chunks_of(r)) {
      for (int mb = 0; mb < t.micro_batches; ++mb)
        e.actions[static_cast<std::size_t>(r)].push_back(forward(mb, c));
    }
  }
  return with_p2p(e, elements);
}

/// GPipe: every forward, then every backward (micro-batches in order both ways).
constexpr Table gpipe(int ranks, int micro_batches, std::int64_t elements = 1) {
  const Request q{Kind::gpipe, ranks, micro_batches, 1, elements};
  Table t = detail::empty_table("GPipe", q, 1, Placement::loop);
  for (int r = 0; r < ranks; ++r) {
    auto& out = t.actions[static_cast<std::size_t>(r)];
    for (int mb = 0; mb < micro_batches; ++mb) out.push_back(forward(mb, r));
    for (int mb = 0; mb < micro_batches; ++mb) out.push_back(backward(mb, r));
  }
  return with_p2p(t, elements);
}

/// 1F1B (PipeDream-Flush): warm-up `ranks - r - 1` forwards, then one forward one backward.
constexpr Table one_f_one_b(int ranks, int micro_batches, std::int64_t elements = 1) {
  const Request q{Kind::one_f_one_b, ranks, micro_batches, 1, elements};
  Table t = detail::empty_table("1F1B", q, 1, Placement::loop);
  for (int r = 0; r < ranks; ++r) {
    detail::warmup_steady_drain(
        t.actions[static_cast<std::size_t>(r)], micro_batches, ranks - r - 1,
        [r](int k) { return forward(k, r); }, [r](int k) { return backward(k, r); });
  }
  return with_p2p(t, elements);
}

/// Interleaved 1F1B with `v` chunks per rank (chunk c on rank c % ranks). The k-th chunk-forward
/// of a rank runs micro-batch `(k / (p v)) p + k % p` on its local chunk `(k / p) % v`; backwards
/// visit the local chunks in the reverse order (Megatron-LM's interleaved schedule).
constexpr Table interleaved(int ranks, int micro_batches, int v, std::int64_t elements = 1) {
  const Request q{Kind::interleaved, ranks, micro_batches, v, elements};
  Table t = detail::empty_table("interleaved 1F1B", q, v, Placement::loop);
  const int p = ranks;
  const int total = micro_batches * v;
  const auto mb_of = [p, v](int k) { return k / (p * v) * p + k % p; };
  const auto local_of = [p, v](int k) { return k / p % v; };
  for (int r = 0; r < p; ++r) {
    const int warm = 2 * (p - r - 1) + (v - 1) * p;
    detail::warmup_steady_drain(
        t.actions[static_cast<std::size_t>(r)], total, warm < total ? warm : total,
        [=](int k) { return forward(mb_of(k), local_of(k) * p + r); },
        [=](int k) { return backward(mb_of(k), (v - 1 - local_of(k)) * p + r); });
  }
  return with_p2p(t, elements);
}

/// ZB-H1: 1F1B with the backward split, rank r deferring each W by r micro-batches. Every rank
/// then keeps at most `ranks` micro-batches alive (1F1B's peak, that of rank 0) and idles
/// (p-1)(F+B-W) instead of 1F1B's (p-1)(F+B+W).
constexpr Table zb_h1(int ranks, int micro_batches, std::int64_t elements = 1) {
  const Request q{Kind::zb_h1, ranks, micro_batches, 1, elements};
  Table t = detail::empty_table("ZB-H1", q, 1, Placement::loop);
  const int m = micro_batches;
  for (int r = 0; r < ranks; ++r) {
    auto& out = t.actions[static_cast<std::size_t>(r)];
    const int warm = ranks - r - 1;
    int w = 0;  // next deferred weight gradient
    for (int k = 0; k < warm; ++k) out.push_back(forward(k, r));
    for (int k = 0; k < m; ++k) {
      if (warm + k < m) out.push_back(forward(warm + k, r));
      out.push_back(backward_input(k, r));
      if (k >= r) out.push_back(backward_weight(w++, r));
    }
    while (w < m) out.push_back(backward_weight(w++, r));
  }
  return with_p2p(t, elements);
}

/// ZB-V: two chunks per rank in a V, B > F > W with at most 2 * ranks chunk-activations in flight.
constexpr Table zb_v(int ranks, int micro_batches, std::int64_t elements = 1) {
  const Request q{Kind::zb_v, ranks, micro_batches, 2, elements};
  Table t = detail::empty_table("ZB-V", q, 2, Placement::v_shape);
  detail::zero_bubble_order(t, 2 * ranks);
  return with_p2p(t, elements);
}

/// The table a request names (throws `ScheduleError` saying what would work when it names none).
constexpr Table make(const Request& q) {
  if (const RequestProblem p = validate(q); p != RequestProblem::none)
    detail::throw_invalid_request(q, p);
  switch (q.kind) {
    case Kind::gpipe: return gpipe(q.ranks, q.micro_batches, q.message_elements);
    case Kind::one_f_one_b: return one_f_one_b(q.ranks, q.micro_batches, q.message_elements);
    case Kind::interleaved:
      return interleaved(q.ranks, q.micro_batches, q.virtual_stages, q.message_elements);
    case Kind::zb_h1: return zb_h1(q.ranks, q.micro_batches, q.message_elements);
    case Kind::zb_v: return zb_v(q.ranks, q.micro_batches, q.message_elements);
  }
  return {};
}

}  // namespace fourway::schedule
