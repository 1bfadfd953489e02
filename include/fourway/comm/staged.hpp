//! Host values through a communicator: a few numbers (a count, a word per rank, the names and
//! sizes of tensors) that must reach the other ranks, staged in a buffer of the backend's memory
//! that the rank's accountant counts (`comm_buffers`), never passed as host pointers. NCCL reads
//! and writes device memory only (comm/buffer_kind.hpp), and the strict world holds every
//! backend to that (docs/comm.md): a stack scalar, a `std::vector` or any host array handed to a
//! communicator is refused there, so library code moves host values with these.
//!
//! Each is one collective over `comm` (every rank calls it with the same counts), bracketed by a
//! copy in and a copy out: on a GPU the copy out is a synchronising read-back.
#pragma once

#include <cstdint>

#include "fourway/backend/ops.hpp"
#include "fourway/comm/types.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/shape.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

/// `host[0, count)` of rank `root` on every rank of `comm`.
template <comm_element T, class B, class Comm>
void staged_broadcast(const Context<B>& ctx, Comm& comm, T* host, std::int64_t count, int root) {
  if (count == 0 || comm.size() == 1) return;
  Tensor<T, B> buf(Shape{count}, MemTag::comm_buffers, ctx.memory());
  if (comm.rank() == root) Ops<B>::from_host(ctx, buf.data(), host, count);
  comm.broadcast(buf.data(), count, root);
  if (comm.rank() != root) Ops<B>::to_host(ctx, host, buf.data(), count);
}

/// `all[q·count + i] = mine_q[i]` for every rank q of `comm` (`all` holds count·size values).
template <comm_element T, class B, class Comm>
void staged_all_gather(const Context<B>& ctx, Comm& comm, const T* mine, T* all,
                       std::int64_t count) {
  if (count == 0) return;
  const int n = comm.size();
  // (n + 1)·count: this rank's values, then the gathered ones
  Tensor<T, B> buf(Shape{(n + 1) * count}, MemTag::comm_buffers, ctx.memory());
  Ops<B>::from_host(ctx, buf.data(), mine, count);
  comm.all_gather(buf.data(), buf.data() + count, count);
  Ops<B>::to_host(ctx, all, buf.data() + count, n * count);
}

/// `host[i] = op over the ranks of comm of host_q[i]`, in place.
template <comm_element T, class B, class Comm>
void staged_all_reduce(const Context<B>& ctx, Comm& comm, T* host, std::int64_t count,
                       ReduceOp op) {
  if (count == 0) return;
  Tensor<T, B> buf(Shape{count}, MemTag::comm_buffers, ctx.memory());
  Ops<B>::from_host(ctx, buf.data(), host, count);
  comm.all_reduce(buf.data(), buf.data(), count, op);
  Ops<B>::to_host(ctx, host, buf.data(), count);
}

}  // namespace fourway
