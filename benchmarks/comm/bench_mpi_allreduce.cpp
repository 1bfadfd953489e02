// Open MPI's MPI_Allreduce (fp32 sum) from 4 KiB to 256 MiB, the baseline of
// benchmarks/compare_collectives.sh. Run under mpirun; rank 0 prints one line per size:
//   bytes algbw_GBps busbw_GBps     (busbw = algbw * 2(n-1)/n, the nccl-tests definition)
// Usage: mpirun -np N bench_mpi_allreduce [max_bytes] [seconds_per_size]
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const long long max_bytes = argc > 1 ? std::atoll(argv[1]) : (256LL << 20);
  const double budget = argc > 2 ? std::atof(argv[2]) : 0.5;
  for (long long bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const int count = static_cast<int>(bytes / 4);
    std::vector<float> a(static_cast<std::size_t>(count), static_cast<float>(rank + 1)),
        b(a.size());
    MPI_Allreduce(a.data(), b.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);  // warm-up
    const float expect = static_cast<float>(n * (n + 1) / 2);
    if (b[0] != expect || b[b.size() - 1] != expect) {
      std::fprintf(stderr, "bench_mpi_allreduce: wrong result at %lld bytes\n", bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // as many iterations as fit the budget, agreed by all ranks
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    MPI_Allreduce(a.data(), b.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int iters = static_cast<int>(budget / (one > 1e-9 ? one : 1e-9));
    if (iters < 3) iters = 3;
    if (iters > 100000) iters = 100000;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(a.data(), b.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    const double algbw = static_cast<double>(bytes) / s / 1e9;
    if (rank == 0) std::printf("%lld %.4f %.4f\n", bytes, algbw, algbw * 2.0 * (n - 1) / n);
  }
  MPI_Finalize();
  return 0;
}
