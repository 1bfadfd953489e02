// The host target of fourway-train (train.cpp) and of its --check unit (train_check.cpp).
#pragma once

#include <cstddef>

#include "fourway/backend/host/backend.hpp"
#include "train_program.hpp"
#if FOURWAY_HAS_MPI
#include "fourway/comm/mpi_comm.hpp"
#endif

namespace fourway_train {

/// The host build of the program: host tensors, LocalWorld or MPI ranks.
struct HostTarget {
  using backend = fw::Host;
  static constexpr const char* program = "fourway-train";
  static constexpr bool has_check = true;  // --check (check_program.hpp, train_check.cpp)
  static constexpr const char* default_precision = "fp32";
  static constexpr bool has_tf32 = false;
  static constexpr bool has_fused_attention = false;
  static constexpr bool has_profiler_window = false;  // --profile-step is refused
  static void check_device() {}
  static fw::Context<fw::Host> context(fw::MemoryAccountant& m, int /*device*/,
                                       const Options& /*o*/) {
    return fw::Context<fw::Host>(m);
  }
  /// The host has no default cap: only --memory-cap-gb sets one.
  static std::size_t default_memory_cap(int /*device*/) { return 0; }
  template <class Fn>
  static void launch_processes(const fourway_train::Options& o, Fn fn) {
    if (o.backend == "mpi") {
#if FOURWAY_HAS_MPI
      fn.template operator()<fw::MpiWorld>();
      return;
#else
      throw fw::ConfigError(
          "fourway: --backend mpi, but fourway-train was built without MPI; "
          "install Open MPI and reconfigure");
#endif
    }
    throw fw::ConfigError(
        "fourway: --backend nccl needs the CUDA build, fourway-train-cuda (GPU tensors, one "
        "process per GPU under mpirun, torchrun or srun); this host build runs --backend local, "
        "strict or mpi");
  }
};

}  // namespace fourway_train
