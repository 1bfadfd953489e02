// fourway-train-cuda (examples/train/train_cuda.cu) on a machine without a GPU: it parses the
// same flags as fourway-train and exits with one clear DeviceError line instead of crashing.
// On a GPU machine the no-GPU case is skipped; train_fourway_train_cuda_vs_host (label gpu,
// examples/train/cuda_vs_host.sh) compares its losses with the host program's there.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/program.hpp"

namespace {

const std::string exe = FOURWAY_TRAIN_CUDA_EXE;

using fourway::test::ProgramRun;

ProgramRun run(const std::string& args) {
  return fourway::test::run_program(exe, args, "fourway_train_cuda_test");
}

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

const char* const kNoGpu =
    "fourway-train-cuda: fourway: no CUDA device is visible (none found by cudaGetDeviceCount; "
    "check the driver and CUDA_VISIBLE_DEVICES); run fourway-train-cuda on a GPU machine, or "
    "fourway-train on the host\n";

TEST(FourwayTrainCuda, HelpNeedsNoGpuAndListsTheHostFlags) {
  const auto r = run("--help");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* flag :
       {"--ranks", "--backend", "--zero", "--bucket-mb", "--precision", "--log-json", "--init-from",
        "--checkpoint-activations", "--attention", "--profile-step"}) {
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from\n" << r.out;
  }
  EXPECT_NE(r.out.find("fourway-train-cuda"), std::string::npos) << r.out;
}

// The GPU program works in bf16 unless told otherwise (the help shows each flag's default), and
// offers --tf32 for fp32 runs; --tf32 with a 16-bit precision is refused before the device.
TEST(FourwayTrainCuda, DefaultsToBf16AndOffersTf32) {
  const auto r = run("--help");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto at = r.out.find("--precision");
  ASSERT_NE(at, std::string::npos) << r.out;
  const auto line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(line.find("[bf16]"), std::string::npos) << line;
  EXPECT_NE(r.out.find("--tf32"), std::string::npos) << r.out;
  const auto bad = run("--tf32 --steps 1");
  EXPECT_EQ(bad.status, 1) << bad.err;
  EXPECT_NE(bad.err.find("--tf32 changes fp32 GEMMs only, and --precision is bf16"),
            std::string::npos)
      << bad.err;
}

// --attention fused (the tensor-core flash kernels) and cudnn (the cuDNN component) are offered,
// and refused in fp32 before the device is touched; cudnn, in a build without the component
// (the test preset's), is refused for that first.
TEST(FourwayTrainCuda, OffersFusedAttentionIn16BitOnly) {
  const auto r = run("--help");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto at = r.out.find("--attention blockwise|fused|cudnn");
  ASSERT_NE(at, std::string::npos) << r.out;
  const auto entry = r.out.substr(at, r.out.find("\n  --", at) - at);  // the flag and its text
  EXPECT_NE(entry.find("[blockwise]"), std::string::npos) << entry;
  const auto bad = run("--attention fused --precision fp32 --steps 1");
  EXPECT_EQ(bad.status, 1) << bad.err;
  EXPECT_NE(bad.err.find("--attention fused runs in bf16 or fp16, and --precision is fp32"),
            std::string::npos)
      << bad.err;
  const auto cudnn = run("--attention cudnn --precision fp32 --steps 1");
  EXPECT_EQ(cudnn.status, 1) << cudnn.err;
  const bool no_component = cudnn.err.find(
                                "--attention cudnn needs a fourway-train-cuda built with the cuDNN "
                                "component") != std::string::npos;
  const bool fp32 = cudnn.err.find(
                        "--attention cudnn runs in bf16 or fp16, and --precision is "
                        "fp32") != std::string::npos;
  EXPECT_TRUE(no_component || fp32) << cudnn.err;
}

TEST(FourwayTrainCuda, BadFlagIsRefusedBeforeTheDeviceIsTouched) {
  const auto r = run("--zero");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("fourway-train-cuda: "), std::string::npos) << r.err;
}

TEST(FourwayTrainCuda, WithoutGpuEveryBackendExitsWithTheDeviceError) {
  if (visible_gpus() > 0) GTEST_SKIP() << "a GPU is visible: train_fourway_train_cuda_vs_host runs";
  for (const char* args :
       {"--steps 1", "--ranks 4 --zero 3 --steps 1", "--backend strict --ranks 2 --steps 1"}) {
    const auto r = run(args);
    EXPECT_EQ(r.status, 1) << args;
    // stdout stays empty: the device is checked before the model or the data is touched
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(r.err, std::string("\n") + kNoGpu) << args;
  }
  // --backend nccl: the device error, or, in a build without NCCL, that refusal (a flag this build
  // cannot run is refused with the other flags, before the device)
  const auto nccl = run("--backend nccl --steps 1");
  EXPECT_EQ(nccl.status, 1);
  EXPECT_EQ(nccl.out, "");
  EXPECT_TRUE(nccl.err == std::string("\n") + kNoGpu ||
              nccl.err.find("--backend nccl, but fourway-train-cuda was built without NCCL") !=
                  std::string::npos)
      << nccl.err;
}

// Flags the GPU build cannot run are refused like any flag error, with or without a device.
TEST(FourwayTrainCuda, BackendMpiIsRefusedBeforeTheDevice) {
  const auto r = run("--backend mpi --steps 1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("fourway-train-cuda: fourway: --backend mpi moves host memory"),
            std::string::npos)
      << r.err;
}

}  // namespace
