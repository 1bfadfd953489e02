//! Compute of a training step: FLOPs per token and the pipeline bubble.
//!
//! FLOPs per token (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
//! Clusters Using Megatron-LM", §5.1 eq. 3, written per token): 6Ψ for the matrix multiplies of
//! forward (2Ψ) and backward (4Ψ), with Ψ the matmul parameters (the blocks and the vocabulary
//! projection h·V — an embedding lookup is not a multiply), plus the attention scores and their
//! weighted sum, 4·s·h per layer forward, 12·L·s·h forward + backward (no causal halving, as in
//! the paper). Recomputation repeats forward work: full recomputation one more forward of the
//! blocks (8Ψ_blocks + 16Lsh), selective the attention core only (+4Lsh) (Korthikanti et al.
//! 2022 §5).
//!
//! Pipeline bubble (Huang et al. 2019, GPipe §2.2; Narayanan et al. 2021 §2.2): with p stages and
//! m micro-batches a step takes (m + p − 1) micro-batch slots for m of useful work; the idle
//! fraction is (p − 1)/(m + p − 1), the same for GPipe and 1F1B.
#pragma once

#include <cstdint>

#include "fourway/plan/activation.hpp"
#include "fourway/plan/architecture.hpp"

namespace fourway::plan {

/// FLOPs of forward + backward (+ recomputation) per trained token of the whole model.
constexpr double flops_per_token(const Architecture& a, Checkpointing r = Checkpointing::none) {
  const double blocks = static_cast<double>(a.layers * layer_params(a));
  const double head = static_cast<double>(a.vocab * a.hidden);
  const double attention = static_cast<double>(a.layers) * static_cast<double>(a.seq) *
                           static_cast<double>(a.hidden);  // L·s·h
  switch (r) {
    case Checkpointing::none: return 6.0 * (blocks + head) + 12.0 * attention;
    case Checkpointing::selective: return 6.0 * (blocks + head) + 16.0 * attention;
    case Checkpointing::full: return 8.0 * blocks + 6.0 * head + 16.0 * attention;
  }
  return 0;
}

/// FLOPs per token on one rank of pipeline stage `stage` under tensor parallelism `tp`: its
/// blocks, and the vocabulary projection on the last stage. Summed over the stages: the model's
/// `flops_per_token / tp`.
constexpr double stage_flops_per_token(const Architecture& a, int tp, int stages, int stage,
                                       Checkpointing r = Checkpointing::none) {
  validate(a, tp);
  const double layers = static_cast<double>(layers_on_stage(a.layers, stages, stage));
  const double block = static_cast<double>(layer_params(a));
  const double sh = static_cast<double>(a.seq) * static_cast<double>(a.hidden);
  const double k_block = r == Checkpointing::full ? 8.0 : 6.0;
  const double k_attention = r == Checkpointing::none ? 12.0 : 16.0;
  double f = layers * (k_block * block + k_attention * sh);
  if (stage == stages - 1) f += 6.0 * static_cast<double>(a.vocab * a.hidden);
  return f / static_cast<double>(tp);
}

/// The idle fraction of a pipeline step, (p − 1)/(m + p − 1).
constexpr double bubble_fraction(int stages, std::int64_t micro_batches) {
  detail::require(stages >= 1 && micro_batches >= 1, "fourway: a pipeline of ", stages,
                  " stages and ", micro_batches, " micro-batches");
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

/// The idle fraction of a step of any schedule: GPipe and 1F1B in closed form, the others from
/// their tables timed with F = B = W (schedule/simulate.hpp, no p2p time), averaged over the
/// ranks — ZB-H1 about (p − 1)/(3m + p − 1) (Qi et al. 2023, §3), interleaved about
/// (p − 1)/(v·m + p − 1) (Narayanan et al. 2021, §2.2).
inline double schedule_bubble(Schedule s, int stages, std::int64_t micro_batches,
                              int virtual_stages = 1) {
  if (s == Schedule::gpipe || s == Schedule::one_f_one_b || stages == 1)
    return bubble_fraction(stages, micro_batches);
  return schedule::simulate(
             checked_schedule({s, stages, static_cast<int>(micro_batches), virtual_stages}),
             schedule::Costs{})
      .bubble();
}

}  // namespace fourway::plan
