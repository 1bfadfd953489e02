// LocalWorld collectives from 4 KiB to 256 MiB, with algbw and busbw by the nccl-tests
// definitions (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md), and single-core memcpy
// bandwidth as the yardstick. `size` is the nccl-tests size: the all_reduce / broadcast /
// send buffer, the all_gather output, the reduce_scatter input.
//
//   algbw = size / time
//   busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n (reduce_scatter, all_gather), 1 (broadcast,
//   send/recv)
//
// FOURWAY_BENCH_MAX_BYTES caps the sizes (the ctest smoke run uses 64 KiB).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fourway/comm/local_world.hpp"

namespace fw = fourway;

namespace {

enum class Op { all_reduce, reduce_scatter, all_gather, broadcast, send_recv };

const char* op_name(Op op) {
  switch (op) {
    case Op::all_reduce: return "all_reduce";
    case Op::reduce_scatter: return "reduce_scatter";
    case Op::all_gather: return "all_gather";
    case Op::broadcast: return "broadcast";
    case Op::send_recv: return "send_recv";
  }
  return "?";
}

double bus_factor(Op op, int n) {
  switch (op) {
    case Op::all_reduce: return 2.0 * (n - 1) / n;
    case Op::reduce_scatter:
    case Op::all_gather: return static_cast<double>(n - 1) / n;
    case Op::broadcast:
    case Op::send_recv: return 1.0;
  }
  return 1.0;
}

// Runs `iters` timed repetitions of `op` on `n` ranks over `bytes` (fp32); returns the seconds
// per repetition measured by rank 0 between two barriers. Checks one result first.
double run(Op op, int n, std::int64_t bytes, std::int64_t iters) {
  const std::int64_t count = bytes / 4;     // fp32 elements of the nccl-tests size
  const std::int64_t per_rank = count / n;  // reduce_scatter out / all_gather in
  double seconds = 0;
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    auto& c = w.comm();
    const int r = w.rank();
    std::vector<float> a(static_cast<std::size_t>(count), static_cast<float>(r + 1));
    std::vector<float> b(static_cast<std::size_t>(count), 0.0f);
    auto once = [&] {
      switch (op) {
        case Op::all_reduce: c.all_reduce(a.data(), b.data(), count, fw::ReduceOp::sum); break;
        case Op::reduce_scatter:
          c.reduce_scatter(a.data(), b.data(), per_rank, fw::ReduceOp::sum);
          break;
        case Op::all_gather: c.all_gather(a.data(), b.data(), per_rank); break;
        case Op::broadcast: c.broadcast(r == 0 ? a.data() : b.data(), count, 0); break;
        case Op::send_recv:
          if (r == 0) c.send(a.data(), count, 1, 0);
          if (r == 1) c.recv(b.data(), count, 0, 0);
          c.barrier();
          break;
      }
    };
    once();  // warm-up and validation
    const float expect_sum = static_cast<float>(n * (n + 1) / 2);
    bool ok = true;
    switch (op) {
      case Op::all_reduce:
        ok = b[0] == expect_sum && b[static_cast<std::size_t>(count - 1)] == expect_sum;
        break;
      case Op::reduce_scatter: ok = per_rank == 0 || b[0] == expect_sum; break;
      case Op::all_gather:
        ok = per_rank == 0 ||
             b[static_cast<std::size_t>((n - 1) * per_rank)] == static_cast<float>(n);
        break;
      case Op::broadcast: ok = r == 0 || b[0] == 1.0f; break;
      case Op::send_recv: ok = r != 1 || b[0] == 1.0f; break;
    }
    if (!ok) throw fw::Error(std::string("bench: wrong result of ") + op_name(op));
    c.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) once();
    c.barrier();
    if (r == 0)
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  return seconds / static_cast<double>(iters);
}

void report(benchmark::State& state, double seconds, std::int64_t bytes, double factor) {
  for (auto _ : state) state.SetIterationTime(seconds);
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * factor;
  state.counters["bytes"] = static_cast<double>(bytes);
}

void bench_collective(benchmark::State& state, Op op, int n, std::int64_t bytes) {
  const double s = run(op, n, bytes, state.max_iterations);
  report(state, s, bytes, bus_factor(op, n));
}

void bench_memcpy(benchmark::State& state, std::int64_t bytes) {
  std::vector<char> src(static_cast<std::size_t>(bytes), 1),
      dst(static_cast<std::size_t>(bytes), 0);
  std::memcpy(dst.data(), src.data(), src.size());  // touch both
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < state.max_iterations; ++i) {
    std::memcpy(dst.data(), src.data(), src.size());
    benchmark::ClobberMemory();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                   static_cast<double>(state.max_iterations);
  report(state, s, bytes, 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t max_bytes = std::int64_t{256} << 20;
  if (const char* m = std::getenv("FOURWAY_BENCH_MAX_BYTES")) max_bytes = std::atoll(m);
  for (std::int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const std::string size = std::to_string(bytes);
    benchmark::RegisterBenchmark(("memcpy/bytes:" + size).c_str(), bench_memcpy, bytes)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
    for (Op op :
         {Op::all_reduce, Op::reduce_scatter, Op::all_gather, Op::broadcast, Op::send_recv}) {
      for (int n : {2, 4, 8}) {
        if (op == Op::send_recv && n != 2) continue;
        benchmark::RegisterBenchmark(
            (std::string(op_name(op)) + "/ranks:" + std::to_string(n) + "/bytes:" + size).c_str(),
            bench_collective, op, n, bytes)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
