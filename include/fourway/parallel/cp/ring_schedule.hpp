//! The ring's messages as a checked exchange (schedule/exchange.hpp): ring attention
//! (parallel/cp/ring_attention.hpp) takes every peer, tag and size it posts from this program, and
//! verifies the whole group's program before its first message, so what runs is what was proved.
//!
//! Rank r of c, forward (c steps; a pass around the ring before each step but the last):
//!
//!     [send>r+1 kv, recv<r-1 kv] compute0 ... [send>r+1 kv, recv<r-1 kv] compute(c-2) compute(c-1)
//!
//! backward (c steps; the block passes on before a step, its key/value gradients after it):
//!
//!     [send kv, recv kv] compute0 [send dkv, recv dkv] ... compute(c-1) [send dkv, recv dkv]
//!
//! Each pair is one group (send and recv posted together), so the program is safe under
//! rendezvous — one NCCL communicator, the group's, carries every message; with c = 2 both ends
//! of the ring are the same rank and the stream's order is what keeps the passes apart.
#pragma once

#include <cstdint>

#include "fourway/config.hpp"
#include "fourway/schedule/exchange.hpp"

namespace fourway::cp {

enum class RingDirection : std::uint8_t { forward, backward };

/// Tags of the ring's messages: key/value blocks forward, blocks and their gradients backward.
/// Within 0..32767, the tags every MPI guarantees (MPI_TAG_UB is at least that).
inline constexpr int ring_forward_tag = 30001;
inline constexpr int ring_backward_tag = 30002;
inline constexpr int ring_gradient_tag = 30003;

/// The program of every rank of a ring of `ranks`: blocks of `block` elements, gradients of
/// `gradient` elements (backward).
constexpr schedule::Exchange ring_exchange(int ranks, RingDirection dir, std::int64_t block,
                                           std::int64_t gradient) {
  using namespace schedule;
  const bool fwd = dir == RingDirection::forward;
  Exchange x{fwd ? "ring attention forward" : "ring attention backward", ranks, {}};
  x.moves.resize(static_cast<std::size_t>(ranks < 1 ? 0 : ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& row = x.moves[static_cast<std::size_t>(r)];
    const int next = (r + 1) % ranks;
    const int prev = (r + ranks - 1) % ranks;
    for (int step = 0; step < ranks; ++step) {
      const int tag = fwd ? ring_forward_tag : ring_backward_tag;
      if (step + 1 < ranks) {
        row.push_back(send_to(next, tag, block));
        row.push_back(recv_from(prev, tag, block));
      }
      row.push_back(compute_step(step));
      if (!fwd && ranks > 1) {
        row.push_back(send_to(next, ring_gradient_tag, gradient));
        row.push_back(recv_from(prev, ring_gradient_tag, gradient));
      }
    }
  }
  return x;
}

}  // namespace fourway::cp
