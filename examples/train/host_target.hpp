// fourway-train's host target: what train_program.hpp needs to know about the host backend,
// and the three precisions' instantiations, each compiled in its own translation unit
// (train_precision.cpp, once per precision; see train_in in train_program.hpp).
#pragma once

#include "fourway/backend/host/backend.hpp"
#include "train_program.hpp"
#if FOURWAY_HAS_MPI
#include "fourway/comm/mpi_comm.hpp"
#endif

namespace fourway_train {

struct HostTarget {
  using backend = fw::Host;
  static constexpr const char* program = "fourway-train";
  static void check_device() {}
  static fw::Context<fw::Host> context(fw::MemoryAccountant& m, int /*device*/) {
    return fw::Context<fw::Host>(m);
  }
  /// The host has no default cap: only --memory-cap-gb sets one.
  static std::size_t default_memory_cap(int /*device*/) { return 0; }
  template <class Fn>
  static void launch_processes(const Options& o, Fn fn) {
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
        "process per GPU under mpirun); this host build runs --backend local or mpi");
  }
};

extern template int train_in<HostTarget, float>(const Options&);
extern template int train_in<HostTarget, fw::bf16>(const Options&);
extern template int train_in<HostTarget, fw::fp16>(const Options&);

}  // namespace fourway_train
