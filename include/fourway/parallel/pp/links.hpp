//! `pp::Links<Comm>`: the point-to-point streams of a pipeline — one two-rank communicator for
//! every (sender, receiver, kind) that a schedule table sends over, kind being activations or
//! gradients — split once from the pipeline group.
//!
//! Why not the pipeline group itself: NCCL runs a communicator's operations in issue order and
//! a send completes only when its recv is posted. On one communicator a send that waits for its
//! recv holds back every later operation of the rank, and the interleaved and ZB-V tables then
//! deadlock once micro-batches outnumber stages (schedule/check.hpp, `Blocking::rendezvous`).
//! With a stream per (sender, receiver, kind), a send waits only for its own recv and holds back
//! only later sends of the same stream, which that receiver takes in the same order anyway
//! (the checker's order rule): the host never waits for a send, only for the recvs it needs —
//! the eager model the checker proves tables against, here made true on NCCL (PyTorch's NCCL
//! process group likewise gives each pair of ranks its own communicator for point-to-point).
//!
//!   pipeline ranks 0 1 2, loop placement:    0 ──act──▶ 1 ──act──▶ 2
//!                                            0 ◀──grad── 1 ◀──grad── 2      4 streams
//!
//! Every rank derives the same list of streams from the table and makes them in rounds of
//! splits, each rank in at most one stream per round (the others split off alone). A stream
//! carries the pipeline group's name, so byte counters (comm/counting.hpp) add it to the group.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/schedule/action.hpp"
#include "fourway/schedule/table.hpp"

namespace fourway::pp {

template <class Comm>
class Links {
 public:
  /// One stream: messages of one kind from `src` to `dst` (pipeline ranks).
  struct Link {
    int src = 0;
    int dst = 0;
    bool gradient = false;
    friend bool operator<(const Link& a, const Link& b) {
      return std::tie(a.src, a.dst, a.gradient) < std::tie(b.src, b.dst, b.gradient);
    }
    friend bool operator==(const Link&, const Link&) = default;
  };

  /// The streams `table` sends over (the same list on every rank).
  static std::vector<Link> of(const schedule::Table& table) {
    std::vector<Link> all;
    for (int r = 0; r < table.ranks; ++r) {
      for (const schedule::Action& a : table.actions[static_cast<std::size_t>(r)]) {
        if (!schedule::is_send(a.op)) continue;
        const Link l{r, a.peer, a.op == schedule::Op::send_gradient};
        bool known = false;
        for (const Link& k : all) known = known || k == l;
        if (!known) all.push_back(l);
      }
    }
    std::sort(all.begin(), all.end());
    return all;
  }

  /// Makes this rank's streams: a collective over `pp` (every rank calls it with its table).
  Links(Comm& pp, const schedule::Table& table) : rank_(pp.rank()) {
    check<ConfigError>(pp.size() == table.ranks, "fourway: the pipeline group has ", pp.size(),
                       " ranks but the schedule '", table.name, "' has ", table.ranks);
    std::vector<Link> left = of(table);
    const int n = pp.size();
    const std::string name(pp.name());
    while (!left.empty()) {
      // a round: streams whose two ranks are in no other stream of the round
      std::vector<char> busy(static_cast<std::size_t>(n), 0);
      std::vector<Link> round, later;
      for (const Link& l : left) {
        if (busy[static_cast<std::size_t>(l.src)] || busy[static_cast<std::size_t>(l.dst)]) {
          later.push_back(l);
          continue;
        }
        busy[static_cast<std::size_t>(l.src)] = busy[static_cast<std::size_t>(l.dst)] = 1;
        round.push_back(l);
      }
      int color = static_cast<int>(round.size()) + rank_;  // alone unless in a stream
      int key = 0;
      const Link* mine = nullptr;
      for (std::size_t i = 0; i < round.size(); ++i) {
        if (round[i].src == rank_ || round[i].dst == rank_) {
          mine = &round[i];
          color = static_cast<int>(i);
          key = round[i].src == rank_ ? 0 : 1;  // the sender is rank 0 of the stream
        }
      }
      auto c = std::make_unique<Comm>(pp.split(color, key, name));
      if (mine != nullptr) streams_.emplace(*mine, std::move(c));
      left = std::move(later);
    }
  }

  /// The stream this rank sends `gradient`s (else activations) to `peer` on (its rank 0 is this
  /// rank, the peer its rank 1).
  Comm& to(int peer, bool gradient) { return at({rank_, peer, gradient}); }
  /// The stream this rank receives them from `peer` on (the peer is its rank 0).
  Comm& from(int peer, bool gradient) { return at({peer, rank_, gradient}); }
  /// Every stream this rank is in (to bind a device stream to, say).
  template <class F>
  void for_each(F&& f) {
    for (auto& [l, c] : streams_) f(*c);
  }

 private:
  Comm& at(const Link& l) {
    auto it = streams_.find(l);
    check<ConfigError>(it != streams_.end(), "fourway: pipeline rank ", rank_,
                       " has no stream for ", l.gradient ? "gradients" : "activations",
                       " from rank ", l.src, " to rank ", l.dst,
                       "; the schedule table sends none there");
    return *it->second;
  }

  int rank_;
  std::map<Link, std::unique_ptr<Comm>> streams_;
};

}  // namespace fourway::pp
