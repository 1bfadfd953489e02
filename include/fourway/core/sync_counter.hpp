//! SyncCounter: how many times a backend context made the host wait for the work queued on it.
//!
//! A GPU step is fast only when the host keeps queueing kernels ahead of the device; every call
//! that returns a value computed on the device (a copy to the host, a reduction read back) or
//! waits for the stream drains that queue. Both contexts count such calls — `synchronize()`,
//! `to_host`, the reductions that return a host value, and a host-to-device copy that had to
//! wait — so a host test can assert how many a training step makes, and the count holds for the
//! device run because the same algorithm makes the same calls (docs/contracts.md).
//!
//! While a CUDA graph capture is open on the context (`begin_capture`, backend/capture.hpp) a
//! synchronising call is refused instead: a stream being captured cannot be waited on, and a
//! value read back during capture would be read once, never at replay. GraphCaptureError names
//! the call and the capture. So is a copy from host memory (`note_upload`): a capture records
//! the copy's source address, and each replay would copy what lies there then, not the values
//! the step was given.
#pragma once

#include <atomic>
#include <cstdint>

#include "fourway/core/error.hpp"

namespace fourway {

class SyncCounter {
 public:
  SyncCounter() = default;
  SyncCounter(const SyncCounter&) = delete;
  SyncCounter& operator=(const SyncCounter&) = delete;

  /// Records one synchronising call, `call` naming it (contexts are const where kernels are
  /// issued); throws GraphCaptureError instead inside a capture.
  void note_sync(const char* call = "a synchronising call") const {
    if (capture_ != nullptr) {
      throw GraphCaptureError(detail::cat(
          "fourway: ", call, " inside ", capture_, ": a captured step may not synchronise (the ",
          "stream is being recorded, and a value read back now would not be read again at ",
          "replay); keep the step's host reads outside the capture, or run it uncaptured"));
    }
    syncs_.fetch_add(1, std::memory_order_relaxed);
  }
  /// A copy from host memory, `call` naming it: allowed, and not a synchronising call, outside a
  /// capture; inside one, GraphCaptureError.
  void note_upload(const char* call) const {
    if (capture_ == nullptr) return;
    throw GraphCaptureError(detail::cat(
        "fourway: ", call, " inside ", capture_,
        ": a captured step may not copy from host "
        "memory (each replay would copy what the host buffer holds then, not these values); "
        "upload before the capture into a buffer the step reads, or run it uncaptured"));
  }
  /// Opens (`what` names it in errors) and closes a capture on this context.
  void begin_capture(const char* what) const noexcept { capture_ = what; }
  void end_capture() const noexcept { capture_ = nullptr; }
  /// The open capture's name, or null.
  [[nodiscard]] const char* capture() const noexcept { return capture_; }
  /// Synchronising calls so far.
  [[nodiscard]] std::uint64_t syncs() const noexcept {
    return syncs_.load(std::memory_order_relaxed);
  }

 private:
  mutable std::atomic<std::uint64_t> syncs_{0};
  mutable const char* capture_ = nullptr;  // the rank's thread alone opens and closes it
};

}  // namespace fourway
