//! `StepScalars<B>`: the few doubles a data-parallel step must agree on over its group (the loss
//! sum, the Σg² of the gradient shards), summed as one packed buffer in the backend's memory by
//! one all-reduce.
//!
//! Scalars live on the host (the loss comes back from the model, Σg² from a reduction kernel),
//! but a communicator moves the backend's memory: NCCL refuses host pointers
//! (comm/buffer_kind.hpp). So the values are packed into a small buffer of the backend
//! (`comm_buffers` in the rank's accountant), all-reduced there, and copied back: one collective
//! per step however many scalars, instead of one host-memory all-reduce per scalar.
//!
//!   host: [loss, Σg²] --from_host--> buffer (B) --all_reduce SUM--> buffer --to_host--> host
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "fourway/backend/ops.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"

namespace fourway {

template <class B>
class StepScalars {
 public:
  /// Most scalars one call reduces.
  static constexpr std::int64_t capacity = 4;

  explicit StepScalars(const Context<B>& ctx)
      : ctx_(&ctx), buffer_(Shape{capacity}, MemTag::comm_buffers, ctx.memory()) {}

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
