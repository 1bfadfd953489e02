//! The words every communicator shares: the reductions (`ReduceOp`), the operations (`CommOp`),
//! the element types a communicator moves (`comm_element`) with the accumulator a reduction of
//! them uses, the group's options (`CommOptions`) and one call's options (`CallOptions`).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

/// Reductions. `avg` is the sum divided by the group size (truncating for integers).
enum class ReduceOp : std::uint8_t { sum, avg, max, min };

constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

/// The operations a communicator performs (for messages, counters and mismatch checks).
enum class CommOp : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  send,
  recv,
  barrier,
  split,
};
inline constexpr int comm_op_count = 8;

constexpr std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::broadcast: return "broadcast";
    case CommOp::send: return "send";
    case CommOp::recv: return "recv";
    case CommOp::barrier: return "barrier";
    case CommOp::split: return "split";
  }
  return "?";
}

/// Element types a communicator moves. 16-bit floats are reduced in fp32.
template <class T>
concept comm_element = floating_dtype<T> || std::is_same_v<T, double> ||
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

/// Options every backend honours.
struct CommOptions {
  /// Longest time any blocking wait may take before it throws CommTimeout. Default: 5 minutes
  /// (a step of a large model can legitimately keep a rank busy for a minute).
  std::chrono::milliseconds deadline{std::chrono::minutes(5)};
  /// Check before each collective that all ranks agree on op, dtype, count, reduce op and root.
  bool debug = false;
  /// Hold every call to NCCL's contract (docs/comm.md, "The strict world"): buffers must be
  /// memory the backend allocated, a send completes only when its recv is posted (except inside
  /// a group), and a wait that can never complete throws CommDeadlock naming every rank's
  /// pending operations. LocalWorld runs it (`fourway-train --backend strict`); NcclComm is
  /// strict by nature; MpiComm refuses it (wrap it in `fw::Strict<MpiComm>`, comm/strict.hpp).
  bool strict = false;
};

/// Options of one communicator call, the trailing defaulted argument of every operation
/// (`comm.all_reduce(s, r, n, op, {.timeout = 2s})`). A zero field means "the communicator's
/// own": a call without options behaves exactly as before. What each backend honours:
///
///   field    LocalComm                  MpiComm           NcclComm              Counting<C>
///   timeout  every wait of the call     its MPI requests  enqueue + its Work    forwards
///   stream   device memory (host: no-op) ConfigError      work, workspace, Work forwards
///
/// `timeout` replaces `CommOptions::deadline` for this call only: a peer that never arrives turns
/// into CommTimeout after it. `stream` (a `cudaStream_t`) orders this call's device-memory work on
/// that stream instead of the one `set_stream` bound; a backend that cannot honour a field the
/// caller set refuses the call with ConfigError naming the field, rather than ignoring it.
struct CallOptions {
  /// Longest time any blocking wait of this call may take; 0: `CommOptions::deadline`.
  std::chrono::milliseconds timeout{0};
  /// `cudaStream_t` for this call's device-memory work; nullptr: the communicator's stream.
  void* stream = nullptr;
};

namespace detail {
/// Accumulator of a reduction: fp32 for 16-bit floats, int64 (wrapping) for integers.
template <class T>
struct accumulator {
  using type = float;
};
template <>
struct accumulator<double> {
  using type = double;
};
template <>
struct accumulator<std::int32_t> {
  using type = std::int64_t;
};
template <>
struct accumulator<std::int64_t> {
  using type = std::int64_t;
};

template <class A>
FOURWAY_HOST_DEVICE constexpr A acc_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
  } else {
    return a + b;
  }
}

/// The deadline of one call: its own timeout when it set one, else the group's. A negative
/// timeout is refused with ConfigError.
inline std::chrono::milliseconds call_deadline(const CommOptions& group, const CallOptions& call) {
  check<ConfigError>(call.timeout.count() >= 0,
                     "fourway: CallOptions::timeout must be >= 0 ms "
                     "(0: the communicator's CommOptions::deadline), got ",
                     call.timeout.count(), " ms");
  return call.timeout.count() > 0 ? call.timeout : group.deadline;
}
}  // namespace detail

}  // namespace fourway
