//! fourway's pipeline runtime, rank by rank: which chunks a pipeline rank holds and its
//! model-state bytes, equal to the memory accountant's under `PipelineStrategy<P, B, Comm, Zero>`
//! (train/pipeline_strategy.hpp) byte for byte.
//!
//! The model is cut into stages·v chunks by `pp::Partition::balanced` (parallel/pp/partition.hpp)
//! and chunk c lives on pipeline rank `table.rank_of(c)` of the schedule's table
//! (schedule/generators.hpp): one chunk per rank for gpipe, 1f1b and zb-h1, v for interleaved,
//! two (a V) for zb-v. A rank's parameters are its chunks' (`models::GptPart`): the first chunk
//! holds wte and wpe, the last ln_f and its own copy of the tied wte (the LM head). Under tensor
//! parallelism (tp > 1, `models::Gpt<T, B, Comm>` chunks) each holds its tp slices (`TensorSplit`).
//!
//!   ZeRO 0     the chunks' weights and gradients, fp32 masters (mixed precision) and Adam moments
//!              of every parameter: nothing padded
//!   ZeRO 1     `ShardedStrategy` over the rank's chunks (`pp::ChunkSet`) with `bucket_bytes = 0`:
//!              one segment of everything, padded to a multiple of dp
//!   ZeRO 2-3   one segment per FSDP unit, chunk by chunk, each chunk's units in model order
//!              (embedding = wte + wpe, each block, head = ln_f + the head's copy of wte), the
//!              tied wte of the first and the last chunk a segment of its own (its two copies'
//!              reduced shards are summed element for element)
//!
//! During a step ZeRO-2/3 hold, beside the shards, what the schedule has open (unit by unit,
//! `PipelineStrategy::unit_event`): ZeRO-3 the weights of the unit running (F, BW, B), ZeRO-2/3
//! the full gradients of the unit in a fused backward (BW) and, under a split backward, every
//! unit of a chunk from its B to its next W.
//!
//! Parts keep placeholders for the pieces they do not hold, weights and gradients in the working
//! precision that no optimizer sees: a 1-row wte and wpe of width C (on each rank of a tp group)
//! and a 1-feature ln_f (weight, bias).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/parallel/dp/flat_layout.hpp"
#include "fourway/parallel/pp/partition.hpp"
#include "fourway/plan/activation.hpp"
#include "fourway/plan/architecture.hpp"
#include "fourway/plan/communication.hpp"
#include "fourway/plan/model_state.hpp"
#include "fourway/plan/runtime_activation.hpp"
#include "fourway/plan/runtime_model_state.hpp"
#include "fourway/schedule/generators.hpp"

namespace fourway::plan {

/// How `PipelineStrategy` runs: `stages` pipeline ranks, the schedule, its micro-batches and (for
/// interleaved) chunks per rank.
struct PipelineSplit {
  int stages = 1;
  Schedule schedule = Schedule::one_f_one_b;
  std::int64_t micro_batches = 1;
  int virtual_stages = 1;

