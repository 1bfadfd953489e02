//! NCCL without MPI: the processes are started the way clusters start them -- torchrun-style
//! variables or srun (comm/launch_env.hpp) -- and NCCL's unique id goes from rank 0 to the
//! others over the TCP rendezvous (comm/tcp_rendezvous.hpp). `nccl_from_env` makes the
//! communicator; `NcclEnvWorld` is the world kind for `fw::launch<fw::NcclEnvWorld>(n, fn)`.
//!
//! The bootstrap is the MPI one (comm/nccl_mpi.cuh) with another carrier: the GPU is the local
//! rank mod the visible GPUs, rank 0 makes the id, every rank builds `NcclComm(id, rank, size,
//! device)`; `detail::nccl_bootstrap` is that shared part, the carrier a callable. The
//! rendezvous waits for every rank within `CommOptions::deadline`, so a rank that never starts
//! is a CommTimeout naming it, on rank 0, before NCCL is asked to wait for it.
// fourway-requires: nccl
#pragma once

#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "fourway/comm/launch.hpp"
#include "fourway/comm/launch_env.hpp"
#include "fourway/comm/nccl_comm.cuh"
#include "fourway/comm/tcp_rendezvous.hpp"

namespace fourway {

namespace detail {

/// The GPU of a process that is `local_rank` on its node (`how` names where that came from):
/// local_rank mod the visible GPUs, made current.
inline int nccl_process_device(int rank, int local_rank, std::string_view how) {
  const int devices = cuda::device_count();
  check<DeviceError>(devices > 0, "fourway: rank ", rank, " (", how, " ", local_rank,
                     ") sees no CUDA device; NcclComm needs one GPU per process (check the "
                     "driver and CUDA_VISIBLE_DEVICES)");
  const int device = local_rank % devices;
  cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
  return device;
}

/// Rank `rank` of `size` on `device`: rank 0 makes NCCL's unique id, `share(id)` leaves rank
/// 0's id on every rank (an MPI broadcast, the TCP rendezvous), then NCCL connects them.
template <class Share>
NcclComm nccl_bootstrap(int rank, int size, int device, Share&& share, CommOptions options,
                        std::string name, NcclOptions nccl) {
  ncclUniqueId id{};
  if (rank == 0) id = nccl_unique_id();
  std::forward<Share>(share)(id);
  return NcclComm(id, rank, size, device, options, std::move(name), nccl);
}

}  // namespace detail

/// An NcclComm over the processes `env` describes (torchrun-style or srun): GPU = local rank mod
/// the visible GPUs, the id carried by the TCP rendezvous at MASTER_ADDR:MASTER_PORT within
/// `options.deadline`.
inline NcclComm nccl_from_env(const LaunchEnv& env, CommOptions options = {},
                              NcclOptions nccl = {}) {
  const RendezvousConfig where = rendezvous_config(env, options.deadline);
  const int device = detail::nccl_process_device(
      env.rank, env.local_rank, env.launcher == Launcher::slurm ? "SLURM_LOCALID" : "LOCAL_RANK");
  return detail::nccl_bootstrap(
      env.rank, env.size, device,
      [&](ncclUniqueId& id) { tcp_rendezvous(where, std::as_writable_bytes(std::span(&id, 1))); },
      options, "world", nccl);
}

namespace detail {

/// Runs `fn(world)`; if it throws, prints the error with the rank and ends the process at once
/// (exit status 1, no unwinding into NCCL's teardown while peers wait), as MPI_Abort ends an
/// mpirun job: torchrun then stops the other ranks, srun does with --kill-on-bad-exit=1.
template <class W, class Fn>
void run_or_exit(World<W>& world, Fn& fn) {
  const char* failure = nullptr;
  std::string text;
  try {
    fn(world);
    return;
  } catch (const std::exception& e) {
    text = e.what();
    failure = text.c_str();
  } catch (...) {
    failure = "an exception not derived from std::exception";
  }
  std::fprintf(stderr,
               "fourway: rank %d of %d failed: %s; ending this process (exit 1): torchrun stops "
               "the other ranks, srun does with --kill-on-bad-exit=1\n",
               world.rank(), world.size(), failure);
  std::fflush(nullptr);
  std::_Exit(1);
}

/// `launch<W>(n, fn)` for a world whose processes `env` describes (torchrun-style or srun).
template <class W, class Fn>
void launch_from_env(const LaunchEnv& env, int n, Fn& fn, CommOptions options) {
  check<ConfigError>(n == 0 || n == env.size, "fourway: launch(", n, ") over NCCL, but ",
                     launcher_name(env.launcher), " started ", env.size, " processes; start ", n,
                     " or pass 0 to use them all");
  World<W> w(nccl_from_env(env, options));
  run_or_exit(w, fn);
}

}  // namespace detail

/// The world kind "one process per GPU, NCCL, no MPI": torchrun-style variables or srun start
/// the processes, the TCP rendezvous carries the id.
struct NcclEnvWorld {
  using comm_type = NcclComm;
  template <class Fn>
  static void launch(int n, Fn&& fn, CommOptions options = {}) {
    const LaunchEnv env = read_launch_env(process_env());
    check<ConfigError>(env.launcher != Launcher::mpirun,
                       "fourway: started by mpirun (OMPI_COMM_WORLD_RANK), but this program "
                       "was built without MPI, so NCCL cannot be bootstrapped over it; start it "
                       "with torchrun-style variables or srun, or rebuild with MPI");
    check<ConfigError>(env.launcher != Launcher::none,
                       "fourway: NCCL without MPI needs the launcher's variables, and none is "
                       "set: start the processes with torchrun (`torchrun --nproc_per_node N "
                       "--no_python PROGRAM ...`), with RANK, WORLD_SIZE, LOCAL_RANK, "
                       "MASTER_ADDR and MASTER_PORT set by hand, or with srun "
                       "(docs/guide.md, 'Launching')");
    detail::launch_from_env<NcclEnvWorld>(env, n, fn, options);
  }
};

}  // namespace fourway
