//! NCCL bootstrapped over MPI: one process per GPU under mpirun, the GPU chosen from the
//! node-local rank, the NCCL unique id broadcast from rank 0 over MPI. And NcclWorld, the world
//! kind for `fw::launch<fw::NcclWorld>(n, fn)`, which picks the bootstrap from the environment:
//! torchrun-style variables or srun's go the MPI-free way of comm/nccl_env.cuh (MPI is never
//! initialised then), anything else -- mpirun, or a lone process (MPI's singleton) -- over MPI.
//! Both bootstraps share `detail::nccl_bootstrap`; only the carrier of the id differs.
// fourway-requires: nccl mpi
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "fourway/comm/launch_env.hpp"
#include "fourway/comm/mpi_comm.hpp"
#include "fourway/comm/nccl_comm.cuh"
#include "fourway/comm/nccl_env.cuh"

namespace fourway {

/// This process's rank among the processes of `mpi` on the same node (MPI_COMM_TYPE_SHARED).
inline int node_local_rank(MpiComm& mpi) {
  MPI_Comm local = MPI_COMM_NULL;
  detail::mpi_check(
      MPI_Comm_split_type(mpi.native(), MPI_COMM_TYPE_SHARED, mpi.rank(), MPI_INFO_NULL, &local),
      "MPI_Comm_split_type");
  int r = 0;
  MPI_Comm_rank(local, &r);
  MPI_Comm_free(&local);
  return r;
}

/// An NcclComm over the same ranks as `mpi`: GPU = node-local rank mod the visible GPUs.
inline NcclComm nccl_from_mpi(MpiComm& mpi, CommOptions options = {}, NcclOptions nccl = {}) {
  const int device =
      detail::nccl_process_device(mpi.rank(), node_local_rank(mpi), "node-local rank");
  static_assert(sizeof(ncclUniqueId) % sizeof(std::int32_t) == 0,
                "fourway: ncclUniqueId travels over MPI as 32-bit words");
  const auto broadcast = [&](ncclUniqueId& id) {
    std::int32_t words[sizeof(ncclUniqueId) / sizeof(std::int32_t)];
    std::memcpy(words, &id, sizeof(id));
    mpi.broadcast(words, static_cast<std::int64_t>(sizeof(words) / sizeof(words[0])), 0);
    std::memcpy(&id, words, sizeof(id));
  };
  return detail::nccl_bootstrap(mpi.rank(), mpi.size(), device, broadcast, options,
                                std::string(mpi.name()), nccl);
}

/// The world kind "one process per GPU, NCCL": mpirun starts the processes and MPI carries the
/// id; under torchrun-style variables or srun, the TCP rendezvous does (NcclEnvWorld's way).
struct NcclWorld {
  using comm_type = NcclComm;
  template <class Fn>
  static void launch(int n, Fn&& fn, CommOptions options = {}) {
    const LaunchEnv env = read_launch_env(process_env());
    if (env.launcher == Launcher::torchrun || env.launcher == Launcher::slurm) {
      detail::launch_from_env<NcclWorld>(env, n, fn, options);
      return;
    }
    detail::mpi_init_once();
    MpiComm mpi(MPI_COMM_WORLD, options, "world");
    check<ConfigError>(n == 0 || n == mpi.size(), "fourway: launch<NcclWorld>(", n,
                       ") but mpirun started ", mpi.size(), " processes; run `mpirun -np ", n,
                       "` or pass 0 to use them all");
    World<NcclWorld> w(nccl_from_mpi(mpi, options));
    detail::run_or_abort(w, fn);
  }
};

}  // namespace fourway