  [[nodiscard]] schedule::Request request() const {
    return schedule::Request{schedule, stages, static_cast<int>(micro_batches), virtual_stages};
  }
  /// The runtime's table; `ConfigError` with the schedule's own explanation when it refuses it.
  [[nodiscard]] schedule::Table table() const { return checked_schedule(request()); }
};

/// Throws `ConfigError` with the schedule's own explanation when the runtime refuses the request.
inline void check_pipeline_split(const PipelineSplit& s) { check_schedule_request(s.request()); }

/// The runtime's GptConfig of a GPT-2 architecture (what `pp::Partition::balanced` cuts).
inline models::GptConfig runtime_gpt_config(const Architecture& a) {
  models::GptConfig c;
  c.layers = static_cast<int>(a.layers);
  c.heads = static_cast<int>(a.heads);
  c.dim = static_cast<int>(a.hidden);
  c.vocab = static_cast<int>(a.vocab);
  c.max_seq = static_cast<int>(a.seq);
  return c;
}

/// The parts of the chunks pipeline rank `rank` holds, in model order.
inline std::vector<models::GptPart> runtime_rank_parts(const Architecture& a,
                                                       const PipelineSplit& s, int rank) {
  const schedule::Table table = s.table();
  detail::require(rank >= 0 && rank < s.stages, "fourway: pipeline rank ", rank, " of ", s.stages);
  const pp::Partition cut =
      pp::Partition::balanced(models::cut_costs(runtime_gpt_config(a)), table.chunks());
  std::vector<models::GptPart> parts;
  for (int c : table.chunks_of(rank)) parts.push_back(cut.part(c));
  return parts;
}

/// Placeholder elements of a part (weights, and as many gradients): what it does not hold.
inline std::int64_t runtime_placeholder_elements(const Architecture& a,
                                                 const models::GptPart& part) {
  const std::int64_t row = a.hidden;  // a 1 x C wte and wpe, split or not
  const bool wte = part.embedding || part.head;
  return (wte ? 0 : row) + (part.embedding ? 0 : row) + (part.head ? 0 : 2);
}

/// The segments `ShardedStrategy<zero_stage>` pads over one chunk under ZeRO-2/3, unit by unit:
/// each unit's elements, the tied wte (in the embedding and in the head) a segment of its own.
inline std::vector<std::vector<std::int64_t>> runtime_chunk_unit_segments(
    const Architecture& a, const TensorSplit& t, const models::GptPart& part) {
  const std::int64_t wte = gpt2_backward_numels(a, t).back();
  const std::vector<std::int64_t> units = runtime_part_units(a, t, part);
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t k = 0; k < units.size(); ++k) {
    const bool tied = (k == 0 && part.embedding) || (k + 1 == units.size() && part.head);
    out.push_back(tied ? std::vector<std::int64_t>{wte, units[k] - wte}
                       : std::vector<std::int64_t>{units[k]});
  }
  return out;
}

/// The segments `ShardedStrategy<zero_stage>` pads over the rank's chunks: every unit under
/// ZeRO-2/3 (the tied wte apart), else the buckets of `bucket_bytes = 0` (one).
inline std::vector<std::int64_t> runtime_pipeline_segments(
    const Architecture& a, int zero_stage, Precision p, const TensorSplit& t,
    const std::vector<models::GptPart>& parts) {
  check_zero_stage(zero_stage);
  std::vector<std::int64_t> units;
  for (const auto& part : parts) {
    if (zero_sharding(zero_stage).shards_grads) {
      for (const auto& unit : runtime_chunk_unit_segments(a, t, part))
        units.insert(units.end(), unit.begin(), unit.end());
    } else {
      const auto whole = runtime_part_units(a, t, part);
      units.insert(units.end(), whole.begin(), whole.end());
    }
  }
  if (zero_sharding(zero_stage).shards_grads) return units;
  std::vector<std::int64_t> segments;
  for (const auto& bucket : plan_buckets(units, 0, working_bytes(p))) {
    std::int64_t s = 0;
    for (int i : bucket) s += units[static_cast<std::size_t>(i)];
    segments.push_back(s);
  }
  return segments;
}

