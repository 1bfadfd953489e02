//! `TpGroup<Comm>`: the tensor-parallel group a tensor-parallel-ready layer is built over, and the
//! conjugate operators at the layer's edges, placed by the layer itself (Megatron-LM, Shoeybi et
//! al. 2019, §3; sequence parallelism, Korthikanti et al. 2022, §4.2.2):
//! ```
//!                         without sequence parallelism     with it (rows split in N chunks)
//!   column input   f      forward identity                 forward all-gather of the rows
//!                         backward all-reduce              backward reduce-scatter
//!   row output     g      forward all-reduce               forward reduce-scatter
//!                         backward identity                backward all-gather of the rows
//! ```
//! A default-constructed group is one rank (`TpGroup<>`, no communicator at all): every operator
//! is the identity and a tensor-parallel-ready layer is the plain layer, to the bit. The mesh
//! runtime hands a model its group; the model hands it to its layers, and writes no conjugate
//! itself. Every collective is completed in stream order (layers/conjugate.hpp).
#pragma once

#include <cstdint>
#include <type_traits>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/conjugate.hpp"
#include "fourway/layers/layer.hpp"

namespace fourway {

/// The communicator of a group of one rank: none (`TpGroup<>`).
struct Alone {};

template <class Comm = Alone>
class TpGroup {
  static_assert(std::is_same_v<Comm, Alone> || communicator<Comm>,
                "fourway: TpGroup<Comm> needs Comm to model fw::communicator (LocalComm, MpiComm, "
                "NcclComm, Counting<...>), or fw::Alone for a group of one rank");

 public:
  using comm_type = Comm;

  /// One rank.
  TpGroup() = default;
  /// The ranks of `comm`; with `sequence_parallel`, the activations between a row split and the
  /// next column split hold this rank's chunk of the rows only.
  explicit TpGroup(Comm& comm, bool sequence_parallel = false)
      : comm_(&comm), sp_(sequence_parallel && comm.size() > 1) {}

  [[nodiscard]] int size() const {
    if constexpr (alone) {
      return 1;
    } else {
      return comm_ == nullptr ? 1 : comm_->size();
    }
  }
  [[nodiscard]] int rank() const {
    if constexpr (alone) {
      return 0;
    } else {
      return comm_ == nullptr ? 0 : comm_->rank();
    }
  }
  [[nodiscard]] bool sequence_parallel() const { return sp_; }
  /// Built over a communicator (of any size, one included): a layer then keeps the split form
  /// of its parameters and kernels even at one rank, as a tensor-parallel mesh of tp = 1 has it.
  [[nodiscard]] bool has_comm() const { return comm_ != nullptr; }
  /// The communicator (null for a group of one).
  [[nodiscard]] Comm* comm() const { return comm_; }

  // ---- the conjugate operators (see the file comment); `x` rows are (rows, features) ---------

  /// f forward: the column split's input — `x` itself, or under sequence parallelism the group's
  /// chunks gathered (N·rows, C) into `gathered` (kept by the caller for the backward).
  template <class T, class B>
  Tensor<T, B> column_input(const Context<B>& ctx, const Tensor<T, B>& x,
                            Tensor<T, B>& gathered) const {
    if constexpr (!alone) {
      if (sp_) {
        gathered = tp::gather_rows(ctx, *comm_, x, gathered_shape(x), MemTag::activations);
        return gathered.view();
      }
    }
    (void)ctx;
    (void)gathered;
    return x.view();
  }
  /// f backward: the column split's input gradient summed over the group, in place, or under
  /// sequence parallelism reduce-scattered to this rank's chunk of the rows.
  template <class T, class B>
  Tensor<T, B> column_input_backward(const Context<B>& ctx, Tensor<T, B> dx) const {
    if constexpr (!alone) {
      if (sp_) return tp::reduce_scatter_rows(ctx, *comm_, dx, MemTag::workspace);
    }
    (void)ctx;
    all_reduce(dx);
    return dx;
  }
  /// g forward: the row split's partial output summed over the group, in place, or under
  /// sequence parallelism reduce-scattered to this rank's chunk of the rows (MemTag tag).
  template <class T, class B>
  Tensor<T, B> row_output(const Context<B>& ctx, Tensor<T, B> y, MemTag tag) const {
    if constexpr (!alone) {
      if (sp_) return tp::reduce_scatter_rows(ctx, *comm_, y, tag);
    }
    (void)ctx;
    (void)tag;
    all_reduce(y);
    return y;
  }
  /// g backward: the row split's output gradient, or under sequence parallelism the group's
  /// chunks gathered (N·rows, C).
  template <class T, class B>
  Tensor<T, B> row_output_backward(const Context<B>& ctx, const Tensor<T, B>& dy) const {
    if constexpr (!alone) {
      if (sp_) return tp::gather_rows(ctx, *comm_, dy, gathered_shape(dy), MemTag::workspace);
    }
    (void)ctx;
    return dy.view();
  }
  /// t = Σ over the group of t, in place (nothing for one rank).
  template <class T, class B>
  void all_reduce(Tensor<T, B>& t) const {
    all_reduce(t.data(), t.numel(), ReduceOp::sum);
  }
  /// p[0, n) = op over the group of p, in place (nothing for one rank).
  template <class T>
  void all_reduce(T* p, std::int64_t n, ReduceOp op) const {
    if constexpr (!alone) {
      if (size() > 1) tp::all_reduce_in_layer(*comm_, p, n, op);
    } else {
      (void)p, (void)n, (void)op;
    }
  }

 private:
  static constexpr bool alone = std::is_same_v<Comm, Alone>;
  /// The group's chunks of rows side by side: (N·rows, C).
  template <class T, class B>
  Shape gathered_shape(const Tensor<T, B>& chunk) const {
    const std::int64_t C = chunk.shape()[chunk.shape().rank() - 1];
    return Shape{chunk.numel() / C * size(), C};
  }

  Comm* comm_ = nullptr;
  bool sp_ = false;
};

}  // namespace fourway
