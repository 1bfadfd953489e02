//! Activation bytes: the published per-layer model of Korthikanti et al. 2022, and how many
//! micro-batches a pipeline schedule keeps alive on a stage.
//!
//! Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi, Catanzaro 2022, "Reducing Activation
//! Recomputation in Large Transformer Models" (arXiv:2205.05198), Table 2, bytes per transformer
//! layer for one micro-batch of b sequences of s tokens, hidden h, a heads, tensor parallelism t,
//! 16-bit activations and 1-byte dropout masks:
//!
//!   no parallelism                      sbh·(34 + 5as/h)
//!   tensor parallel                     sbh·(10 + 24/t + 5as/(ht))
//!   tensor + sequence parallel          sbh·(34/t + 5as/(ht))
//!   tensor parallel + selective recompute           sbh·(10 + 24/t)
//!   tensor + sequence parallel + selective recompute sbh·(34/t)
//!   full recomputation                  sbh·2           (the layer input only)
//!
//! and §4.3: the first stage also keeps the embedding's dropout mask, sbh/t per micro-batch, and
//! the last stage the output layer, 4sbh/t·(1 + v/h) (final norm, projection input, fp32 logits).
//! Under context parallelism of degree c a rank holds s = S/c tokens of every sequence: every
//! term scales with them, the score terms with the local queries times all S keys.
//! The 34 counts GPT-3-style blocks with dropout; GPT-2 in fourway has no dropout, and fourway's
//! own footprint is modelled exactly, tensor by tensor, in `runtime_activation.hpp`.
//!
//! Micro-batches in flight on stage i of p with m micro-batches (Narayanan et al. 2021,
//! "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §2.2):
//! GPipe keeps all m; 1F1B keeps min(m, p − i) — the first stage is the worst.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "fourway/plan/model_state.hpp"
#include "fourway/schedule/generators.hpp"
#include "fourway/schedule/simulate.hpp"

namespace fourway::plan {

/// Activation checkpointing (Megatron calls it recomputation): none, selective (the attention
/// core, Korthikanti et al.) or full (each layer keeps only its input).
enum class Checkpointing : std::uint8_t { none, selective, full };

constexpr std::string_view checkpointing_name(Checkpointing r) {
  switch (r) {
    case Checkpointing::none: return "none";
    case Checkpointing::selective: return "selective";
    case Checkpointing::full: return "full";
  }
  return "?";
}

/// The planner names schedules with the runtime's kinds (schedule/generators.hpp); it models
/// the activations of GPipe and 1F1B.
using Schedule = schedule::Kind;

constexpr std::string_view schedule_name(Schedule s) { return schedule::kind_name(s); }

/// One micro-batch through one transformer layer, as Korthikanti et al. count it.
struct LayerShape {
  double s = 0;  // sequence length
  double b = 0;  // micro-batch size (sequences)
  double h = 0;  // hidden size
  double a = 0;  // attention heads
  double t = 1;  // tensor-parallel degree
  // Keys each query scores: s, or the whole sequence when context parallelism of degree c leaves
  // s = S/c local queries (0: s). The score terms grow with queries × keys.
  double keys = 0;
  // The attention keeps its score matrix (Korthikanti's 5as/h: the softmax, its dropout mask and
  // output); a fused kernel (FlashAttention) keeps none: its output and log-sum-exp only, which
  // the other terms already count.
  bool stores_scores = true;

  [[nodiscard]] constexpr double key_count() const { return keys > 0 ? keys : s; }
};

/// Korthikanti et al. 2022, Table 2: stored activation bytes of one layer for one micro-batch.
constexpr double korthikanti_layer_bytes(LayerShape x, bool sequence_parallel, Checkpointing r) {
  detail::require(x.t >= 1, "fourway: tensor-parallel degree ", x.t, " must be >= 1");
  const double sbh = x.s * x.b * x.h;
  // softmax, its dropout mask, scores
  const double attention = x.stores_scores ? 5.0 * x.a * x.key_count() / (x.h * x.t) : 0.0;
  switch (r) {
    case Checkpointing::full: return sbh * 2.0;
    case Checkpointing::selective:
      return sequence_parallel ? sbh * 34.0 / x.t : sbh * (10.0 + 24.0 / x.t);
    case Checkpointing::none:
      return sequence_parallel ? sbh * (34.0 / x.t + attention)
                               : sbh * (10.0 + 24.0 / x.t + attention);
  }
  return 0;
}

/// The part of a layer that recomputation rebuilds during backward, alive for one layer at a time:
/// the whole layer under full recomputation, the attention core (5as/(ht)·sbh) under selective.
constexpr double korthikanti_recompute_working_bytes(LayerShape x, bool sequence_parallel,
                                                     Checkpointing r) {
  switch (r) {
    case Checkpointing::none: return 0;
    case Checkpointing::selective:
      return x.stores_scores ? x.s * x.b * x.h * 5.0 * x.a * x.key_count() / (x.h * x.t) : 0.0;
    case Checkpointing::full:
      return korthikanti_layer_bytes(x, sequence_parallel, Checkpointing::none);
  }
  return 0;
}

/// §4.3: the embedding's dropout mask on the first stage, per micro-batch.
constexpr double korthikanti_embedding_bytes(LayerShape x) { return x.s * x.b * x.h / x.t; }

/// §4.3: the output layer on the last stage, per micro-batch: 4sbh/t·(1 + v/h).
constexpr double korthikanti_output_bytes(LayerShape x, double vocab) {
  return 4.0 * x.s * x.b * x.h / x.t * (1.0 + vocab / x.h);
}

/// Throws `ConfigError` with the schedule's own explanation when the runtime refuses the request.
inline void check_schedule_request(const schedule::Request& q) {
  const schedule::RequestProblem problem = schedule::validate(q);
  detail::require(problem == schedule::RequestProblem::none, "fourway: schedule ",
                  schedule::explain(q, problem));
}

/// The runtime's table for a request it accepts (`check_schedule_request` first).
inline schedule::Table checked_schedule(const schedule::Request& q) {
  check_schedule_request(q);
  return schedule::make(q);
}

/// Chunk-activations stage `stage` of `stages` holds at once at its peak, read off the schedule's
/// table (schedule/simulate.hpp: alive from a chunk's F to the end of its BW, or W): GPipe m and
/// 1F1B min(m, p − stage) in closed form (also where the runtime's 1F1B table needs m ≥ p), the
/// others as their tables run. With one chunk per rank (every
/// schedule but interleaved's `virtual_stages` and ZB-V's two) these are micro-batches.
inline std::int64_t micro_batches_in_flight(Schedule s, int stages, std::int64_t micro_batches,
                                            int stage = 0, int virtual_stages = 1) {
  detail::require(stages >= 1 && stage >= 0 && stage < stages, "fourway: stage ", stage, " of ",
                  stages, " pipeline stages does not exist");
  detail::require(micro_batches >= 1, "fourway: ", micro_batches,
                  " micro-batches; a step needs at least one");
  if (s == Schedule::gpipe) return micro_batches;
  if (s == Schedule::one_f_one_b) return std::min<std::int64_t>(micro_batches, stages - stage);
  return schedule::peak_in_flight(
      checked_schedule({s, stages, static_cast<int>(micro_batches), virtual_stages}), stage);
}

}  // namespace fourway::plan