/// ZeRO-2/3 under a pipeline: the most bytes of gathered weights and full gradient buffers held
/// at one moment of the step beside the shards, followed action by action through the rank's
/// row of the schedule (`PipelineStrategy::unit_event`): F gathers each unit in turn (ZeRO-3);
/// BW gathers a unit and binds its full gradients, freeing both before the next; B does the
/// same but leaves the chunk's gradient buffers bound until the chunk's next W, which binds any
/// it lacks and frees them all.
struct PipelineUnitPeak {
  std::int64_t weights = 0;  // bytes, at the moment the two together are largest
  std::int64_t grads = 0;
  std::int64_t most_weights = 0;  // each on its own: its largest over the step
  std::int64_t most_grads = 0;
};
inline PipelineUnitPeak runtime_pipeline_unit_peak(const Architecture& a, Precision p,
                                                   int zero_stage, int dp, const PipelineSplit& s,
                                                   int rank, const TensorSplit& t = {}) {
  const ZeroSharding z = zero_sharding(zero_stage);
  PipelineUnitPeak best;
  if (!z.shards_grads) return best;
  const schedule::Table table = s.table();
  const pp::Partition cut =
      pp::Partition::balanced(models::cut_costs(runtime_gpt_config(a)), table.chunks());
  const std::int64_t w = working_bytes(p);
  // per chunk of this rank: its units' padded bytes (a unit's segments padded alone)
  std::vector<std::vector<std::int64_t>> units(static_cast<std::size_t>(table.chunks()));
  for (int c : table.chunks_of(rank)) {
    for (const auto& unit : runtime_chunk_unit_segments(a, t, cut.part(c))) {
      std::int64_t padded = 0;
      for (std::int64_t seg : unit) padded += ceil_div(seg, dp) * dp;
      units[static_cast<std::size_t>(c)].push_back(padded * w);
    }
  }
  std::vector<char> open(units.size(), 0);
  const auto sum = [](const std::vector<std::int64_t>& v) {
    std::int64_t n = 0;
    for (std::int64_t x : v) n += x;
    return n;
  };
  const auto open_bytes = [&] {
    std::int64_t n = 0;
    for (std::size_t c = 0; c < units.size(); ++c)
      if (open[c]) n += sum(units[c]);
    return n;
  };
  const auto note = [&](std::int64_t weights, std::int64_t grads) {
    if (weights + grads > best.weights + best.grads) {
      best.weights = weights;
      best.grads = grads;
    }
    best.most_weights = std::max(best.most_weights, weights);
    best.most_grads = std::max(best.most_grads, grads);
  };
  using schedule::Op;
  for (const auto& act : table.actions[static_cast<std::size_t>(rank)]) {
    if (!schedule::is_compute(act.op)) continue;
    const auto c = static_cast<std::size_t>(act.chunk);
    const auto& us = units[c];
    if (act.op == Op::backward_weight) {
      open[c] = 1;
      note(0, open_bytes());
      open[c] = 0;
      continue;
    }
    std::int64_t opened = 0;  // B: the chunk's buffers bound so far (last unit first)
    for (std::size_t k = us.size(); k-- > 0;) {
      const std::int64_t gathered = z.shards_params ? us[k] : 0;
      if (act.op == Op::forward) {
        note(gathered, open_bytes());
      } else if (act.op == Op::backward) {
        note(gathered, open_bytes() + us[k]);
      } else {  // B
        opened += us[k];
        note(gathered, open_bytes() + (open[c] ? 0 : opened));
      }
    }
    if (act.op == Op::backward_input) open[c] = 1;
  }
  return best;
}

/// What one rank of a pipeline mesh holds: its blocks, its parameters, its model states.
struct PipelineRankState {
  std::int64_t layers = 0;     // blocks of the rank's chunks
  std::int64_t params = 0;     // parameters the optimizer sees (placeholders not included)
  ModelStateBytes states;      // between steps, as the accountant counts them
  ModelStateBytes in_step;     // during a step, at its fullest (ZeRO-2/3: what the schedule
                               // has open beside the shards, PipelineUnitPeak)
  ModelStateBytes step_peaks;  // during a step, each tag at its own largest
  std::int64_t construct = 0;  // the peak while the strategy is built (bytes, every tag)
};

