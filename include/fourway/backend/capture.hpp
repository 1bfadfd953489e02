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
//! `StepGraph<B>` captures a step once (running it once) and replays it: on CUDA
//! (backend/cuda/graph.cuh) the stream's capture, the instantiated graph and its launches; on the
//! host a rehearsal — the step runs under the guard at the capture and at each replay — so the
//! same program runs, and fails the same way, without a GPU. A step is captured after one
//! uncaptured run (its tensors' blocks are then in the cache) with the same shapes.
//!
//! A replay runs no host code: it writes the addresses the capture was served. So every block a
//! capture takes from the cache or gives back to it stays the graph's until the graph goes
//! (core/block_cache.hpp: no tensor made between replays gets one, and none is given back to the
//! backend), and a step that frees a tensor made before its capture is refused after the step
//! (`MemoryAccountant::capture_fault`: the replay would work on a block the host has reused).
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "fourway/backend/host/backend.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

/// Opens a capture named `what` on `ctx` and its accountant for the guard's life, for the graph
/// `owner` (the blocks the capture is served are the owner's: see the file comment); a guard
/// without an owner owns them itself and gives them up when it closes. Captures do not nest
/// (GraphCaptureError).
template <class B>
class CaptureGuard {
 public:
  CaptureGuard(const Context<B>& ctx, const char* what, const void* owner = nullptr)
      : ctx_(&ctx), owner_(owner != nullptr ? owner : this) {
    if (const char* open = ctx.capture()) {
      throw GraphCaptureError(
          detail::cat("fourway: ", what, " opened inside ", open, ": captures do not nest"));
    }
    ctx.begin_capture(what);
    ctx.memory().begin_capture(what, owner_);
  }
  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;
  ~CaptureGuard() {
    ctx_->memory().end_capture();
    ctx_->end_capture();
    if (owner_ == this) ctx_->memory().release_graph_blocks(this);
  }
  /// After the step, inside the capture: what the step did that a replay cannot repeat, thrown.
  void check_step() const {
    const std::string fault = ctx_->memory().capture_fault();
    if (!fault.empty()) throw GraphCaptureError(fault);
  }

 private:
  const Context<B>* ctx_;
  const void* owner_;
};

template <class B>
class StepGraph;

/// The host's step graph: a rehearsal of the capture (see the file comment).
template <>
class StepGraph<Host> {
 public:
  static constexpr const char* capture_name = "a CUDA graph capture (rehearsed on the host)";

  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { drop(); }

  /// Runs `step` once under the guard and keeps it for `replay` (a failed capture keeps nothing).
  template <class F>
  void capture(const Context<Host>& ctx, F&& step) {
    drop();
    ctx_ = &ctx;
    std::function<void()> s(std::forward<F>(step));
    try {
      run(s);
    } catch (...) {
      drop();
      throw;
    }
    step_ = std::move(s);
  }
  [[nodiscard]] bool captured() const { return static_cast<bool>(step_); }
  /// Runs the captured step again under the guard.
  void replay(const Context<Host>& ctx) const {
    check<GraphCaptureError>(captured() && &ctx == ctx_,
                             "fourway: StepGraph::replay before a capture on this context");
    run(step_);
  }
  /// Forgets the step; the blocks it was served are ordinary cached blocks again.
  void drop() noexcept {
    if (ctx_ != nullptr) ctx_->memory().release_graph_blocks(this);
    step_ = {};
    ctx_ = nullptr;
  }

 private:
  void run(const std::function<void()>& s) const {
    CaptureGuard<Host> guard(*ctx_, capture_name, this);
    s();
    guard.check_step();
  }
  const Context<Host>* ctx_ = nullptr;
  std::function<void()> step_;
};

}  // namespace fourway
