//! The communicator concept, the types every backend shares, and `fw::launch<World>(n, fn)`.
//!
//! A communicator is one rank's handle on one group. Every collective is called by every rank of
//! the group, in the same order; the k-th collective call of each rank is matched with the k-th
//! of the others (its *sequence number*, 1-based, per group, shown in every error). Point-to-point
//! messages are matched by (peer, tag), FIFO within one (peer, tag) pair, so two transfers in
//! flight between the same pair with different tags can never be swapped.
//!
//! API, the same for `LocalComm`, `MpiComm`, `NcclComm` and `Counting<C>` (T is any
//! `comm_element`: float, fp16, bf16 -- 16-bit sums accumulate in fp32 --, double, int32, int64):
//!
//!   all_reduce(const T* send, T* recv, count, op)    recv[i] = op over ranks of send[i];
//!                                                    in place when send == recv
//!   reduce_scatter(const T* send, T* recv, count, op) send holds count*size elements; rank r
//!                                                    gets block r: recv[i] = op_q
//!                                                    send_q[r*count+i] (recv may alias send +
//!                                                    rank*count)
//!   all_gather(const T* send, T* recv, count)        recv[q*count + i] = send_q[i]
//!                                                    (send may alias recv + rank*count)
//!   broadcast(T* buf, count, root)                   buf = root's buf
//!   send(const T* buf, count, peer, tag) / recv(T* buf, count, peer, tag)
//!   barrier()
//!   split(color, key) -> a communicator of the same kind over the ranks with the same color,
//!                        ranked by (key, old rank); a collective over the parent group
//!   *_async(...) -> Work (wait() rethrows the failure, test() polls); the blocking form is
//!                   the async form followed by wait()
//!   rank(), size(), name() (the group name every error message carries)
//!
//! Counts are per rank and in elements (`std::int64_t`), so reduce_scatter and all_gather are
//! always even. A total that does not divide by the group size is either padded by the caller
//! (`padded_count`) or moved with `all_gather_v` / `reduce_scatter_v` below; `shard_count`
//! rejects it with a ShapeError that names the numbers and both fixes.
//!
//! Every blocking wait has a deadline (`CommOptions::deadline`): a rank that never arrives turns
//! into `CommTimeout` naming group, op, sequence number and the missing rank(s). With
//! `CommOptions::debug` every collective first checks that all ranks agree on op, dtype, count,
//! reduce op and root, and throws `CommMismatch` on every rank naming the ranks and fields that
//! differ (LocalWorld checks this always: there it costs nothing).
//!
//! A communicator object is used by one thread at a time (its rank's). It is movable, not
//!
//! This header gathers the parts, one job each: comm/types.hpp (ReduceOp, CommOp, comm_element,
//! CommOptions, CallOptions), comm/work.hpp (Work and the blocking forms), comm/call_desc.hpp
//! (call descriptions and the mismatch report), comm/concept.hpp (the concepts),
//! comm/uneven.hpp (uneven counts) and comm/launch.hpp (World and launch).
#pragma once

#include "fourway/comm/call_desc.hpp"
#include "fourway/comm/concept.hpp"
#include "fourway/comm/launch.hpp"
#include "fourway/comm/types.hpp"
#include "fourway/comm/uneven.hpp"
#include "fourway/comm/work.hpp"
