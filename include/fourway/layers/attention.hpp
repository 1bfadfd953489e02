//! `CausalSelfAttention<T, B, Comm>`: GPT-2's attention — c_attn (C -> 3C, q|k|v side by side),
//! causal softmax(q·kᵀ/sqrt(C/NH))·v per head, c_proj (C -> C) — as the tensor-parallel-ready
//! `ParallelAttention` (layers/parallel_attention.hpp) with GPT-2's names and init: in a group of
//! one rank (the default) the unsplit layer; over a `TpGroup` of N ranks c_attn is split by heads
//! (NH/N whole heads of q, k and v per rank) and c_proj by rows, joined by one all-reduce.
//!
//! Input and output (B, T, C). The stash holds the two projections' stashes, the heads' output
//! (B, T, C/N) and each query row's fp32 log-sum-exp (B, NH/N, T) (layers/attention_core.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fourway/layers/parallel_attention.hpp"

namespace fourway {

template <floating_dtype T, backend B, class Comm = Alone>
class CausalSelfAttention : public ParallelAttention<T, B, Comm> {
 public:
  /// Parameters "<name>.c_attn.{weight,bias}" (C, 3C/N) and "<name>.c_proj.{weight,bias}"
  /// (C/N, C); weights normal(0, init.std), c_proj's normal(0, init.residual_std), biases zero.
  CausalSelfAttention(const Context<B>& ctx, const std::string& name, std::int64_t C,
                      std::int64_t heads, const Init& init, TpGroup<Comm> group = {})
      : ParallelAttention<T, B, Comm>(
            ctx, name + ".c_attn", name + ".c_proj",
            AttentionSpec{C, heads, true, std::nullopt, init.seed, init.std, init.residual_std, 0},
            group),
        heads_(heads) {}

  /// All heads, NH (this rank holds `local_heads()` of them).
  [[nodiscard]] std::int64_t heads() const { return heads_; }
  ColumnLinear<T, B, Comm>& c_attn() { return this->qkv(); }
  RowLinear<T, B, Comm>& c_proj() { return this->out(); }

 private:
  std::int64_t heads_;
};

static_assert(layer<CausalSelfAttention<float, Host>>);

}  // namespace fourway