/// Model-state bytes of pipeline rank `rank` (any tp and dp coordinate: they hold alike) of
/// fourway's `PipelineStrategy<.., Zero = zero_stage>` over `dp` replicas.
inline PipelineRankState runtime_pipeline_rank_state(const Architecture& a, Precision p,
                                                     int zero_stage, int dp, const PipelineSplit& s,
                                                     int rank,
                                                     Optimizer optimizer = Optimizer::adam(),
                                                     const TensorSplit& t = {}) {
  const std::vector<models::GptPart> parts = runtime_rank_parts(a, s, rank);
  PipelineRankState r;
  std::int64_t placeholders = 0;
  for (const auto& part : parts) {
    r.layers += part.end_block - part.first_block;
    for (std::int64_t u : runtime_part_units(a, t, part)) r.params += u;
    placeholders += runtime_placeholder_elements(a, part);
  }
  const std::vector<std::int64_t> segments = runtime_pipeline_segments(a, zero_stage, p, t, parts);
  r.states = model_state_bytes(r.params, p, zero_stage, dp, Padding::per_unit(segments), optimizer);
  r.states.weights += placeholders * working_bytes(p);
  r.states.grads += placeholders * working_bytes(p);
  // During the step ZeRO-0 and 1 hold what they hold between steps (full weights and
  // gradients); ZeRO-2/3 add what the schedule has open beside the shards, at its fullest.
  r.in_step = r.states;
  const std::int64_t w = working_bytes(p);
  const PipelineUnitPeak open = runtime_pipeline_unit_peak(a, p, zero_stage, dp, s, rank, t);
  r.in_step.weights += open.weights;
  r.in_step.grads += open.grads;
  r.step_peaks = r.states;
  r.step_peaks.weights += open.most_weights;
  r.step_peaks.grads += open.most_grads;
  // Construction: under ZeRO 1-3 the chunks are built with their own weights and gradients
  // (2·params·w), which the strategy copies into its flat buffers before they are freed.
  r.construct = r.states.total() + (zero_stage == 0 ? 0 : 2 * r.params * w);
  return r;
}

/// Every pipeline rank's state, rank by rank.
inline std::vector<PipelineRankState> runtime_pipeline_states(
    const Architecture& a, Precision p, int zero_stage, int dp, const PipelineSplit& s,
    Optimizer optimizer = Optimizer::adam(), const TensorSplit& t = {}) {
  std::vector<PipelineRankState> out;
  for (int r = 0; r < s.stages; ++r)
    out.push_back(runtime_pipeline_rank_state(a, p, zero_stage, dp, s, r, optimizer, t));
  return out;
}

/// `MemTag::activations` of one pipeline rank over a step, followed action by action through the
/// rank's row of the schedule table (schedule/generators.hpp), as `pp::Executor` runs it
/// (parallel/pp/executor.hpp), for every schedule. Per (micro-batch, chunk):
///
///   recv_F   the received input, (b, T, C) — this rank's b·T/tp rows under sequence
///            parallelism — until the chunk's backward ends (a chunk that follows another on the
///            same rank, the turn of ZB-V's V, reads its output in place: nothing)
///   F        the chunk's stash: the embedding's output on the first chunk, each block's (its
///            output only when checkpointed), the head's on the last; for a moment the last
///            block's transient above what it keeps (`runtime_block_peak_extra`)
///   BW       frees the stash and the input; a checkpointed block's recomputation holds its
///            stash again for a moment, less the output it replaces and the head already freed
///   B        the split backward: frees the stash and the input but keeps, for W, a copy of every
///            matrix GEMM's operands (layers/weight_grad_queue.hpp): per block the four Linears'
///            input and output gradient, 4·BTC + 12·BTC/tp; on a tp = 1 head the logits' gradient
///            (b·T·Vp, moved from the stash when kept) and ln_f's output (BTC). Its peak is inside
///            a block's backward — the first one's, or when checkpointed the last one's (W's copies
///            of those after it queued, its stash recomputed) — at the block's largest moment,
///            BTC + 4·BTC/tp above its start (the MLP's row-split GEMM: its input and output
///            gradient copied before its output is freed), or 3·BTC + BTC/tp under sequence
///            parallelism (the attention's c_attn: the gathered ln_1 output and dqkv copied; the
///            MLP's column split has freed its gathered input in its own backward)
///   W        frees what B kept
///
/// `kept` is the largest sum at an action's end, `peak` the largest at any moment; `in_flight`
/// the most micro-batches with a stash alive at once. `with_workspace` adds the backward's
/// gradient chain (`MemTag::workspace`) at its largest moment in each block, GELU's backward: the
/// block's incoming gradient, the MLP's two (b, T, 4C/tp) gradients, and under B what W keeps
/// of the MLP's row split by then, less the row split's output already freed — not the
/// gradients still being sent, whose lifetime depends on the peer. With one chunk per rank and
/// fused backwards (gpipe, 1f1b) this is `in_flight` micro-batches' stashes plus one block's
/// transient.
struct PipelineActivation {
  std::int64_t kept = 0;
  std::int64_t peak = 0;
  std::int64_t with_workspace = 0;
  int in_flight = 0;
};

