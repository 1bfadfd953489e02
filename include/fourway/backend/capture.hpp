//! CUDA graph capture, and what it cannot hold: `CaptureGuard<B>` and `StepGraph<B>`.
//!
//! A step captured into a CUDA graph and replayed skips the host's per-kernel launch cost, but a
//! capture records kernels only: a synchronising call (the stream cannot be waited on while it
//! is recorded, and a value read back would be read once, not at each replay) or a new block
//! from the backend (cudaMalloc is not captured; a replay would reuse the captured pointer, not
//! allocate) breaks it. While a `CaptureGuard` is alive, its context refuses every synchronising
//! call (`SyncCounter::note_sync`, which each one passes) and its accountant every tensor that
//! the block cache cannot serve, each with a GraphCaptureError naming the call or the bytes and
//! the capture — on the host as on the GPU, so a host test tells whether a step can be captured.
//!
//! `StepGraph<B>` captures a step once and replays it: on CUDA (backend/cuda/graph.cuh) the
//! stream's capture, the instantiated graph and its launches; on the host a rehearsal — the step
//! runs under the guard at the capture and at each replay — so the same program runs, and fails
//! the same way, without a GPU. A step is captured after one uncaptured run (its tensors' blocks
//! are then in the cache) with the same shapes.
#pragma once

#include <functional>
#include <utility>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

/// Opens a capture named `what` on `ctx` and its accountant for the guard's life. Captures do
/// not nest (GraphCaptureError).
template <class B>
class CaptureGuard {
 public:
  CaptureGuard(const Context<B>& ctx, const char* what) : ctx_(&ctx) {
    if (const char* open = ctx.capture()) {
      throw GraphCaptureError(
          detail::cat("fourway: ", what, " opened inside ", open, ": captures do not nest"));
    }
    ctx.begin_capture(what);
    ctx.memory().begin_capture(what);
  }
  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;
  ~CaptureGuard() {
    ctx_->memory().end_capture();
    ctx_->end_capture();
  }

 private:
  const Context<B>* ctx_;
};

template <class B>
class StepGraph;

/// The host's step graph: a rehearsal of the capture (see the file comment).
template <>
class StepGraph<Host> {
 public:
  static constexpr const char* capture_name = "a CUDA graph capture (rehearsed on the host)";

  /// Runs `step` once under the guard and keeps it for `replay`.
  template <class F>
  void capture(const Context<Host>& ctx, F&& step) {
    std::function<void()> s(std::forward<F>(step));
    {
      CaptureGuard<Host> guard(ctx, capture_name);
      s();
    }
    step_ = std::move(s);
  }
  [[nodiscard]] bool captured() const { return static_cast<bool>(step_); }
  /// Runs the captured step again under the guard.
  void replay(const Context<Host>& ctx) const {
    check<GraphCaptureError>(captured(), "fourway: StepGraph::replay before a capture");
    CaptureGuard<Host> guard(ctx, capture_name);
    step_();
  }

 private:
  std::function<void()> step_;
};

}  // namespace fourway
