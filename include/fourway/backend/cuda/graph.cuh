//! `StepGraph<Cuda>`: a step captured from the context's stream into a CUDA graph once and
//! replayed with one launch (backend/capture.hpp has the contract and the host's rehearsal).
//! The capture runs under a `CaptureGuard` (no synchronising call, no new block from the
//! backend; GraphCaptureError names the one that was tried) in thread-local capture mode, so
//! other ranks' threads on the same GPU are not disturbed. A failed capture is ended and
//! discarded before the error propagates, leaving the stream usable. Compiled here; no GPU has
//! run it yet (docs/gpu-status.md).
// fourway-requires: cuda
#pragma once

#include <cuda_runtime.h>

#include <exception>
#include <utility>

#include "fourway/backend/capture.hpp"
#include "fourway/backend/cuda/backend.cuh"

namespace fourway {

template <>
class StepGraph<Cuda> {
 public:
  static constexpr const char* capture_name = "a CUDA graph capture";

  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { destroy(); }

  /// Records `step`'s work on the context's stream into a graph and instantiates it (the step's
  /// kernels do not run now: `replay` runs them).
  template <class F>
  void capture(const Context<Cuda>& ctx, F&& step) {
    destroy();
    CaptureGuard<Cuda> guard(ctx, capture_name);
    cuda::check_cuda(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal),
                     "cudaStreamBeginCapture");
    try {
      std::forward<F>(step)();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(ctx.stream(), &partial);
      if (partial != nullptr) (void)cudaGraphDestroy(partial);
      (void)cudaGetLastError();  // the invalidated capture's error, not the caller's
      throw;
    }
    cuda::check_cuda(cudaStreamEndCapture(ctx.stream(), &graph_), "cudaStreamEndCapture");
    cuda::check_cuda(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  [[nodiscard]] bool captured() const { return exec_ != nullptr; }
  /// Launches the captured step on the context's stream.
  void replay(const Context<Cuda>& ctx) const {
    check<GraphCaptureError>(captured(), "fourway: StepGraph::replay before a capture");
    cuda::check_cuda(cudaGraphLaunch(exec_, ctx.stream()), "cudaGraphLaunch");
  }

 private:
  void destroy() noexcept {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace fourway
