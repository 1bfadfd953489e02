//! What memory a communicator buffer lives in, and the rule that keeps host memory away from NCCL.
//!
//! NCCL reads and writes device memory from its kernels; a pageable host pointer handed to
//! `ncclAllReduce` is undefined behaviour (a crash or silent garbage on the first multi-GPU run).
//! `NcclComm` therefore asks CUDA what each buffer is (`detail::cuda_buffer_kind`,
//! comm/device_reduce.cuh) and calls `require_nccl_buffer` here, which refuses everything but
//! device and managed memory with a CommError naming the call, the buffer and the fix. The
//! decision lives in this host header so that it is tested without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "fourway/core/error.hpp"

namespace fourway {

/// The kinds `cudaPointerGetAttributes` tells apart (null: no buffer at all).
enum class BufferKind : std::uint8_t { null, host, pinned_host, device, managed };

constexpr std::string_view buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::null: return "a null pointer";
    case BufferKind::host: return "pageable host memory";
    case BufferKind::pinned_host: return "pinned host memory";
    case BufferKind::device: return "device memory";
    case BufferKind::managed: return "managed memory";
  }
  return "?";
}

/// Whether NCCL may read and write a buffer of kind `k` (device-resident memory only).
constexpr bool nccl_accepts(BufferKind k) {
  return k == BufferKind::device || k == BufferKind::managed;
}

/// Throws CommError unless NCCL may use the `role` buffer ("send", "recv") of `count` elements
/// of call `what`; a null buffer of no elements is accepted (nothing is touched).
inline void require_nccl_buffer(BufferKind kind, std::int64_t count, std::string_view role,
                                const std::string& what) {
  if (count == 0 && kind == BufferKind::null) return;
  check<CommError>(nccl_accepts(kind), "fourway: ", what, " refused: its ", role, " buffer (",
                   count, " elements) is ", buffer_kind_name(kind),
                   "; NCCL reads and writes device memory only. Pass a device buffer (a "
                   "Tensor<T, Cuda>), or copy host values into one first (as "
                   "fw::StepScalars does for the per-step scalars)");
}

}  // namespace fourway
