// fourway-train with every rank alone: the negative control of mpi_train_matches_local.cmake.
// The fault (`skip_collectives`: each rank in a data-parallel group of its own, training on its
// share of every batch, no collective with its peers) is compiled into this test program only,
// never into fourway-train. It runs what the control needs: the data-parallel path of
// `mpirun ... --backend mpi` in fp32, with the program's flags, checks and outputs.
#include "host_target.hpp"

namespace {

struct SkipCollectivesTarget : fourway_train::HostTarget {
  static constexpr bool skip_collectives = true;
};

}  // namespace

int main(int argc, char** argv) {
  using fourway_train::Options;
  using fourway_train::Path;
  return fourway_train::run_with<SkipCollectivesTarget>(argc, argv, [](const Options& o) {
    fw::check<fw::ConfigError>(
        fourway_train::run_path(o) == Path::data_parallel && o.backend == "mpi" &&
            o.precision == "fp32",
        "fourway: train_skip_collectives runs the data-parallel path of --backend mpi in fp32 "
        "only (the negative control of parallel.mpi_train_matches_local_*)");
    SkipCollectivesTarget::launch_processes(
        o, [&]<class W>() { fourway_train::train_stage<SkipCollectivesTarget, float, W>(o); });
    return 0;
  });
}