inline PipelineActivation runtime_pipeline_activation(const Architecture& a,
                                                      const GptActivationShape& g,
                                                      const TensorSplit& t, bool sequence_parallel,
                                                      Checkpointing recompute,
                                                      const PipelineSplit& s, int rank) {
  const bool checkpoint = recompute == Checkpointing::full;
  const bool selective = recompute == Checkpointing::selective;
  const schedule::Table table = s.table();
  detail::require(rank >= 0 && rank < s.stages, "fourway: pipeline rank ", rank, " of ", s.stages);
  const pp::Partition cut =
      pp::Partition::balanced(models::cut_costs(runtime_gpt_config(a)), table.chunks());
  const bool tp = t.tp > 1;
  const bool sp = sequence_parallel && tp;
  const std::int64_t w = working_bytes(g.precision);
  const std::int64_t bt = g.batch * g.seq;
  const std::int64_t u = bt * g.dim * w;            // (b, T, C)
  const std::int64_t un = bt * (g.dim / t.tp) * w;  // (b, T, C/tp)
  const std::int64_t rows = std::min(runtime_vocab_rows(a, t), a.vocab);
  const std::int64_t emb = tp ? runtime_tp_embedding_activation_bytes(g, t.tp, sequence_parallel)
                              : runtime_embedding_activation_bytes(g);
  const std::int64_t block = tp ? runtime_tp_block_activation_bytes(g, t.tp, sequence_parallel)
                                : runtime_block_activation_bytes(g);
  const std::int64_t head = tp ? runtime_tp_head_activation_bytes(g, t.tp, sequence_parallel, rows)
                               : runtime_head_activation_bytes(g);
  // what crosses a chunk boundary, and what a checkpointed block keeps: its output, (b·T, C)
  // or this rank's b·T/tp rows under sequence parallelism
  const std::int64_t received = runtime_tp_embedding_activation_bytes(g, t.tp, sequence_parallel);
  // selective: a block keeps its stash less the attention core and GELU's output, holds its
  // whole stash for a moment at the end of its forward, and recomputes them first in its
  // backward (BW or B), which then runs on the whole stash as without recomputation
  const std::int64_t kept_block = checkpoint  ? received
                                  : selective ? block - runtime_block_recomputable_bytes(g, t.tp)
                                              : block;
  const std::int64_t again = selective ? block - kept_block : 0;
  // the split backward: per block what W keeps, and the block's largest moment above its start
  const std::int64_t queue_block = 4 * u + 12 * un;
  const std::int64_t walk = sp ? 3 * u + un : u + 4 * un;
  // activations + workspace at GELU's backward above the block's start, fused and split
  const std::int64_t chain = sp ? 9 * un : 8 * un;
  const std::int64_t chain_split = sp ? u + 13 * un : u + 12 * un;
  const std::int64_t logits = bt * g.vocab * w;  // tp = 1: the padded vocabulary
  const bool fused = g.classifier_chunk > 0;

  struct Chunk {
    std::int64_t input = 0, stash = 0, forward_extra = 0, queue = 0, blocks = 0;
    bool head = false;
  };
  std::vector<Chunk> chunks(static_cast<std::size_t>(table.chunks()));
  for (int c : table.chunks_of(rank)) {
    const models::GptPart part = cut.part(c);
    Chunk& k = chunks[static_cast<std::size_t>(c)];
    k.blocks = part.end_block - part.first_block;
    k.head = part.head;
    k.input = part.embedding || table.rank_of(c - 1) == rank ? 0 : received;
    k.stash = (part.embedding ? emb : 0) + k.blocks * kept_block + (part.head ? head : 0);
    k.forward_extra =
        k.blocks == 0 ? 0
        : selective
            ? std::max<std::int64_t>(block - kept_block +
                                         runtime_block_peak_extra(g, received, block, 0, false) -
                                         (part.head ? head : 0),
                                     0)
            : runtime_block_peak_extra(g, received, block, part.head ? head : 0, checkpoint);
    k.queue = k.blocks * queue_block + (part.head && !tp ? logits + u : 0);
  }
  PipelineActivation r;
  std::int64_t live = 0;
  std::vector<int> chunks_alive(static_cast<std::size_t>(s.micro_batches), 0);
  int alive = 0;  // micro-batches with a stash on this rank
  const auto at = [&](std::int64_t bytes) { r.peak = std::max(r.peak, bytes); };
  const auto at_ws = [&](std::int64_t bytes) {
    r.with_workspace = std::max(r.with_workspace, bytes);
  };
  for (const schedule::Action& x : table.actions[static_cast<std::size_t>(rank)]) {
    using schedule::Op;
    int& n = chunks_alive[static_cast<std::size_t>(x.micro_batch)];
    switch (x.op) {
      case Op::recv_activation: live += received; break;
      case Op::forward: {
        const Chunk& k = chunks[static_cast<std::size_t>(x.chunk)];
        at(live + k.stash + k.forward_extra);
        live += k.stash;
        if (n++ == 0) r.in_flight = std::max(r.in_flight, ++alive);
        break;
      }
      case Op::backward:
      case Op::backward_input: {
        const Chunk& k = chunks[static_cast<std::size_t>(x.chunk)];
        std::int64_t now = live;
        if (x.op == Op::backward) {
          if (checkpoint && k.blocks > 0)
            at(now - (k.head ? head : 0) + runtime_block_peak_extra(g, received, block, 0, true) -
               received);
          now -= k.head ? head : 0;
          for (std::int64_t i = 0; i < k.blocks; ++i) {  // last block first
            at(now + again);
            at_ws(now + (checkpoint ? block - received : again) + chain);
            now -= kept_block;
          }
        } else {
          if (k.head && !tp) {  // the logits' gradient (a new buffer when fused) and ln_f's copy
            at(now + (fused ? logits : 0) + u);
            now += logits + u - head;
          } else if (k.head) {  // the head's backward frees its stash
            now -= head;
          }
          for (std::int64_t i = 0; i < k.blocks; ++i) {  // last block first
            if (checkpoint) {  // its output freed, its stash recomputed, then kept for W
              at(now - received + block + walk);
              at_ws(now - received + block + chain_split);
              now += queue_block - received;
            } else {  // selective: the recomputable part back first
              at(now + again + walk);
              at_ws(now + again + chain_split);
              now += queue_block - kept_block;
            }
          }
        }
        live += (x.op == Op::backward_input ? k.queue : 0) - k.stash - k.input;
        if (--n == 0) --alive;
        break;
      }
      case Op::backward_weight: live -= chunks[static_cast<std::size_t>(x.chunk)].queue; break;
      default: break;
    }
    r.kept = std::max(r.kept, live);
    at(live);
  }
  r.with_workspace = std::max(r.with_workspace, r.peak);
  return r;
}

