//! The conjugate operators of tensor parallelism (Megatron-LM, Shoeybi et al. 2019, §3) and their
//! sequence-parallel forms (Korthikanti et al. 2022, §4.2.2), over the tensor-parallel group:
//! ```
//!   at a column split's input   f:  forward identity          backward all-reduce
//!   at a row split's output     g:  forward all-reduce        backward identity
//!   sequence parallel           ḡ:  forward all-gather        backward reduce-scatter
//!   (rows = B·T split in N      ḡ': forward reduce-scatter    backward all-gather
//!    contiguous chunks)
//! ```
//! Each function is one direction of one operator; the block calls the conjugate one in
//! backward. A group of one rank moves nothing.
#pragma once

#include <cstdint>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/layer.hpp"

namespace fourway::tp {

/// g forward / f backward: t = Σ over the group of t, in place.
template <class T, class B, communicator Comm>
void all_reduce_sum(Comm& comm, Tensor<T, B>& t) {
  if (comm.size() > 1) comm.all_reduce(t.data(), t.data(), t.numel(), ReduceOp::sum);
}

/// ḡ forward / ḡ' backward: the chunks (rows/N, C) of the group side by side, (rows, C).
template <class T, class B, communicator Comm>
Tensor<T, B> gather_rows(const Context<B>& ctx, Comm& comm, const Tensor<T, B>& chunk, Shape full,
                         MemTag tag) {
  check<ShapeError>(full.numel() == chunk.numel() * comm.size(), "fourway: sequence-parallel ",
                    "gather of ", chunk.shape().str(), " over ", comm.size(), " ranks cannot make ",
                    full.str());
  Tensor<T, B> out(full, tag, ctx.memory());
  if (comm.size() > 1) {
    comm.all_gather(chunk.data(), out.data(), chunk.numel());
  } else {
    Ops<B>::copy(ctx, out.data(), chunk.data(), chunk.numel());
  }
  return out;
}

/// ḡ' forward / ḡ backward: this rank's chunk (rows/N, C) of the group's sum of `full`.
template <class T, class B, communicator Comm>
Tensor<T, B> reduce_scatter_rows(const Context<B>& ctx, Comm& comm, const Tensor<T, B>& full,
                                 MemTag tag) {
  const std::int64_t n = comm.size();
  const std::int64_t C = full.shape()[full.shape().rank() - 1];
  const std::int64_t rows = full.numel() / C;
  check<ShapeError>(rows % n == 0, "fourway: sequence parallelism splits the B·T=", rows,
                    " rows over tp=", n, " ranks; use a batch x sequence divisible by ", n);
  Tensor<T, B> out(Shape{rows / n, C}, tag, ctx.memory());
  if (n > 1) {
    comm.reduce_scatter(full.data(), out.data(), out.numel(), ReduceOp::sum);
  } else {
    Ops<B>::copy(ctx, out.data(), full.data(), full.numel());
  }
  return out;
}

}  // namespace fourway::tp
