// main() of every CUDA test executable (see fourway_add_cuda_test). Runs all tests; where there
// is no GPU the device tests GTEST_SKIP, and the executable exits with 77 so ctest reports it as
// skipped. A failing test always wins: its non-zero status is returned, never hidden by a skip.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    (void)cudaGetLastError();
    devices = 0;
  }
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  if (devices == 0) {
    std::printf("fourway: no CUDA device: the GPU tests of this executable were skipped\n");
    return 77;
  }
  return 0;
}
