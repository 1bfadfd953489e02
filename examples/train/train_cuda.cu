// fourway-train-cuda: fourway-train with the tensors on GPUs. Same program (train_program.hpp),
// same flags:
//   fourway-train-cuda --ranks 4 --zero 3          LocalWorld: 4 ranks as threads on GPU 0
//   mpirun -np 8 fourway-train-cuda --backend nccl --zero 3
//   torchrun --nproc_per_node 8 --no_python fourway-train-cuda --backend nccl --zero 3
//   srun -N 2 --ntasks-per-node 8 fourway-train-cuda --backend nccl --zero 3
//                                                  one process per GPU (GPU = local rank); NCCL's
//                                                  id over MPI under mpirun, else over the TCP
//                                                  rendezvous at MASTER_ADDR:MASTER_PORT
// Each rank's memory cap is --memory-cap-gb, or by default the device's free memory at start.
// The working precision defaults to bf16 here (fp32 masters); --precision fp32 is true fp32, and
// --tf32 lets its GEMMs use TF32 tensor cores. --attention fused runs the attention on the fused
// tensor-core flash kernels (bf16/fp16; where they do not take the shape, the blockwise path);
// --attention cudnn on cuDNN's attention graph, in a build with the cuDNN component.
// --backend mpi is refused: MpiComm moves host memory; NCCL is the GPU transport.
#include <cuda_profiler_api.h>

#include <string>

#include "fourway/backend/cuda/backend.cuh"
#if FOURWAY_HAS_CUDNN
#include "fourway/backend/cudnn/sdpa.cuh"  // --attention cudnn: what the program says it runs
#endif
#include "fourway/plan/hardware.hpp"
#include "train_program.hpp"
#if FOURWAY_HAS_NCCL && FOURWAY_HAS_MPI
#include "fourway/comm/nccl_mpi.cuh"  // NcclWorld: mpirun, torchrun-style variables, srun
#elif FOURWAY_HAS_NCCL
#include "fourway/comm/nccl_env.cuh"  // NcclEnvWorld: torchrun-style variables, srun
#endif

namespace {

struct CudaTarget {
  using backend = fw::Cuda;
  /// bf16 working weights (fp32 masters) unless --precision says otherwise: tensor-core GEMMs at
  /// half the bytes; fp32 stays available, with TF32 only under --tf32; --attention fused;
  /// --profile-step; --backend nccl when built with NCCL; no --check.
  static constexpr fourway_train::TargetTraits traits = fourway_train::cuda_traits;
  /// --profile-step: the CUDA profiler's recording on (true) or off around one step.
  static void profile(bool on) {
    fw::cuda::check_cuda(on ? cudaProfilerStart() : cudaProfilerStop(),
                         on ? "cudaProfilerStart (--profile-step)" : "cudaProfilerStop");
  }
  static void check_device() {
    fw::check<fw::DeviceError>(fw::cuda::device_count() > 0,
                               "fourway: no CUDA device is visible (none found by "
                               "cudaGetDeviceCount; check the driver and CUDA_VISIBLE_DEVICES); "
                               "run fourway-train-cuda on a GPU machine, or fourway-train on the "
                               "host");
  }
  static fw::Context<fw::Cuda> context(fw::MemoryAccountant& m, int device,
                                       const fourway_train::Options& o) {
    return fw::Context<fw::Cuda>(m, device, o.tf32, o.attention == "fused", o.attention == "cudnn");
  }
  /// --attention fused / cudnn: the kernels the layers run for this model on this GPU — the fused
  /// ones (or cuDNN's graph), or the blockwise path and the reason to refuse (head size, GPU).
  /// Asked of one sequence; the grid limit (B·NH <= 65535) is the only refusal a batch adds.
  static std::string attention_note(const fw::Context<fw::Cuda>& ctx,
                                    const fourway_train::Options& o,
                                    const fw::models::GptConfig& cfg) {
#if FOURWAY_HAS_CUDNN
    if (o.attention == "cudnn") {  // the first call of the shape builds (and keeps) its graphs
      const bool takes =
          o.precision == "fp16"
              ? fw::cuda::cudnn_attention_supports<fw::fp16>(ctx, 1, o.seq, cfg.dim, cfg.heads)
              : fw::cuda::cudnn_attention_supports<fw::bf16>(ctx, 1, o.seq, cfg.dim, cfg.heads);
      return takes ? "cudnn (cuDNN's attention graph)"
                   : "blockwise: cuDNN declines this model here (head size, sequence length or "
                     "workspace)";
    }
#endif
    const auto why =
        o.precision == "fp16"
            ? fw::cuda::detail::fused_refusal<fw::fp16>(&ctx, 1, o.seq, cfg.dim, cfg.heads)
            : fw::cuda::detail::fused_refusal<fw::bf16>(&ctx, 1, o.seq, cfg.dim, cfg.heads);
    return why.empty() ? "fused (the tensor-core flash kernels)"
                       : "blockwise: the fused kernels refuse this model here (" + why.text() + ")";
  }
  /// The datasheet peak of this rank's GPU in the run's precision (dense bf16/fp16 tensor cores;
  /// fp32 without TF32, also under --tf32), for the GPUs plan/hardware.hpp knows (A100 80 GB,
  /// H100, H200, matched by name); 0 for another, whose MFU needs --peak-tflops.
  static double peak_tflops(const fourway_train::Options& o) {
    int device = 0;
    fw::cuda::check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    cudaDeviceProp prop{};
    fw::cuda::check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    const std::string name = prop.name;
    const char* preset = name.find("H200") != std::string::npos   ? "h200"
                         : name.find("H100") != std::string::npos ? "h100"
                         : name.find("A100") != std::string::npos ? "a100"
                                                                  : "";
    const auto hw = fw::plan::hardware_preset(preset);
    if (!hw) return 0.0;
    return hw->peak_tflops(o.precision == "fp32" ? fw::plan::Precision::fp32
                                                 : fw::plan::Precision::bf16);
  }
  /// The GPUs a run computes on: one per rank over NCCL, one for every LocalWorld rank.
  static int devices(const fourway_train::Options& o, int ranks) {
    return o.backend == "nccl" ? ranks : 1;
  }
  /// Bytes in use on the current GPU (cudaMemGetInfo: total - free, the whole device's).
  static double device_memory_in_use() {
    std::size_t free = 0, total = 0;
    fw::cuda::check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return static_cast<double>(total - free);
  }
  /// Without --memory-cap-gb a rank may use what its GPU has free when it starts.
  static std::size_t default_memory_cap(int device) { return fw::cuda::free_memory(device); }
  /// --backend nccl (validate.hpp refused every backend this build cannot run).
  template <class Fn>
  static void launch_processes(const fourway_train::Options& o, Fn fn) {
    if (o.backend == "nccl") {
#if FOURWAY_HAS_NCCL && FOURWAY_HAS_MPI
      fn.template operator()<fw::NcclWorld>();
      return;
#elif FOURWAY_HAS_NCCL
      fn.template operator()<fw::NcclEnvWorld>();
      return;
#endif
    }
    (void)fn;
    fourway_train::detail::check_backend(o, traits);
    throw fw::ConfigError("fourway: --backend " + o.backend + " does not start processes");
  }
};

}  // namespace

int main(int argc, char** argv) { return fourway_train::run_program<CudaTarget>(argc, argv); }
