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
  /// fp32 by default; --check (check_program.hpp, train_check.cpp); no --tf32, --attention fused
  /// or --profile-step; --backend mpi when built with MPI.
  static constexpr TargetTraits traits = host_traits;
  static void check_device() {}
  static fw::Context<fw::Host> context(fw::MemoryAccountant& m, int /*device*/,
                                       const Options& /*o*/) {
    return fw::Context<fw::Host>(m);
  }
  /// No peak FLOP/s is known for a CPU: the MFU needs --peak-tflops (of the whole machine, which
  /// all the ranks share: one device).
  static double peak_tflops(const Options& /*o*/) { return 0.0; }
  static int devices(const Options& /*o*/, int /*ranks*/) { return 1; }
  /// No GPU memory to report.
  static constexpr double (*device_memory_in_use)() = nullptr;
  /// The host has no default cap: only --memory-cap-gb sets one.
  static std::size_t default_memory_cap(int /*device*/) { return 0; }
  /// --backend mpi (validate.hpp refused every backend this build cannot run).
  template <class Fn>
  static void launch_processes(const fourway_train::Options& o, Fn fn) {
#if FOURWAY_HAS_MPI
    if (o.backend == "mpi") {
      fn.template operator()<fw::MpiWorld>();
      return;
    }
#else
    (void)fn;
#endif
    detail::check_backend(o, traits);
    throw fw::ConfigError("fourway: --backend " + o.backend + " does not start processes");
  }
};

}  // namespace fourway_train
