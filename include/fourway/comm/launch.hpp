//! Starting ranks: `fw::launch<World>(n, fn)` runs `fn` on `n` ranks of a world kind
//! (LocalWorld, MpiWorld) and hands each a `World<W>`: its communicator, its memory accountant
//! and a host context.
#pragma once

#include <utility>

#include "fourway/backend/host/backend.hpp"
#include "fourway/comm/types.hpp"
#include "fourway/core/memory.hpp"

namespace fourway {

/// What `launch` hands each rank: the world communicator, the rank's own memory accountant and
/// a host context on it. `W` is the world kind (LocalWorld, MpiWorld); `W::comm_type` its
/// communicator. A device context is made by the caller: `fw::Context<fw::Cuda> d(w.memory(),
/// dev)`.
template <class W>
class World {
 public:
  using world_type = W;
  using comm_type = typename W::comm_type;

  explicit World(comm_type comm)
      : rank_(comm.rank()),
        size_(comm.size()),
        memory_(rank_),
        ctx_(memory_),
        comm_(std::move(comm)) {
    // a communicator that checks buffers against the rank's accountant (the strict world)
    if constexpr (requires { comm_.bind_memory(memory_); }) comm_.bind_memory(memory_);
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  [[nodiscard]] comm_type& comm() { return comm_; }
  [[nodiscard]] MemoryAccountant& memory() { return memory_; }
  [[nodiscard]] Context<Host>& ctx() { return ctx_; }
  /// This rank and the world size (kept even if the caller moves the communicator out).
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }

 private:
  int rank_;
  int size_;
  MemoryAccountant memory_;
  Context<Host> ctx_;
  // last, so destroyed first: an operation still queued on the communicator (a rank that threw
  // with async work in flight) finishes or fails before the memory it reads or writes is freed
  comm_type comm_;
};

/// Runs `fn(World<W>&)` on `n` ranks of the world kind `W` and returns when all finished. If a
/// rank throws, the others fail fast (their pending waits throw CommError) and `launch` rethrows
/// the first failure. For LocalWorld, `n` ranks are threads; for MpiWorld, `n` must equal the
/// number of processes mpirun started (or 0 for "all").
template <class W, class Fn>
void launch(int n, Fn&& fn, CommOptions options = {}) {
  W::launch(n, std::forward<Fn>(fn), options);
}

}  // namespace fourway
