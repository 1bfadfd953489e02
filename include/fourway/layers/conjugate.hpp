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
//!
//! Every collective here is completed in stream order, never by a host wait inside the layer
//! (`all_reduce_in_layer` and the two below, through comm/work.hpp `complete_in_stream_order`):
//! on NCCL the `*_async` form and `Work::wait_device()`, so the compute stream waits for the
//! collective's event and the host keeps queueing kernels; on a host backend the blocking form,
//! which is that order on the host and the cheaper call there. A failure NCCL reports late (a
//! peer that never arrives) surfaces at the step's next host wait, whose deadline bounds it (the
//! step scalars' all-reduce; docs/parallel-tp.md). Counting<C> counts these as device orders.
#pragma once

#include <cstdint>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/layer.hpp"

namespace fourway::tp {

/// p[0, n) = op over the group of p, in place, in stream order (see the file comment).
template <class T, communicator Comm>
void all_reduce_in_layer(Comm& comm, T* p, std::int64_t n, ReduceOp op) {
  complete_in_stream_order(
      comm, [&](auto& c) { return c.all_reduce_async(p, p, n, op); },
      [&](auto& c) { c.all_reduce(p, p, n, op); });
}

/// g forward / f backward: t = Σ over the group of t, in place.
template <class T, class B, communicator Comm>
void all_reduce_sum(Comm& comm, Tensor<T, B>& t) {
  if (comm.size() > 1) all_reduce_in_layer(comm, t.data(), t.numel(), ReduceOp::sum);
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
    const T* send = chunk.data();
    T* recv = out.data();
    const std::int64_t n = chunk.numel();
    complete_in_stream_order(
        comm, [&](auto& c) { return c.all_gather_async(send, recv, n); },
        [&](auto& c) { c.all_gather(send, recv, n); });
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
    const T* send = full.data();
    T* recv = out.data();
    const std::int64_t count = out.numel();
    complete_in_stream_order(
        comm, [&](auto& c) { return c.reduce_scatter_async(send, recv, count, ReduceOp::sum); },
        [&](auto& c) { c.reduce_scatter(send, recv, count, ReduceOp::sum); });
  } else {
    Ops<B>::copy(ctx, out.data(), full.data(), full.numel());
  }
  return out;
}

}  // namespace fourway::tp
