//! `cp::RingShard<T, B, Comm>`: the `SequenceShard` (layers/sequence_shard.hpp) of a rank of a
//! context-parallel group — what a model binds so that its position embedding reads this rank's
//! positions and its attention runs around the ring.
//!
//! Rank r of the group of c holds, of every sequence of T tokens, chunks r and 2c − 1 − r of 2c
//! (`balanced_split`); its local rows are T/c, so the split is read off the rows a layer sees
//! (T = rows · c) and a sequence whose length does not cut into 2c chunks is the split's
//! ShapeError. Attention is `ring_attention_forward` / `ring_attention_backward` over the group.
//!
//! The ring runs on either backend: its algorithm is written once (parallel/cp/ring_algorithm.hpp),
//! the host form in parallel/cp/ring_attention.hpp and the CUDA form in
//! parallel/cp/ring_attention.cuh, which every nvcc translation unit includes here. On CUDA the
//! group's communicator must run on the context's stream, as the strategies set every group's.
#pragma once

#include <cstdint>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/sequence_shard.hpp"
#include "fourway/parallel/cp/ring_attention.hpp"

#if defined(FOURWAY_CUDA_COMPILATION)
#include "fourway/parallel/cp/ring_attention.cuh"  // the CUDA form, for RingShard<T, Cuda, Comm>
#endif

namespace fourway::cp {

template <floating_dtype T, backend B, communicator Comm>
class RingShard final : public SequenceShard<T, B> {
 public:
  /// `group` is the context-parallel group of this rank (not owned; it outlives the shard).
  explicit RingShard(Comm& group) : group_(&group) {}

  [[nodiscard]] int ranks() const override { return group_->size(); }
  [[nodiscard]] std::int64_t position(std::int64_t row, std::int64_t local) const override {
    return split(local).position(row);
  }
  /// The split of sequences of which this rank holds `local` rows.
  [[nodiscard]] BalancedSplit split(std::int64_t local) const {
    return balanced_split(local * ranks(), ranks(), group_->rank());
  }

  void attention_forward(const Context<B>& ctx, T* y, float* lse, const T* qkv, std::int64_t Bn,
                         std::int64_t Tn, std::int64_t width, std::int64_t heads) override {
    ring_attention_forward(ctx, *group_, split(Tn), y, lse, qkv, Bn, width, heads);
  }
  void attention_backward(const Context<B>& ctx, T* dqkv, const T* dy, const T* qkv, const T* y,
                          const float* lse, std::int64_t Bn, std::int64_t Tn, std::int64_t width,
                          std::int64_t heads) override {
    ring_attention_backward(ctx, *group_, split(Tn), dqkv, dy, qkv, y, lse, Bn, width, heads);
  }

 private:
  Comm* group_;
};

}  // namespace fourway::cp
