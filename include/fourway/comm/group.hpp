//! Groups of point-to-point operations where a communicator has them: `group_start(c)` ...
//! `group_end(c)` post the sends and recvs between them together (ncclGroupStart/End on NCCL;
//! the same rule on LocalWorld, MPI and the strict world, docs/comm.md), so sends and recvs that
//! must pass each other — a pipeline slot's, a ring's — cannot wait on one another. A
//! communicator without groups (a user's) gets nothing: its async operations are posted as
//! called.
#pragma once

namespace fourway {

template <class C>
void group_start(C& c) {
  if constexpr (requires { c.group_start(); }) c.group_start();
}

template <class C>
void group_end(C& c) {
  if constexpr (requires { c.group_end(); }) c.group_end();
}

}  // namespace fourway
