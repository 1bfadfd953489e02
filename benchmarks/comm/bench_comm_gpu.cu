// The communication stream on a GPU (issue 17 item 8), run by scripts/device-check.sh; without a
// GPU the executable says so and exits 77 (ctest: Skipped).
//
// A stand-in for a backward with bucketed gradient reduction: `rounds` times, a bf16 GEMM
// (8192 x 8192 x 4096, the compute of one bucket's layers) on the rank's stream, then that
// bucket's all-reduce (32 MiB of bf16, summed in fp32 as NcclComm does by default) issued
// asynchronously into a WorkQueue, which the end of the "step" completes with `order_all`.
// Four variants, each timed by CUDA events on the rank's stream from the first GEMM to the
// point where the stream has waited for the last reduction:
//   compute        the GEMMs alone
//   comm           the reductions alone
//   comm_stream    both, NcclOptions::communication_stream on (the default): the reductions run
//                  on the communicator's own stream beside the next GEMMs
//   bound_stream   both, communication_stream off: every reduction queued between two GEMMs
// Overlap = (compute + comm − comm_stream) / min(compute, comm): 1 when the reductions hide
// completely behind the GEMMs, 0 when they serialise (what bound_stream shows). One rank: NCCL's
// all-reduce is then a device-local pass, memory-bound as a real ring's reduction kernels are,
// so this measures whether the streams run side by side, not the network.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "fourway/backend/cuda/kernels.cuh"
#include "fourway/comm/nccl_comm.cuh"
#include "fourway/parallel/work_queue.hpp"
#include "support/cuda_timing.cuh"

namespace fw = fourway;

namespace {

enum Variant : std::int64_t { compute = 0, comm = 1, comm_stream = 2, bound_stream = 3 };

constexpr std::int64_t gemm_m = 8192, gemm_n = 8192, gemm_k = 4096;
constexpr std::int64_t bucket = std::int64_t{16} << 20;  // bf16 elements: 32 MiB
constexpr int rounds = 8;

void step(benchmark::State& state) {
  const auto variant = static_cast<Variant>(state.range(0));
  fw::MemoryAccountant acct;
  fw::Context<fw::Cuda> ctx(acct, 0);
  fw::NcclOptions no;
  no.communication_stream = variant != bound_stream;
  auto nccl = fw::NcclComm::single(0, {}, no);
  nccl.set_stream(ctx.stream());
  using Bf = fw::bf16;
  fw::Tensor<Bf, fw::Cuda> a({gemm_m, gemm_k}, fw::MemTag::workspace, acct);
  fw::Tensor<Bf, fw::Cuda> b({gemm_k, gemm_n}, fw::MemTag::workspace, acct);
  fw::Tensor<Bf, fw::Cuda> c({gemm_m, gemm_n}, fw::MemTag::workspace, acct);
  fw::Tensor<Bf, fw::Cuda> grads({rounds, bucket}, fw::MemTag::grads, acct);
  fw::cuda::fill(ctx, a.data(), a.numel(), Bf(0.01f));
  fw::cuda::fill(ctx, b.data(), b.numel(), Bf(0.02f));
  fw::cuda::fill(ctx, grads.data(), grads.numel(), Bf(1.0f));
  fw::WorkQueue queue;
  const auto body = [&] {
    for (int r = 0; r < rounds; ++r) {
      if (variant != comm) {
        fw::cuda::gemm(ctx, fw::Trans::none, fw::Trans::none, gemm_m, gemm_n, gemm_k, 1.0f,
                       a.data(), gemm_k, b.data(), gemm_n, 0.0f, c.data(), gemm_n);
      }
      if (variant != compute) {
        Bf* g = grads.data() + r * bucket;
        queue.push(nccl.all_reduce_async(g, g, bucket, fw::ReduceOp::avg), r,
                   fw::WorkKind::gradient);
      }
    }
    queue.order_all();
  };
  // the warm-up sets up NCCL's buffers; the host wait after each iteration is bounded by NCCL's
  // deadline, never a hang
  cuda_timed_loop(state, ctx.stream(), body, [&] { queue.wait_all(); });
  {  // one rank's avg is its input: every element still 1
    std::vector<Bf> back(16);
    fw::cuda::to_host(ctx, back.data(), grads.data() + (rounds - 1) * bucket, 16);
    for (const Bf& x : back) {
      if (fw::convert<float>(x) != 1.0f) state.SkipWithError("the reduced bucket is not 1");
    }
  }
  state.counters["gemm_tflops"] =
      benchmark::Counter(variant == comm ? 0.0 : 2.0 * gemm_m * gemm_n * gemm_k * rounds * 1e-12,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["reduced_gib"] =
      static_cast<double>(variant == compute ? 0 : rounds * bucket * 2) / (1 << 30);
}

}  // namespace

BENCHMARK(step)
    ->ArgName("variant")
    ->Arg(compute)
    ->Arg(comm)
    ->Arg(comm_stream)
    ->Arg(bound_stream)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  if (fw::cuda::device_count() == 0) {
    std::printf("bench_comm_gpu: no CUDA device; nothing measured (GPU figures stay pending)\n");
    return 77;  // ctest: Skipped
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
