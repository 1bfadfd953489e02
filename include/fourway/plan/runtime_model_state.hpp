//! fourway's own sharding layout of a GPT-2, so the planner's model-state bytes equal the memory
//! accountant's under `ShardedStrategy<Stage>` byte for byte, padding included.
//!
//! `ShardedStrategy` (train/sharded_strategy.hpp) pads each *segment* of its flat buffer to a
//! multiple of the group size N (parallel/dp/flat_layout.hpp): under stages 1 and 2 the segments
//! are gradient buckets, packed greedily by `plan_buckets` in the order backward completes the
//! gradients; under stage 3 they are the FSDP units (embedding with the tied `wte`, each block,
//! the final norm). Stage 0 shards nothing and pads nothing. The backward order of a GPT-2's
//! parameters:
//!
//!   ln_f.bias ln_f.weight | h.{L-1}: mlp.c_proj.b, mlp.c_proj.w, mlp.c_fc.b, mlp.c_fc.w, ln_2.b,
//!   ln_2.w, attn.c_proj.b, attn.c_proj.w, attn.c_attn.b, attn.c_attn.w, ln_1.b, ln_1.w | ... |
//!   h.0 | wpe wte
//!
//! `runtime_data_parallel_bytes` counts the ring bytes of one step of the same strategy as the
//! `Counting` decorator does (comm/counting.hpp). It differs from the published ZeRO volumes in two
//! places, both visible here: the step's loss (and, from stage 1, the gradient norm) is one more
//! all-reduce of a double; and under stage 3 the tied head gathers unit 0 (the embedding, which
//! owns `wte`) once more in forward, while the last forward unit stays gathered into backward —
//! all-gathers of 2Ψ' + unit0' − head' per micro-batch instead of 2Ψ'.
//!
//! Under tensor parallelism (`TensorSplit`, parallel/tp/placement.hpp) the same layout holds each
//! rank's slices: c_attn, c_fc and both c_proj weights /tp, their column biases /tp, LayerNorms,
//! wpe and the row-split biases whole, and wte Vp/tp rows of the vocabulary padded to Vp (a
//! multiple of tp·alignment); `TensorParallelStrategy` shards those slices over the dp group.
#pragma once

#include <cstdint>
#include <vector>

#include "fourway/layers/gpt.hpp"
#include "fourway/mesh/policies.hpp"
#include "fourway/parallel/dp/flat_layout.hpp"
#include "fourway/parallel/tp/placement.hpp"
#include "fourway/plan/architecture.hpp"
#include "fourway/plan/model_state.hpp"

