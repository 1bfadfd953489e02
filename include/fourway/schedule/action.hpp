//! The actions a pipeline schedule is made of: compute on one model chunk for one micro-batch,
//! and the point-to-point messages between the ranks that hold neighbouring chunks.
//!
//! A model is cut into `chunks` consecutive pieces (stages; with virtual stages several per rank).
//! For micro-batch `mb` and chunk `c`:
//!
//!     F(mb, c)   forward; needs the activation of F(mb, c-1)
//!     BW(mb, c)  full backward (input and weight gradients); needs the gradient of B(mb, c+1)
//!     B(mb, c)   input-gradient half of the backward (zero-bubble schedules split BW = B + W)
//!     W(mb, c)   weight-gradient half; needs B(mb, c), frees the micro-batch's activations
//!
//! A message is named by what produced it: `send_activation(mb, c)` carries F(mb, c)'s output to
//! the rank of chunk c+1, `send_gradient(mb, c)` carries B(mb, c)'s input gradient to the rank of
//! chunk c-1; the matching recv names the same (mb, c). The tag is a pure function of
//! (kind, mb, c), so two messages can never be swapped unnoticed.
#pragma once

#include <cstdint>
#include <string_view>

#include "fourway/config.hpp"

namespace fourway::schedule {

enum class Op : std::uint8_t {
  forward,          // F
  backward,         // BW = B + W fused
  backward_input,   // B
  backward_weight,  // W
  send_activation,
  recv_activation,
  send_gradient,
  recv_gradient,
};

constexpr bool is_compute(Op op) { return op <= Op::backward_weight; }
constexpr bool is_send(Op op) { return op == Op::send_activation || op == Op::send_gradient; }
constexpr bool is_recv(Op op) { return op == Op::recv_activation || op == Op::recv_gradient; }
constexpr bool is_p2p(Op op) { return !is_compute(op); }
/// The backward that produces the input gradient (what the previous chunk waits for).
constexpr bool produces_input_grad(Op op) { return op == Op::backward || op == Op::backward_input; }
/// The backward after which a micro-batch's activations on a chunk are freed.
constexpr bool frees_activations(Op op) { return op == Op::backward || op == Op::backward_weight; }

constexpr std::string_view op_name(Op op) {
  switch (op) {
    case Op::forward: return "F";
    case Op::backward: return "BW";
    case Op::backward_input: return "B";
    case Op::backward_weight: return "W";
    case Op::send_activation: return "send_F";
    case Op::recv_activation: return "recv_F";
    case Op::send_gradient: return "send_B";
    case Op::recv_gradient: return "recv_B";
  }
  return "?";
}

struct Action {
  Op op = Op::forward;
  int micro_batch = 0;
  int chunk = 0;  // compute: the chunk it runs; p2p: the chunk that produced the message
  int peer = -1;  // p2p: the rank at the other end
  std::int64_t elements = 0;  // p2p: the message's size (its shape, flattened)

  constexpr bool operator==(const Action&) const = default;
};

constexpr Action forward(int mb, int chunk) { return {Op::forward, mb, chunk}; }
constexpr Action backward(int mb, int chunk) { return {Op::backward, mb, chunk}; }
constexpr Action backward_input(int mb, int chunk) { return {Op::backward_input, mb, chunk}; }
constexpr Action backward_weight(int mb, int chunk) { return {Op::backward_weight, mb, chunk}; }

/// The send that a recv waits for (and back): same message, other direction.
constexpr Op matching_op(Op op) {
  switch (op) {
    case Op::send_activation: return Op::recv_activation;
    case Op::recv_activation: return Op::send_activation;
    case Op::send_gradient: return Op::recv_gradient;
    case Op::recv_gradient: return Op::send_gradient;
    default: return op;
  }
}

/// The tag a message travels under: unique per (kind, micro-batch, producing chunk).
constexpr int message_tag(const Action& a, int chunks) {
  const bool gradient = a.op == Op::send_gradient || a.op == Op::recv_gradient;
  return (a.micro_batch * chunks + a.chunk) * 2 + (gradient ? 1 : 0);
}

}  // namespace fourway::schedule
