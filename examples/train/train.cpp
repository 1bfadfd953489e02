// fourway-train: trains GPT-2 on Hugging Face safetensors weights and llm.c token files.
//
//   fourway-train                                   random 4x256 GPT on the built-in corpus
//   fourway-train --init-from gpt2.safetensors --data tiny_shakespeare_train.bin --seq 256
//
// Every error (flags, sizes, files) ends in one line on stderr and exit status 1 (2 for a flag
// that does not parse), never in a crash. The program is train_program.hpp; this file is its
// host target (fourway-train-cuda, train_cuda.cu, is the CUDA one).
#include "fourway/backend/host/backend.hpp"
#include "train_program.hpp"
#if FOURWAY_HAS_MPI
#include "fourway/comm/mpi_comm.hpp"
#endif

namespace {

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
        "process per GPU under mpirun); this host build runs --backend local or mpi");
  }
};

}  // namespace

int main(int argc, char** argv) { return fourway_train::run_program<HostTarget>(argc, argv); }