/// The bytes one rank of pipeline rank `rank` sends in one step, per group, as the `Counting`
/// decorator counts them (comm/counting.hpp: ring bytes of collectives, payload of sends), for
/// every schedule (one chunk per rank, interleaved's v, ZB-V's two), with or without sequence
/// parallelism and activation checkpointing (`recompute`: every block recomputed); `g` is one
/// micro-batch (b sequences of T tokens) of one replica.
///
///   tp    what the rank's chunks hold (`runtime_tensor_parallel_bytes`: 4 all-reduce
///         equivalents of b·T·C per block, 6 when recomputed, one for the embedding's output,
///         one for the LM head's input gradient and the loss's b·T fp32 maxima and b·T
///         (Σ exp, target logit) pairs; sequence parallel: the LayerNorms' gains and biases);
///         per step the gradient norm's double
///   pp    per micro-batch and chunk, the activation sent forward when the next chunk lives on
///         another rank and its gradient sent back when the previous one does (b·T/tp rows under
///         sequence parallelism; no header: the table knows every message's size); per step 16 B
///         of step scalars (loss and Σg², all-reduced over the stages)
///   tie   the ranks of the first and the last chunk all-reduce the tied wte's gradient slice
///         (Vp/tp rows; under ZeRO-2/3 its reduced shard, 1/dp of it padded) — nothing when one
///         rank holds both ends (ZB-V)
///   dp    ZeRO 0: every gradient all-reduced once per step, and the loss's double; ZeRO 1:
///         one reduce-scatter and one all-gather of the padded segments per step; ZeRO 2-3:
///         every unit reduce-scattered after each of its M backwards, and the updated weights
///         all-gathered once (ZeRO-2) or every unit gathered for each of its 2M forwards and
///         backwards (ZeRO-3); and the loss and Σg² (16 B)
struct PipelineRankTraffic {
  double tp = 0;
  double pp = 0;
  double tie = 0;
  DataParallelBytes dp;
};

