//! `StepScalars<B>`: the few doubles a step must know on the host (the loss sum, the Σg² of the
//! gradients or of this rank's shards), kept in one small buffer of the backend's memory
//! (`comm_buffers` in the rank's accountant), summed over a group by one all-reduce and read back
//! by one copy: the step's single synchronising read-out (core/sync_counter.hpp).
//!
//! The kernels write the slots where the values arise — `sum_into` adds each micro-batch's loss
//! to slot 0, `sum_squares_into` the gradients' squares to slot 1 — so nothing returns to the
//! host before the step's end:
//!
//!   begin_step: clear     kernels: slot 0 += loss, slot 1 += Σg²     end: [all_reduce SUM] →
//!   to_host
//!
//! `reduce` sums slots over one more group in place (a tensor-parallel or pipeline model sums
//! Σg² over its groups before the one read-back); `sum` packs values that are already on the
//! host (a loss the model returned) the same way: from_host, all-reduce, to_host. A communicator
//! moves only the backend's memory (NCCL refuses host pointers, comm/buffer_kind.hpp), hence the
//! buffer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "fourway/backend/ops.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

template <class B>
class StepScalars {
 public:
  /// Most scalars one call reduces.
  static constexpr std::int64_t capacity = 4;

  explicit StepScalars(const Context<B>& ctx)
      : ctx_(&ctx), buffer_(Shape{capacity}, MemTag::comm_buffers, ctx.memory()) {
    clear();
  }

  /// Slot i (backend memory), for the kernels that add to it.
  [[nodiscard]] double* slot(std::int64_t i) { return buffer_.data() + i; }
  /// Slots [0, n) = 0 (a kernel; no synchronisation).
  void clear(std::int64_t n = capacity) { Ops<B>::fill(*ctx_, buffer_.data(), n, 0.0); }
  /// Slot i = 0 (a kernel; no synchronisation).
  void zero(std::int64_t i) { Ops<B>::fill(*ctx_, buffer_.data() + i, 1, 0.0); }
  /// Slot i = v, copied from the host (staged on a device: no synchronisation).
  void set(std::int64_t i, double v) { Ops<B>::from_host(*ctx_, buffer_.data() + i, &v, 1); }

  /// Slots [0, N) read back: one synchronising call.
  template <std::size_t N>
  std::array<double, N> read() {
    static_assert(N >= 1 && static_cast<std::int64_t>(N) <= capacity,
                  "fourway: StepScalars::read reads 1 to StepScalars::capacity slots");
    std::array<double, N> out{};
    Ops<B>::to_host(*ctx_, out.data(), buffer_.data(), static_cast<std::int64_t>(N));
    return out;
  }
  /// Slots [0, reduced) summed over `comm`'s group in place (one all-reduce), then slots [0, N)
  /// read back. A collective: every rank of the group calls it with the same counts.
  template <std::size_t N, class Comm>
  std::array<double, N> read_summed(Comm& comm, std::int64_t reduced) {
    check<Error>(reduced >= 1 && reduced <= static_cast<std::int64_t>(N),
                 "fourway: StepScalars::read_summed reduces 1 to N slots, not ", reduced);
    comm.all_reduce(buffer_.data(), buffer_.data(), reduced, ReduceOp::sum);
    return read<N>();
  }

  /// Slots [first, first + n) summed over `comm`'s group in place: one all-reduce, no read-back
  /// (a model-parallel model sums Σg² over its groups with it before the step's one `read`).
  template <class Comm>
  void reduce(Comm& comm, std::int64_t first, std::int64_t n = 1) {
    check<Error>(first >= 0 && n >= 1 && first + n <= capacity, "fourway: StepScalars::reduce ",
                 "of slots [", first, ", ", first + n, ") outside [0, ", capacity, ")");
    comm.all_reduce(buffer_.data() + first, buffer_.data() + first, n, ReduceOp::sum);
  }

  /// Every rank's `local` summed over `comm`'s group, in one all-reduce of N doubles on the
  /// backend's memory. A collective: every rank of the group calls it with the same N.
  template <std::size_t N, class Comm>
  std::array<double, N> sum(Comm& comm, std::array<double, N> local) {
    static_assert(N >= 1 && static_cast<std::int64_t>(N) <= capacity,
                  "fourway: StepScalars::sum reduces 1 to StepScalars::capacity scalars at once");
    constexpr auto n = static_cast<std::int64_t>(N);
    Ops<B>::from_host(*ctx_, buffer_.data(), local.data(), n);
    comm.all_reduce(buffer_.data(), buffer_.data(), n, ReduceOp::sum);
    Ops<B>::to_host(*ctx_, local.data(), buffer_.data(), n);
    return local;
  }

  /// The packed buffer (backend memory), for tests that check what the communicator was given.
  [[nodiscard]] const double* data() const { return buffer_.data(); }

 private:
  const Context<B>* ctx_;
  Tensor<double, B> buffer_;  // (capacity)
};

}  // namespace fourway
