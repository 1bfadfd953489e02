//! `pp::ChunkSet<T, B, Comm, Chunk>`: the pipeline chunks one rank holds, seen as one model by the
//! data-parallel machinery (ShardedStrategy, parallel/dp/parameter_layout.hpp), so that ZeRO 1-3
//! across the replicas of a pipeline stage reuses the sharding of the flat layout unchanged.
//!
//!   units            chunk 0's units, then chunk 1's (ZB-V and interleaved ranks hold two or
//!                    more chunks), each chunk's in its own order (embedding, blocks, head)
//!   parameters       chunk by chunk in each chunk's `visit_parameters` order; the tied `wte` once
//!   per
//!                    chunk that holds it (both copies are sharded and stepped alike)
//!   counts_in_norm   false for the LM head's copy of `wte` (the last chunk's, when the model
//!                    has more than one chunk): Σg² counts the tied embedding once; for
//!                    tensor-parallel chunks (a GPT over a tp group) also what the chunk says (a
//!                    replicated parameter counts on tp rank 0 only)
//!   own_segment      the parameters the pipeline names (the two copies of a tied `wte` under
//!                    ZeRO-2/3, whose reduced shards it sums element for element): each is a
//!                    segment of its own in the sharded layout (parallel/dp/parameter_layout.hpp)
//!   state_view       the chunk's (checkpoints); the tied copy of `wte` is not written
//!   sum_over_model_parallel   Σg² summed over the pipeline group (every stage's parameters),
//!                    then over the chunks' tensor-parallel group when they have one
//!
//! Holds pointers to the chunks and the pipeline communicator, which must outlive it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/state_view.hpp"

namespace fourway::pp {

template <class T, class B, class Comm, class Chunk>
class ChunkSet {
 public:
  using value_type = T;
  using chunk_type = Chunk;

  /// `chunks`: this rank's chunks in model order; `tied_copy`: the LM head's copy of `wte` on
  /// this rank (null when the rank holds none or the model is one chunk); `alone`: parameters
  /// that are segments of their own.
  ChunkSet(std::vector<chunk_type*> chunks, const Parameter<T, B>* tied_copy, Comm& pp,
           std::vector<const Parameter<T, B>*> alone = {})
      : chunks_(std::move(chunks)), pp_(&pp) {
    check<ConfigError>(!chunks_.empty(), "fourway: a pipeline rank with no chunk");
    for (std::size_t k = 0; k < chunks_.size(); ++k) {
      auto* c = chunks_[k];
      int i = 0;
      c->visit_parameters([&](Parameter<T, B>& p) {
        bool counted = &p != tied_copy;
        if constexpr (requires { c->counts_in_norm(i); }) counted = counted && c->counts_in_norm(i);
        counted_.push_back(counted);
        own_segment_.push_back(std::find(alone.begin(), alone.end(), &p) != alone.end());
        where_.push_back({k, i, &p});
        ++i;
      });
      first_unit_.push_back(units_);
      units_ += c->units();
    }
  }

  [[nodiscard]] int units() const { return units_; }

  template <class F>
  void visit_parameters(F&& f) {
    for (auto* c : chunks_) c->visit_parameters(f);
  }
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    check<ConfigError>(u >= 0 && u < units_, "fourway: chunk-set unit ", u, " of ", units_);
    std::size_t c = chunks_.size() - 1;
    while (first_unit_[c] > u) --c;
    chunks_[c]->visit_unit_parameters(u - first_unit_[c], f);
  }

  /// Whether parameter `param` is a segment of its own (ParameterLayout).
  [[nodiscard]] bool own_segment(int param) const {
    return own_segment_.at(static_cast<std::size_t>(param));
  }
  /// Chunk k's (this rank's k-th) first unit in the set's numbering.
  [[nodiscard]] int first_unit(std::size_t k) const { return first_unit_.at(k); }
  [[nodiscard]] bool counts_in_norm(int param) const {
    return counted_.at(static_cast<std::size_t>(param));
  }
  /// Where parameter `param` lies in its global tensor (its chunk's view); the LM head's copy of
  /// `wte` is not written (the first chunk's is).
  [[nodiscard]] StateView state_view(int param) const {
    const Where& w = where_.at(static_cast<std::size_t>(param));
    StateView v = state_view_of(*chunks_[w.chunk], w.index, *w.param);
    v.writes = v.writes && counted_[static_cast<std::size_t>(param)];
    return v;
  }
  /// Slot `slot` of the step's scalars (backend memory) summed over the pipeline group and the
  /// chunks' tensor-parallel group, in place.
  template <class Scalars>
  void sum_over_model_parallel(Scalars& scalars, std::int64_t slot) {
    scalars.reduce(*pp_, slot);
    sum_over_tensor_parallel(scalars, slot);
  }
  /// Slot `slot` summed over the chunks' tensor-parallel group (nothing for chunks without one).
  template <class Scalars>
  void sum_over_tensor_parallel(Scalars& scalars, std::int64_t slot) {
    if constexpr (requires { chunks_.front()->sum_over_model_parallel(scalars, slot); })
      chunks_.front()->sum_over_model_parallel(scalars, slot);
  }

 private:
  std::vector<chunk_type*> chunks_;
  Comm* pp_;
  struct Where {
    std::size_t chunk;
    int index;  // in the chunk's visit_parameters order
    const Parameter<T, B>* param;
  };
  std::vector<bool> counted_;
  std::vector<bool> own_segment_;
  std::vector<Where> where_;
  std::vector<int> first_unit_;
  int units_ = 0;
};

}  // namespace fourway::pp