inline PipelineRankTraffic runtime_pipeline_traffic(const Architecture& a,
                                                    const GptActivationShape& g, int zero_stage,
                                                    int dp, const PipelineSplit& s, int rank,
                                                    const TensorSplit& t = {},
                                                    bool sequence_parallel = false,
                                                    bool recompute = false) {
  const schedule::Table table = s.table();
  detail::require(!sequence_parallel || t.tp > 1,
                  "fourway: sequence parallelism needs a tensor-parallel split (tp > 1)");
  const std::vector<models::GptPart> parts = runtime_rank_parts(a, s, rank);
  const PipelineRankState state =
      runtime_pipeline_rank_state(a, g.precision, zero_stage, dp, s, rank, Optimizer::adam(), t);
  const double w = static_cast<double>(working_bytes(g.precision));
  const double m = static_cast<double>(s.micro_batches);
  const double act = static_cast<double>(g.batch * g.seq * g.dim) * w /
                     (sequence_parallel ? static_cast<double>(t.tp) : 1.0);
  const int last_chunk = table.chunks() - 1;
  bool embedding = false, head = false;
  for (const auto& part : parts) {
    embedding = embedding || part.embedding;
    head = head || part.head;
  }
  PipelineRankTraffic r;
  const ActivationShape xs{static_cast<double>(g.seq), static_cast<double>(g.batch),
                           static_cast<double>(g.dim), state.layers};
  r.tp = runtime_tensor_parallel_bytes(xs, t.tp, sequence_parallel, g.precision, recompute,
                                       s.micro_batches, embedding, head);
  if (s.stages > 1) {
    double sends = 0;
    for (int c : table.chunks_of(rank)) {
      if (c < last_chunk && table.rank_of(c + 1) != rank) sends += 1;  // the activation
      if (c > 0 && table.rank_of(c - 1) != rank) sends += 1;           // its gradient
    }
    r.pp = m * sends * act + ring_bytes_sent(Collective::all_reduce, 16.0, s.stages);
    const int first_rank = table.rank_of(0), last_rank = table.rank_of(last_chunk);
    if (first_rank != last_rank && (rank == first_rank || rank == last_rank)) {
      std::int64_t tied = gpt2_backward_numels(a, t).back();  // wte, as the runtime holds it
      if (zero_sharding(zero_stage).shards_grads) tied = ceil_div(tied, dp);
      r.tie = ring_bytes_sent(Collective::all_reduce, static_cast<double>(tied) * w, 2);
    }
  }
  if (dp > 1) {
    const double n = dp;
    const ZeroSharding z = zero_sharding(zero_stage);
    if (!z.shards_optimizer_state) {
      r.dp.all_reduce =
          ring_bytes_sent(Collective::all_reduce, static_cast<double>(state.params) * w, dp) +
          ring_bytes_sent(Collective::all_reduce, 8.0, dp);
    } else {
      const auto shard = static_cast<double>(shard_elements(
          state.params, dp,
          Padding::per_unit(runtime_pipeline_segments(a, zero_stage, g.precision, t, parts))));
      const double reduces = z.shards_grads ? m : 1.0;
      const double gathers = z.shards_params ? 2.0 * m : 1.0;
      r.dp.reduce_scatter = reduces * shard * (n - 1) * w;
      r.dp.all_gather = gathers * shard * (n - 1) * w;
      r.dp.all_reduce = ring_bytes_sent(Collective::all_reduce, 16.0, dp);
    }
  }
  return r;
}

}  // namespace fourway::plan
