//! `SequenceShard<T, B>`: what the layers see of a sequence split over ranks (context
//! parallelism, docs/context-parallel.md).
//!
//! Under context parallelism a rank holds some rows of every sequence, not all of them. Every
//! layer but two works on its rows as if they were the whole sequence; the two that cannot are the
//! position embedding (row i of the rank is not position i) and attention (a query meets the keys
//! of every rank). A model that supports the axis takes a `SequenceShard` (`bind_sequence_shard`)
//! and hands it to those two layers; without one (the default, a null pointer) they run their
//! local kernels on rows that are the whole sequence. The implementation — which positions, which
//! ring — lives with the policy (`cp::RingShard`, parallel/cp/ring_shard.hpp): the layers know
//! only this interface, so `layers/` never includes `parallel/`.
#pragma once

#include <cstdint>
#include <vector>

#include "fourway/layers/layer.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class SequenceShard {
 public:
  SequenceShard() = default;
  SequenceShard(const SequenceShard&) = delete;
  SequenceShard& operator=(const SequenceShard&) = delete;
  virtual ~SequenceShard() = default;

  /// Ranks every sequence is split over (1: the rank holds whole sequences).
  [[nodiscard]] virtual int ranks() const = 0;
  /// The position in the whole sequence of row `row` of this rank's `local` rows.
  [[nodiscard]] virtual std::int64_t position(std::int64_t row, std::int64_t local) const = 0;

  /// The causal attention of this rank's queries against the keys of every rank: `attention_core`'s
  /// contract (layers/attention.hpp) — y (Bn, Tn, width) and each query row's fp32 log-sum-exp
  /// (Bn, heads, Tn) from qkv (Bn, Tn, 3·width) of this rank's rows. A collective of the ranks
  /// the sequence is split over.
  virtual void attention_forward(const Context<B>& ctx, T* y, float* lse, const T* qkv,
                                 std::int64_t Bn, std::int64_t Tn, std::int64_t width,
                                 std::int64_t heads) = 0;
  /// dqkv (`=`) of this rank's rows from dy and the forward's qkv, y and lse (a collective).
  virtual void attention_backward(const Context<B>& ctx, T* dqkv, const T* dy, const T* qkv,
                                  const T* y, const float* lse, std::int64_t Bn, std::int64_t Tn,
                                  std::int64_t width, std::int64_t heads) = 0;
};

/// `rows` local rows from `row` that hold the consecutive positions from `position`.
struct PositionRun {
  std::int64_t row = 0;
  std::int64_t position = 0;
  std::int64_t rows = 0;
};

/// This rank's `local` rows as runs of consecutive positions, in row order: one run [0, local)
/// without a shard, one per chunk with one (two for the load-balanced split).
template <floating_dtype T, backend B>
std::vector<PositionRun> position_runs(const SequenceShard<T, B>* shard, std::int64_t local) {
  std::vector<PositionRun> runs;
  for (std::int64_t i = 0; i < local; ++i) {
    const std::int64_t p = shard != nullptr ? shard->position(i, local) : i;
    if (!runs.empty() && runs.back().position + runs.back().rows == p) {
      ++runs.back().rows;
    } else {
      runs.push_back({i, p, 1});
    }
  }
  return runs;
}

/// Whether `shard` splits sequences (a null shard or one of one rank does not).
template <floating_dtype T, backend B>
bool splits_sequences(const SequenceShard<T, B>* shard) {
  return shard != nullptr && shard->ranks() > 1;
}

/// The length of the whole sequence of which this rank holds `local` rows.
template <floating_dtype T, backend B>
std::int64_t sequence_length(const SequenceShard<T, B>* shard, std::int64_t local) {
  return splits_sequences(shard) ? local * shard->ranks() : local;
}

/// The rows of a position table (Tmax, C) — GPT-2's wpe — that this rank's `local` rows add:
/// `table` itself when the rows are the whole sequence, else its rows at their positions,
/// gathered into `storage` (a (local, C) workspace).
template <floating_dtype T, backend B>
const T* position_rows(const Context<B>& ctx, SequenceShard<T, B>* shard, const T* table,
                       std::int64_t local, std::int64_t C, Tensor<T, B>& storage) {
  if (!splits_sequences(shard)) return table;
  storage = detail::workspace<T, B>(ctx, Shape{local, C});
  for (const PositionRun& r : position_runs(shard, local)) {
    Ops<B>::copy(ctx, storage.data() + r.row * C, table + r.position * C, r.rows * C);
  }
  return storage.data();
}

/// Where a kernel adds (`+=`) the position-table gradient of this rank's `local` rows: `grad`
/// itself when the rows are the whole sequence, else a zeroed (local, C) workspace in `storage`,
/// which `add_position_grads` then adds into `grad` at the rows' positions.
template <floating_dtype T, backend B>
T* position_grad_rows(const Context<B>& ctx, SequenceShard<T, B>* shard, T* grad,
                      std::int64_t local, std::int64_t C, Tensor<T, B>& storage) {
  if (!splits_sequences(shard)) return grad;
  storage = detail::workspace<T, B>(ctx, Shape{local, C});
  Ops<B>::fill(ctx, storage.data(), storage.numel(), convert<T>(0.0f));
  return storage.data();
}
template <floating_dtype T, backend B>
void add_position_grads(const Context<B>& ctx, SequenceShard<T, B>* shard, T* grad,
                        const Tensor<T, B>& storage, std::int64_t local, std::int64_t C) {
  if (!splits_sequences(shard)) return;
  for (const PositionRun& r : position_runs(shard, local)) {
    T* g = grad + r.position * C;
    Ops<B>::residual_forward(ctx, g, g, storage.data() + r.row * C, r.rows * C);
  }
}

}  // namespace fourway
