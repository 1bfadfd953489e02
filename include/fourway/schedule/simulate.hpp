//! Times a checked schedule table under per-action costs: the makespan, each rank's busy and idle
//! time (the bubble), and the peak number of chunk-activations each rank keeps alive.
//!
//! Timing semantics (those of fourway's executor, `Blocking::eager`): a rank runs its actions in
//! order; a compute takes its cost; at a group of p2p actions the rank posts the group's sends at
//! its clock and goes on when every recv of the group has arrived and the group's own overhead is
//! paid, at `max(clock + p2p_group, send posted + p2p)` (p2p: a message's latency from its post
//! to its recv's completion; p2p_group: what a group costs its rank when nothing is waited for,
//! e.g. posting the sends and taking messages that already arrived; neither is busy time). The
//! checker has proved every recv finds its send. `simulate_actions` takes a cost per action
//! (per chunk, or each action's measured time) instead of one per kind of action.
//!
//! Activations: a chunk-activation is alive on a rank from the start of its F to the end of its
//! BW (or W). With F = B = W and p2p = 0, GPipe and 1F1B idle `(p-1)/(m+p-1)` of the makespan on
//! every rank; 1F1B keeps `p - r` micro-batches alive on rank r, GPipe `m`.
#pragma once

#include <cstdint>
#include <vector>

#include "fourway/config.hpp"
#include "fourway/core/error.hpp"
#include "fourway/schedule/action.hpp"
#include "fourway/schedule/check.hpp"
#include "fourway/schedule/table.hpp"

namespace fourway::schedule {

/// Per-action costs in any unit (seconds, or F = 1). A full backward costs B + W unless given.
struct Costs {
  double forward = 1.0;
  double backward_input = 1.0;
  double backward_weight = 1.0;
  double backward = -1.0;  // < 0: backward_input + backward_weight
  double p2p = 0.0;        // from a send's post to the recv's completion
  double p2p_group = 0.0;  // a p2p group's cost to its rank when it waits for nothing

  [[nodiscard]] constexpr double of(Op op) const {
    switch (op) {
      case Op::forward: return forward;
      case Op::backward: return backward >= 0 ? backward : backward_input + backward_weight;
      case Op::backward_input: return backward_input;
      case Op::backward_weight: return backward_weight;
      default: return 0.0;
    }
  }
};

struct Span {
  double start = 0.0;
  double end = 0.0;
};

struct Timeline {
  double makespan = 0.0;
  std::vector<double> busy;              // [rank] compute time
  std::vector<int> peak_in_flight;       // [rank] chunk-activations alive at once
  std::vector<std::vector<Span>> spans;  // [rank][action]

