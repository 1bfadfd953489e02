//! NCCL bootstrapped over MPI: one process per GPU under mpirun or srun, the GPU chosen from the
//! node-local rank, the NCCL unique id broadcast from rank 0 over MPI. And NcclWorld, the world
//! kind for `fw::launch<fw::NcclWorld>(n, fn)`.
// fourway-requires: nccl mpi
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "fourway/comm/mpi_comm.hpp"
#include "fourway/comm/nccl_comm.cuh"

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
  const int devices = cuda::device_count();
  check<DeviceError>(devices > 0, "fourway: rank ", mpi.rank(), " of group '", mpi.name(),
                     "' sees no CUDA device; NcclComm needs one GPU per process");
  const int device = node_local_rank(mpi) % devices;
  cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
  static_assert(sizeof(ncclUniqueId) % sizeof(std::int32_t) == 0);
  ncclUniqueId id{};
  if (mpi.rank() == 0) id = nccl_unique_id();
  std::int32_t words[sizeof(ncclUniqueId) / sizeof(std::int32_t)];
  std::memcpy(words, &id, sizeof(id));
  mpi.broadcast(words, static_cast<std::int64_t>(sizeof(words) / sizeof(words[0])), 0);
  std::memcpy(&id, words, sizeof(id));
  return NcclComm(id, mpi.rank(), mpi.size(), device, options, std::string(mpi.name()), nccl);
}

/// The world kind "one process per GPU, NCCL": MPI starts the processes and carries the id.
struct NcclWorld {
  using comm_type = NcclComm;
  template <class Fn>
  static void launch(int n, Fn&& fn, CommOptions options = {}) {
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
