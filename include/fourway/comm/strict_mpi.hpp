//! `StrictMpiWorld`: one process per rank under mpirun, every communicator held to NCCL's
//! contract by `Strict<MpiComm>` (comm/strict.hpp): the strict world for tests and programs
//! that run over MPI. The inner MpiComm checks every collective's agreement across ranks
//! (`CommOptions::debug`), so a collective called differently on two ranks is a CommMismatch.
// fourway-requires: mpi
#pragma once

#include <utility>

#include "fourway/comm/launch.hpp"
#include "fourway/comm/mpi_comm.hpp"
#include "fourway/comm/strict.hpp"

namespace fourway {

struct StrictMpiWorld {
  using comm_type = Strict<MpiComm>;
  /// As MpiWorld::launch; `options.strict` is implied.
  template <class Fn>
  static void launch(int n, Fn&& fn, CommOptions options = {}) {
    detail::mpi_init_once();
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check<ConfigError>(n == 0 || n == size, "fourway: launch<StrictMpiWorld>(", n,
                       ") but mpirun started ", size, " processes; run `mpirun -np ", n,
                       "` or pass 0 to use them all");
    CommOptions inner = options;
    inner.strict = false;  // the decorator holds the contract
    inner.debug = true;    // every collective's agreement checked across ranks
    World<StrictMpiWorld> w(Strict<MpiComm>(MpiComm(MPI_COMM_WORLD, inner, "world")));
    detail::run_or_abort(w, fn);
  }
};

}  // namespace fourway
