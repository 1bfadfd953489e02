// The nvcc half of the mixed-mode program (see odr_host.cpp). Where a GPU is present it also runs
// LocalWorld's all_reduce on device memory, which only this half's LocalComm knows how to do.
#include <cuda_runtime.h>

#include "fourway/fourway.cuh"
#include "odr_checks.hpp"

namespace {

namespace fw = fourway;

int device_all_reduce() {
  int failures = 0;
  constexpr int n = 2;
  constexpr int count = 1000;
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    fw::Context<fw::Cuda> ctx(w.memory(), 0);
    w.comm().set_stream(ctx.stream());
    const int r = w.comm().rank();
    std::vector<float> x(count);
    for (int i = 0; i < count; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(r + i);
    float* d = nullptr;
    (void)cudaMalloc(&d, count * sizeof(float));
    (void)cudaMemcpy(d, x.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    w.comm().all_reduce(d, d, count, fw::ReduceOp::sum);
    (void)cudaStreamSynchronize(ctx.stream());
    (void)cudaMemcpy(x.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost);
    (void)cudaFree(d);
    int bad = 0;
    for (int i = 0; i < count; ++i) {
      if (x[static_cast<std::size_t>(i)] != static_cast<float>(1 + 2 * i)) ++bad;  // (0+i)+(1+i)
    }
    if (r == 0) failures = bad;
  });
  return failures;
}

}  // namespace

HalfReport run_cuda_half() {
  HalfReport h{odr::comm_namespace(), odr::host_collectives(), "host memory, 3 ranks"};
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    h.notes += "; no GPU: the device-memory all_reduce did not run";
    return h;
  }
  h.failures += device_all_reduce();
  h.notes += "; device memory all_reduce, 2 ranks on GPU 0";
  return h;
}
