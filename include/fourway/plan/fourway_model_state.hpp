//! fourway's own sharding layout of a GPT-2, so the planner's model-state bytes equal the memory
//! accountant's under `ShardedStrategy<Stage>` byte for byte, padding included.
//!
//! `ShardedStrategy` (parallel/sharded.hpp) pads each *segment* of its flat buffer to a multiple
//! of the group size N (parallel/flat_layout.hpp): under stages 1 and 2 the segments are gradient
//! buckets, packed greedily by `plan_buckets` in the order backward completes the gradients; under
//! stage 3 they are the FSDP units (embedding with the tied `wte`, each block, the final norm).
//! Stage 0 shards nothing and pads nothing. The backward order of a GPT-2's parameters:
//!
//!   ln_f.bias ln_f.weight | h.{L-1}: mlp.c_proj.b, mlp.c_proj.w, mlp.c_fc.b, mlp.c_fc.w, ln_2.b,
//!   ln_2.w, attn.c_proj.b, attn.c_proj.w, attn.c_attn.b, attn.c_attn.w, ln_1.b, ln_1.w | ... |
//!   h.0 | wpe wte
#pragma once

#include <cstdint>
#include <vector>

#include "fourway/parallel/flat_layout.hpp"
#include "fourway/plan/architecture.hpp"
#include "fourway/plan/model_state.hpp"

namespace fourway::plan {

/// Element counts of a GPT-2's parameters in the order backward makes their gradients final.
inline std::vector<std::int64_t> gpt2_backward_numels(const Architecture& a) {
  validate(a);
  detail::require(a.family == Family::gpt2, "fourway: fourway's runtime model is GPT-2; ", a.name,
                  " is not");
  const std::int64_t h = a.hidden, f = a.ffn;
  std::vector<std::int64_t> n = {h, h};  // ln_f bias, weight
  for (std::int64_t l = 0; l < a.layers; ++l) {
    for (std::int64_t x : {h, f * h, f, h * f, h, h, h, h * h, 3 * h, h * 3 * h, h, h}) {
      n.push_back(x);
    }
  }
  n.push_back(a.seq * h);    // wpe
  n.push_back(a.vocab * h);  // wte
  return n;
}

/// The segments `ShardedStrategy<zero_stage>` pads to a multiple of the group size.
inline std::vector<std::int64_t> fourway_segments(const Architecture& a, int zero_stage,
                                                  std::int64_t bucket_bytes, Precision p) {
  check_zero_stage(zero_stage);
  if (zero_stage == 3) return fsdp_units(a);
  const std::vector<std::int64_t> numels = gpt2_backward_numels(a);
  std::vector<std::int64_t> segments;
  for (const auto& bucket : plan_buckets(numels, bucket_bytes, working_bytes(p))) {
    std::int64_t s = 0;
    for (int i : bucket) s += numels[static_cast<std::size_t>(i)];
    segments.push_back(s);
  }
  return segments;
}

/// Model-state bytes of one rank of fourway's `ShardedStrategy<zero_stage>` over `dp` ranks with
/// gradient buckets of `bucket_bytes` (`ShardedOptions::bucket_bytes`, 25 MiB by default).
inline ModelStateBytes fourway_model_state_bytes(const Architecture& a, Precision p, int zero_stage,
                                                 int dp, std::int64_t bucket_bytes = 25LL << 20,
                                                 Optimizer optimizer = Optimizer::adam()) {
  const std::vector<std::int64_t> segments = fourway_segments(a, zero_stage, bucket_bytes, p);
  return model_state_bytes(total_params(a), p, zero_stage, dp, Padding::per_unit(segments),
                           optimizer);
}

}  // namespace fourway::plan
