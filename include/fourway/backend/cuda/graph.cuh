//! `StepGraph<Cuda>`: a step captured from the context's stream into a CUDA graph once and
//! replayed with one launch (backend/capture.hpp has the contract and the host's rehearsal).
//! The capture runs under a `CaptureGuard` (no synchronising call, no new block from the
//! backend, no tensor made before it freed; GraphCaptureError names the one that was tried) in
//! thread-local capture mode, so other ranks' threads on the same GPU are not disturbed; the
//! blocks it was served stay the graph's until it goes. A failed capture is ended and discarded
//! before the error propagates, leaving the stream usable. Compiled here; no GPU has run it yet
//! (docs/gpu-status.md).
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

  /// Records `step`'s work on the context's stream into a graph, instantiates it and launches it
  /// once (the step has then run, as on the host).
  template <class F>
  void capture(const Context<Cuda>& ctx, F&& step) {
    destroy();
    ctx_ = &ctx;
    try {
      record(ctx, std::forward<F>(step));
      cuda::check_cuda(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
    } catch (...) {
      destroy();
      throw;
    }
    replay(ctx);
  }
  [[nodiscard]] bool captured() const { return exec_ != nullptr; }
  /// Launches the captured step on the context's stream.
  void replay(const Context<Cuda>& ctx) const {
    check<GraphCaptureError>(captured() && &ctx == ctx_,
                             "fourway: StepGraph::replay before a capture on this context");
    cuda::check_cuda(cudaGraphLaunch(exec_, ctx.stream()), "cudaGraphLaunch");
  }
  /// Forgets the graph; the blocks it was served are ordinary cached blocks again (a launch in
  /// flight finishes first: the stream orders every later use of them).
  void drop() noexcept { destroy(); }

 private:
  template <class F>
  void record(const Context<Cuda>& ctx, F&& step) {
    CaptureGuard<Cuda> guard(ctx, capture_name, this);
    cuda::check_cuda(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal),
                     "cudaStreamBeginCapture");
    try {
      std::forward<F>(step)();
      guard.check_step();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(ctx.stream(), &partial);
      if (partial != nullptr) (void)cudaGraphDestroy(partial);
      (void)cudaGetLastError();  // the invalidated capture's error, not the caller's
      throw;
    }
    cuda::check_cuda(cudaStreamEndCapture(ctx.stream(), &graph_), "cudaStreamEndCapture");
  }
  void destroy() noexcept {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
    if (ctx_ != nullptr) ctx_->memory().release_graph_blocks(this);
    exec_ = nullptr;
    graph_ = nullptr;
    ctx_ = nullptr;
  }
  const Context<Cuda>* ctx_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace fourway