  [[nodiscard]] constexpr double idle(int r) const {
    return makespan - busy[static_cast<std::size_t>(r)];
  }
  /// Idle fraction of rank r: its share of the bubble.
  [[nodiscard]] constexpr double bubble(int r) const {
    return makespan > 0 ? idle(r) / makespan : 0.0;
  }
  /// Idle fraction over all ranks.
  [[nodiscard]] constexpr double bubble() const {
    double sum = 0;
    for (std::size_t r = 0; r < busy.size(); ++r) sum += bubble(static_cast<int>(r));
    return busy.empty() ? 0.0 : sum / static_cast<double>(busy.size());
  }
};

/// The peak number of chunk-activations rank r keeps alive, counted in program order.
constexpr int peak_in_flight(const Table& t, int r) {
  int alive = 0;
  int peak = 0;
  for (const Action& a : t.actions[static_cast<std::size_t>(r)]) {
    if (a.op == Op::forward) peak = ++alive > peak ? alive : peak;
    if (frees_activations(a.op)) --alive;
  }
  return peak;
}

namespace detail {
[[noreturn]] inline void throw_refused(const Table& t, const CheckResult& res) {
  throw ScheduleError(fourway::detail::cat("fourway: schedule ", describe(res, t)));
}
}  // namespace detail

/// Times `t` (which must pass `check`) with compute action i of rank r costing
/// `cost_of(r, i, action)`, and the p2p costs `p2p` (latency) and `p2p_group` (see the file
/// comment).
template <class CostOf>
constexpr Timeline simulate_actions(const Table& t, CostOf&& cost_of, double p2p,
                                    double p2p_group = 0.0) {
  if (const CheckResult res = check(t, Blocking::eager); !res.ok()) detail::throw_refused(t, res);
  const auto P = static_cast<std::size_t>(t.ranks);
  Timeline tl;
  tl.busy.assign(P, 0.0);
  tl.spans.resize(P);
  tl.peak_in_flight.resize(P);
  std::vector<double> clock(P, 0.0);
  std::vector<std::size_t> pc(P, 0);
  for (std::size_t r = 0; r < P; ++r) {
    tl.spans[r].resize(t.actions[r].size());
    tl.peak_in_flight[r] = peak_in_flight(t, static_cast<int>(r));
  }
  // post time of every send, by (peer, index of its recv): found through the recv's position
  std::vector<std::vector<double>> posted(P);
  for (std::size_t r = 0; r < P; ++r) posted[r].assign(t.actions[r].size(), -1.0);
  for (;;) {
    bool progress = false;
    bool done = true;
    for (std::size_t r = 0; r < P; ++r) {
      const auto& row = t.actions[r];
      while (pc[r] < row.size()) {
        const Action& a = row[pc[r]];
        if (is_compute(a.op)) {
          const double cost = cost_of(static_cast<int>(r), pc[r], a);
          tl.spans[r][pc[r]] = {clock[r], clock[r] + cost};
          tl.busy[r] += cost;
          clock[r] += cost;
          ++pc[r];
          progress = true;
          continue;
        }
        // a group of p2p actions: post its sends now, then wait for its recvs' sends
        const std::size_t end = detail::group_end(row, pc[r]);
        double ready = clock[r] + p2p_group;
        bool all = true;
        for (std::size_t i = pc[r]; i < end; ++i) {
          const Action& m = row[i];
          if (is_send(m.op)) {
            const int j = detail::find(t, m.peer, matching_op(m.op), m.micro_batch, m.chunk);
            auto& slot = posted[static_cast<std::size_t>(m.peer)][static_cast<std::size_t>(j)];
            if (slot < 0) {
              slot = clock[r];
              tl.spans[r][i] = {clock[r], clock[r]};
              progress = true;
            }
            continue;
          }
          if (posted[r][i] < 0) {
            all = false;
            continue;
          }
          const double arrive = posted[r][i] + p2p;
          ready = arrive > ready ? arrive : ready;
        }
        if (!all) break;  // a recv whose send is not posted yet
        for (std::size_t i = pc[r]; i < end; ++i)
          if (is_recv(row[i].op)) tl.spans[r][i] = {clock[r], ready};
        clock[r] = ready;
        pc[r] = end;
        progress = true;
      }
      if (pc[r] < row.size()) done = false;
    }
    if (done) break;
    if (!progress) throw ScheduleError("fourway: schedule simulation made no progress");
  }
  for (std::size_t r = 0; r < P; ++r) tl.makespan = clock[r] > tl.makespan ? clock[r] : tl.makespan;
  return tl;
}

/// Times `t` (which must pass `check`) under `costs`.
constexpr Timeline simulate(const Table& t, const Costs& costs) {
  return simulate_actions(
      t, [&](int, std::size_t, const Action& a) { return costs.of(a.op); }, costs.p2p,
      costs.p2p_group);
}

/// Times `t` with chunk c's compute actions costing `per_chunk[c]` (its p2p costs are unused;
/// `p2p` gives them).
constexpr Timeline simulate(const Table& t, const std::vector<Costs>& per_chunk, const Costs& p2p) {
  if (static_cast<int>(per_chunk.size()) != t.chunks())
    throw ScheduleError(fourway::detail::cat("fourway: ", per_chunk.size(),
                                             " chunk costs for a schedule of ", t.chunks(),
                                             " chunks; give one Costs per chunk"));
  return simulate_actions(
      t,
      [&](int, std::size_t, const Action& a) {
        return per_chunk[static_cast<std::size_t>(a.chunk)].of(a.op);
      },
      p2p.p2p, p2p.p2p_group);
}

}  // namespace fourway::schedule
