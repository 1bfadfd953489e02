// Timing for the GPU benchmarks: each iteration is timed by two CUDA events on a stream and
// reported as Google Benchmark's manual time (register the benchmark with UseManualTime()).
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

/// Runs `body` once as a warm-up, then once per iteration between two events on `stream`;
/// `after` runs after the warm-up and after each timed iteration, outside the timing (a host wait
/// that bounds the iteration's asynchronous work, say).
template <class Body, class After>
void cuda_timed_loop(benchmark::State& state, cudaStream_t stream, Body&& body, After&& after) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  body();
  after();
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    body();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(static_cast<double>(ms) * 1e-3);
    after();
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}