namespace fourway::plan {

/// How fourway's GPT-2 is split over a tensor-parallel group: `tp` ranks, the vocabulary padded
/// to a multiple of tp·`vocab_alignment` (`tp::TpOptions::vocab_alignment`: 1 on the host, 128 on
/// CUDA by default).
struct TensorSplit {
  int tp = 1;
  int vocab_alignment = 1;
};

/// Rows of wte one tensor-parallel rank holds (padding included): Vp/tp.
inline std::int64_t runtime_vocab_rows(const Architecture& a, const TensorSplit& t) {
  return tp::padded_vocab(a.vocab, t.tp, t.vocab_alignment) / t.tp;
}

/// Element counts of one tensor-parallel rank's GPT-2 parameters in the order backward makes
/// their gradients final.
inline std::vector<std::int64_t> gpt2_backward_numels(const Architecture& a,
                                                      const TensorSplit& t = {}) {
  validate(a, t.tp);
  detail::require(a.family == Family::gpt2, "fourway: fourway's runtime model is GPT-2; ", a.name,
                  " is not");
  const std::int64_t h = a.hidden, f = a.ffn, n = t.tp;
  std::vector<std::int64_t> e = {h, h};  // ln_f bias, weight
  for (std::int64_t l = 0; l < a.layers; ++l) {
    for (std::int64_t x :
         {h, f * h / n, f / n, h * f / n, h, h, h, h * h / n, 3 * h / n, h * 3 * h / n, h, h}) {
      e.push_back(x);
    }
  }
  e.push_back(a.seq * h);                            // wpe
  e.push_back(runtime_vocab_rows(a, t) * a.hidden);  // wte
  return e;
}

/// The FSDP units of one part (`models::GptPart`: a pipeline chunk, or the whole model) on one
/// tensor-parallel rank, in model order: the embedding (wte, wpe), each block, the head (ln_f, and
/// the head's own copy of the tied wte when the part has no embedding).
inline std::vector<std::int64_t> runtime_part_units(const Architecture& a, const TensorSplit& t,
                                                    const models::GptPart& part) {
  const std::vector<std::int64_t> e = gpt2_backward_numels(a, t);
  const std::int64_t wte = e[e.size() - 1], wpe = e[e.size() - 2], ln_f = e[0] + e[1];
  const std::int64_t end = part.end_block < 0 ? a.layers : part.end_block;
  std::vector<std::int64_t> u;
  if (part.embedding) u.push_back(wte + wpe);
  for (std::int64_t l = part.first_block; l < end; ++l) {
    std::int64_t block = 0;  // block l's 12 tensors sit at 2 + (L-1-l)·12 in backward order
    for (std::size_t k = 0; k < 12; ++k)
      block += e[2 + static_cast<std::size_t>(a.layers - 1 - l) * 12 + k];
    u.push_back(block);
  }
  if (part.head) u.push_back(ln_f + (part.embedding ? 0 : wte));
  return u;
}

/// fourway's FSDP units of one tensor-parallel rank: the embedding (wte, wpe), each block, ln_f.
inline std::vector<std::int64_t> runtime_units(const Architecture& a, const TensorSplit& t = {}) {
  return runtime_part_units(a, t, models::GptPart{});
}

/// The segments `ShardedStrategy<zero_stage>` pads to a multiple of the group size.
inline std::vector<std::int64_t> runtime_segments(const Architecture& a, int zero_stage,
                                                  std::int64_t bucket_bytes, Precision p,
                                                  const TensorSplit& t = {}) {
  check_zero_stage(zero_stage);
  if (zero_sharding(zero_stage).shards_params) return runtime_units(a, t);
  const std::vector<std::int64_t> numels = gpt2_backward_numels(a, t);
  std::vector<std::int64_t> segments;
  for (const auto& bucket : plan_buckets(numels, bucket_bytes, working_bytes(p))) {
    std::int64_t s = 0;
    for (int i : bucket) s += numels[static_cast<std::size_t>(i)];
    segments.push_back(s);
  }
  return segments;
}

/// Parameters one tensor-parallel rank holds (padding rows of wte included).
inline std::int64_t runtime_rank_params(const Architecture& a, const TensorSplit& t = {}) {
  std::int64_t n = 0;
  for (std::int64_t x : gpt2_backward_numels(a, t)) n += x;
  return n;
}

/// Model-state bytes of one rank of fourway's `ShardedStrategy<zero_stage>` over `dp` ranks with
/// gradient buckets of `bucket_bytes` (`ShardedOptions::bucket_bytes`, 25 MiB by default), each
/// rank holding the slices of tensor-parallel split `t` (`TensorParallelStrategy`).
inline ModelStateBytes runtime_model_state_bytes(const Architecture& a, Precision p, int zero_stage,
                                                 int dp, std::int64_t bucket_bytes = 25LL << 20,
                                                 Optimizer optimizer = Optimizer::adam(),
                                                 const TensorSplit& t = {}) {
  const std::vector<std::int64_t> segments = runtime_segments(a, zero_stage, bucket_bytes, p, t);
  return model_state_bytes(runtime_rank_params(a, t), p, zero_stage, dp,
                           Padding::per_unit(segments), optimizer);
}

/// Ring bytes one rank sends in one step of `ShardedStrategy<zero_stage>` with `micro_batches`
/// micro-batches, per collective (the Counting decorator's convention: all-reduce 2(N−1)/N of the
/// buffer, reduce-scatter and all-gather (N−1) times the per-rank part).
struct DataParallelBytes {
  double all_reduce = 0;      // gradients (stage 0) and the scalar reductions
  double reduce_scatter = 0;  // gradients (stages 1-3)
  double all_gather = 0;      // updated weights (stages 1-2), gathered units (stage 3)
  [[nodiscard]] double total() const { return all_reduce + reduce_scatter + all_gather; }
};

inline DataParallelBytes runtime_data_parallel_bytes(const Architecture& a, Precision p,
                                                     int zero_stage, int dp, int micro_batches,
                                                     std::int64_t bucket_bytes = 25LL << 20) {
  detail::require(dp >= 1 && micro_batches >= 1, "fourway: ", dp, " ranks and ", micro_batches,
                  " micro-batches");
  DataParallelBytes b;
  if (dp == 1) return b;
  const double n = dp;
  const double w = static_cast<double>(working_bytes(p));
  const double m = micro_batches;
  const ZeroSharding z = zero_sharding(zero_stage);
  const double scalars = z.shards_optimizer_state ? 2 : 1;  // loss sum; + global Σg² from stage 1
  b.all_reduce = scalars * 8.0 * 2.0 * (n - 1) / n;
  if (!z.shards_optimizer_state) {
    b.all_reduce += static_cast<double>(total_params(a)) * w * 2.0 * (n - 1) / n;
    return b;
  }
  const std::vector<std::int64_t> segs = runtime_segments(a, zero_stage, bucket_bytes, p);
  double shard = 0;
  for (std::int64_t s : segs) shard += static_cast<double>(ceil_div(s, dp));
  const double part = (n - 1) * w;  // bytes per element of a rank's part
  if (!z.shards_grads) {
    b.reduce_scatter = shard * part;
    b.all_gather = shard * part;
  } else if (!z.shards_params) {
    b.reduce_scatter = m * shard * part;
    b.all_gather = shard * part;
  } else {
    const double unit0 = static_cast<double>(ceil_div(segs.front(), dp));
    const double head = static_cast<double>(ceil_div(segs.back(), dp));
    b.reduce_scatter = m * shard * part;
    b.all_gather = m * (2.0 * shard + unit0 - head) * part;
  }
  return b;
}

}  // namespace fourway::plan
