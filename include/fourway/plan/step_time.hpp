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
//!
//! Attention without a fused kernel (the FlashAttention of Dao et al. 2022 and its successors
//! keep the scores on chip) streams its score matrix, heads/t · b · s² elements per layer,
//! through GPU memory several times; the planner times those bytes at the memory bandwidth. The
//! passes, counted kernel by kernel for Megatron-LM's 2021 attention (a batched GEMM for the
//! scores, its fused scale-mask-softmax, dropout with a 1-byte mask, a batched GEMM for the
//! weighted sum): forward 13 bytes per element in 16-bit precision — the scores written (2), read
//! and the probabilities written (2 + 2), read and the dropped probabilities and mask written
//! (2 + 2 + 1), read by the second GEMM (2); backward 19 — the probabilities' gradient written
//! (2), dropout's backward (2 + 1 + 2), softmax's backward reading it and the probabilities and
//! writing the scores' gradient (2 + 2 + 2), read by the two GEMMs for Q and K (2 + 2), the
//! dropped probabilities read for V's gradient (2); a recomputed forward 13 more.
#pragma once

#include <cstdint>
#include <string_view>

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

/// How attention reaches memory. `published`: Korthikanti et al.'s Table 2 as printed — the
/// score matrix is stored for backward (its 5as/h term) and its memory traffic is not timed (the
/// planner's model before the others existed, and its default). `fused`: FlashAttention (Dao et
/// al. 2022), fourway's blockwise and fused kernels — the scores never leave the chip: nothing of
/// them stored, nothing streamed. `unfused`: separate kernels, as Megatron-LM's of 2021 — the
/// scores stored, and streamed through memory as counted below.
enum class AttentionKernel : std::uint8_t { published, fused, unfused };

constexpr std::string_view attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::published: return "published";
    case AttentionKernel::fused: return "fused";
    case AttentionKernel::unfused: return "unfused";
  }
  return "?";
}

inline constexpr double unfused_attention_forward_bytes = 13.0;   // per score element
inline constexpr double unfused_attention_backward_bytes = 19.0;  // per score element

/// Bytes an unfused attention moves through memory for one micro-batch of b sequences on one
/// rank: `layers` layers of heads/tp heads, `queries` local query rows (s, or s/c under context
/// parallelism) against `keys` keys each. `recompute`: the attention runs forward twice.
constexpr double unfused_attention_bytes(const Architecture& a, std::int64_t layers, int tp,
                                         double b, double queries, double keys, bool recompute) {
  const double elements =
      static_cast<double>(layers) * static_cast<double>(a.heads / tp) * b * queries * keys;
  const double per_element =
      unfused_attention_forward_bytes * (recompute ? 2.0 : 1.0) + unfused_attention_backward_bytes;
  return elements * per_element;
}

/// The attention core's share of `stage_flops_per_token` (scores and weighted sum, forward,
/// backward and any recomputation): 12 or 16 · s·h per layer per token, / tp.
constexpr double stage_attention_flops_per_token(const Architecture& a, int tp, int stages,
                                                 int stage, Checkpointing r = Checkpointing::none) {
  const double layers = static_cast<double>(layers_on_stage(a.layers, stages, stage));
  const double k_attention = r == Checkpointing::none ? 12.0 : 16.0;
  return layers * k_attention * static_cast<double>(a.seq) * static_cast<double>(a.hidden) /
         static_cast<double>(tp);
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
