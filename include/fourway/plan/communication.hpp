//! Communication per step per rank: bytes each rank sends, and the time of ring collectives under
//! an alpha-beta model (Thakur, Rabenseifner, Gropp 2005, "Optimization of Collective
//! Communication Operations in MPICH"; Patarasuk & Yuan 2009 for the bandwidth-optimal ring).
//!
//! A ring over N ranks of a buffer of n bytes: all-reduce sends 2n(N−1)/N per rank in 2(N−1)
//! steps; reduce-scatter and all-gather send n(N−1)/N in N−1 steps; time = steps·α + sent/β.
//! A group whose ranks share a node runs at NVLink speed, any other at InfiniBand speed (its ring
//! crosses a node boundary, and that link is the bottleneck). Ranks are laid out as Megatron does
//! (docs/design.md): tensor-parallel innermost, then context-parallel, pipeline, data-parallel
//! outermost — Llama 3's order [TP, CP, PP, DP] (Dubey et al. 2024, §3.3.2).
//!
//! Per-step volumes (Rajbhandari et al. 2020 §7 for ZeRO; Shoeybi et al. 2019 and Korthikanti et
//! al. 2022 §4.2.2 for tensor and sequence parallelism; Narayanan et al. 2021 for pipelines):
//!   DP (ZeRO-0)   one all-reduce of the gradients per step        2Ψ(N−1)/N
//!   ZeRO-1        reduce-scatter of gradients + all-gather of updated parameters, once per step
//!   ZeRO-2        a reduce-scatter per micro-batch (gradients live only as shards) + all-gather
//!   ZeRO-3        per micro-batch: all-gather in forward, again in backward, reduce-scatter
//!                 (3Ψ(N−1)/N per micro-batch: 1.5× data parallelism)
//!   TP            per layer and micro-batch two all-reduces of b·s·h forward, two backward (one
//!                 more forward under full recomputation: +2); sequence parallelism turns each into
//!                 a reduce-scatter + all-gather of the same volume. The vocabulary-parallel
//!                 embedding adds one all-reduce of b·s·h (forward), the LM head one (the
//!                 gradient of its input, backward), the loss three of b·s floats.
//!   PP            per micro-batch and boundary one activation b·s·h forward, one gradient back
//!                 (/t under sequence parallelism).
//!   CP (ring)     per layer and micro-batch, each rank passes its K and V block (b·s/c tokens of
//!                 the key/value width / t) c − 1 times around the ring forward, and K, V and
//!                 their gradients backward (3 passes; 4 when the attention is recomputed) —
//!                 Liu et al. 2023, "Ring Attention with Blockwise Transformers"; Megatron-Core's
//!                 context parallelism. Each block's transfer overlaps the previous block's
//!                 attention, so only what the layer's attention compute cannot cover is exposed.
//!   CP (Ulysses)  per layer and micro-batch four all-to-alls forward — Q, K, V from sequence- to
//!                 head-sharded, the output back — and their four gradients backward (Jacobs et
//!                 al. 2023, DeepSpeed-Ulysses §3); an all-to-all over c ranks sends (c − 1)/c of
//!                 the local tensor in c − 1 steps, and nothing overlaps it.
//! Ψ here is the padded element count of the rank's flat buffer, times the working-precision size.
#pragma once

#include <cstdint>
#include <string_view>

#include "fourway/mesh/policies.hpp"
#include "fourway/plan/hardware.hpp"
#include "fourway/plan/model_state.hpp"

namespace fourway::plan {

enum class Collective : std::uint8_t { all_reduce, reduce_scatter, all_gather };

/// Bytes one rank sends in a ring collective over `n` ranks of a `bytes`-byte buffer.
constexpr double ring_bytes_sent(Collective c, double bytes, int n) {
  detail::require(n >= 1, "fourway: a collective over ", n, " ranks");
  const double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return c == Collective::all_reduce ? 2.0 * bytes * f : bytes * f;
}

/// Ring steps of a collective over `n` ranks.
constexpr int ring_steps(Collective c, int n) {
  return c == Collective::all_reduce ? 2 * (n - 1) : n - 1;
}

/// Seconds of one ring collective: steps·α + bytes sent / β.
constexpr double ring_seconds(Collective c, double bytes, int n, Link link) {
  if (n <= 1) return 0.0;
  return ring_steps(c, n) * link.latency_us * 1e-6 +
         ring_bytes_sent(c, bytes, n) / (link.bandwidth_gbs * 1e9);
}

/// Seconds of one point-to-point transfer.
constexpr double p2p_seconds(double bytes, Link link) {
  return link.latency_us * 1e-6 + bytes / (link.bandwidth_gbs * 1e9);
}

/// Which link class each axis of a dp × pp × cp × tp mesh (tp innermost) runs over.
struct AxisLinks {
  bool tp_in_node = true;
  bool pp_in_node = true;
  bool dp_in_node = true;
  bool cp_in_node = true;
};

constexpr AxisLinks axis_links(int tp, int pp, int dp, int gpus_per_node, int cp = 1) {
  auto inside = [&](int span) { return span <= gpus_per_node && gpus_per_node % span == 0; };
  return AxisLinks{inside(tp), inside(tp * cp * pp), inside(tp * cp * pp * dp), inside(tp * cp)};
}

/// Data-parallel collectives of one step of one rank holding `padded_params` elements (its flat
/// buffer padded to a multiple of `dp`) with `micro_batches` micro-batches.
struct DataParallelTraffic {
  double overlappable_bytes = 0;  // sent while forward/backward compute runs
  double exposed_bytes = 0;       // sent after the optimizer step (ZeRO-1/2 parameter all-gather)
  double overlappable_seconds = 0;
  double exposed_seconds = 0;
  [[nodiscard]] constexpr double bytes() const { return overlappable_bytes + exposed_bytes; }
  [[nodiscard]] constexpr double seconds() const { return overlappable_seconds + exposed_seconds; }
};

constexpr DataParallelTraffic data_parallel_traffic(std::int64_t padded_params, Precision p,
                                                    int zero_stage, int dp,
                                                    std::int64_t micro_batches, Link link) {
  check_zero_stage(zero_stage);
  DataParallelTraffic t;
  if (dp <= 1) return t;
  const double buf = static_cast<double>(padded_params) * static_cast<double>(working_bytes(p));
  const double m = static_cast<double>(micro_batches);
  auto add = [&](Collective c, double count, bool overlappable) {
    const double b = count * ring_bytes_sent(c, buf, dp);
    const double s = count * ring_seconds(c, buf, dp, link);
    if (overlappable) {
      t.overlappable_bytes += b;
      t.overlappable_seconds += s;
    } else {
      t.exposed_bytes += b;
      t.exposed_seconds += s;
    }
  };
  const ZeroSharding z = zero_sharding(zero_stage);
  if (!z.shards_optimizer_state) {
    add(Collective::all_reduce, 1, true);
  } else if (!z.shards_params) {
    // Gradients reduce-scattered once a step, or every micro-batch when they are sharded; the
    // updated shards all-gathered after the step.
    add(Collective::reduce_scatter, z.shards_grads ? m : 1, true);
    add(Collective::all_gather, 1, false);
  } else {
    add(Collective::all_gather, 2 * m, true);
    add(Collective::reduce_scatter, m, true);
  }
  return t;
}

/// Bytes sent and seconds spent by one rank in one step on one axis.
struct Traffic {
  double bytes = 0;
  double seconds = 0;
};

/// One micro-batch of b sequences of s tokens, hidden h, on a stage of `layers` blocks.
struct ActivationShape {
  double s = 0;
  double b = 0;
  double h = 0;
  std::int64_t layers = 0;
};

/// Tensor-parallel collectives of one micro-batch on one stage (multiply by the micro-batches
/// of a step). `first`/`last`: the stage holds the vocabulary-parallel embedding / loss.
constexpr Traffic tensor_parallel_traffic_per_micro_batch(ActivationShape x, int tp, Precision p,
                                                          bool full_recompute, bool first,
                                                          bool last, Link link) {
  Traffic t;
  if (tp <= 1) return t;
  const double act = x.s * x.b * x.h * static_cast<double>(working_bytes(p));
  const double per_layer = full_recompute ? 6.0 : 4.0;  // all-reduce equivalents
  const double n_act =
      per_layer * static_cast<double>(x.layers) + (first ? 1.0 : 0.0) + (last ? 1.0 : 0.0);
  t.bytes = n_act * ring_bytes_sent(Collective::all_reduce, act, tp);
  t.seconds = n_act * ring_seconds(Collective::all_reduce, act, tp, link);
  if (last) {  // max, sum of exponentials and target logit of every row, fp32
    const double loss = x.s * x.b * 4.0;
    t.bytes += 3.0 * ring_bytes_sent(Collective::all_reduce, loss, tp);
    t.seconds += 3.0 * ring_seconds(Collective::all_reduce, loss, tp, link);
  }
  return t;
}

/// Point-to-point traffic of stage `stage` of `stages` for one micro-batch: the activation it
/// sends forward (unless last) and the gradient it sends back (unless first). Under sequence
/// parallelism each tp rank holds and sends 1/t of it. `scatter_gather`: Megatron's
/// scatter/gather optimisation without sequence parallelism (Narayanan et al. 2021, §4.1) — each
/// tp rank sends 1/t of the replicated activation over `link` and the receiving stage
/// all-gathers it over `tp_link`.
constexpr Traffic pipeline_traffic_per_micro_batch(ActivationShape x, int tp,
                                                   bool sequence_parallel, Precision p, int stages,
                                                   int stage, Link link,
                                                   bool scatter_gather = false, Link tp_link = {}) {
  Traffic t;
  if (stages <= 1) return t;
  const double full = x.s * x.b * x.h * static_cast<double>(working_bytes(p));
  const bool split = sequence_parallel || (scatter_gather && tp > 1);
  const double act = split ? full / static_cast<double>(tp) : full;
  const int sends = (stage < stages - 1 ? 1 : 0) + (stage > 0 ? 1 : 0);
  t.bytes = sends * act;
  t.seconds = sends * p2p_seconds(act, link);
  if (scatter_gather && tp > 1 && !sequence_parallel) {
    t.bytes += sends * ring_bytes_sent(Collective::all_gather, full, tp);
    t.seconds += sends * ring_seconds(Collective::all_gather, full, tp, tp_link);
  }
  return t;
}

/// How a context-parallel group shares attention (the other layers are local to the tokens).
enum class ContextKind : std::uint8_t { ring, ulysses };

constexpr std::string_view context_kind_name(ContextKind k) {
  return k == ContextKind::ring ? "ring" : "ulysses";
}

/// One micro-batch's attention on one rank of a context-parallel group: b sequences of s tokens
/// in all (s/c of them local), query width q = heads·head_dim/t and key/value width
/// kv = kv_heads·head_dim/t per tensor-parallel rank, on a stage of `layers` blocks.
struct ContextShape {
  double s = 0;
  double b = 0;
  double q = 0;
  double kv = 0;
  std::int64_t layers = 0;
};

/// Context-parallel traffic of one micro-batch on one stage over a group of `cp`: bytes sent, and
/// the seconds of the transfers before any overlap (the planner hides a ring's behind the
/// attention compute). `recompute`: the attention runs forward again in backward (full or
/// selective recomputation).
constexpr Traffic context_parallel_traffic_per_micro_batch(ContextShape x, int cp, ContextKind k,
                                                           Precision p, bool recompute, Link link) {
  Traffic t;
  if (cp <= 1) return t;
  const double local = x.b * x.s / static_cast<double>(cp) *
                       static_cast<double>(working_bytes(p));  // bytes per unit of width
  const double steps = static_cast<double>(cp - 1);
  const double forwards = recompute ? 2.0 : 1.0;
  const auto layers = static_cast<double>(x.layers);
  if (k == ContextKind::ring) {
    // K and V once per forward; K, V, dK and dV backward: c − 1 point-to-point sends of each
    const double kv_block = 2.0 * x.kv * local;
    const double passes = forwards + 2.0;
    t.bytes = layers * passes * steps * kv_block;
    t.seconds = layers * passes * steps * p2p_seconds(kv_block, link);
  } else {
    // Q, K, V and the output per forward, their gradients backward: all-to-alls of (c − 1)/c
    const double sent = (2.0 * x.q + 2.0 * x.kv) * local * steps / static_cast<double>(cp);
    const double passes = forwards + 1.0;
    t.bytes = layers * passes * sent;
    t.seconds =
        layers * passes * (steps * link.latency_us * 1e-6 + sent / (link.bandwidth_gbs * 1e9));
  }
  return t;
}

/// The bytes one rank of fourway's GPT split over a tensor-parallel group (layers/gpt.hpp) sends in
/// its tensor-parallel group in one step, counted as `Counting` counts them (comm/counting.hpp):
/// per micro-batch 4L + 2 all-reduce equivalents of b·s·h (two per block each way, the
/// embedding's forward and the LM head's input gradient; +2L when every block is recomputed),
/// sequence parallel as all-gather + reduce-scatter pairs of the same volume plus one all-reduce of
/// each LayerNorm's gain and bias gradients (2L + 1 of 2h values); the loss's all-reduces of
/// b·s fp32 maxima and of b·s (Σ exp, target logit) pairs; and per step one all-reduce of the
/// gradient norm's double. A pipeline rank holds x.layers blocks and the embedding and/or the
/// head or neither: only what it holds is counted (the loss and ln_f with the head).
constexpr double runtime_tensor_parallel_bytes(ActivationShape x, int tp, bool sequence_parallel,
                                               Precision p, bool recompute,
                                               std::int64_t micro_batches, bool embedding = true,
                                               bool head = true) {
  if (tp <= 1) return 0.0;
  const double w = static_cast<double>(working_bytes(p));
  const double act = x.s * x.b * x.h * w;
  const auto layers = static_cast<double>(x.layers);
  const double ends = (embedding ? 1.0 : 0.0) + (head ? 1.0 : 0.0);
  double per_mb = (4.0 + (recompute ? 2.0 : 0.0)) * layers + ends;
  per_mb *= ring_bytes_sent(Collective::all_reduce, act, tp);
  if (head) per_mb += ring_bytes_sent(Collective::all_reduce, 3.0 * x.s * x.b * 4.0, tp);
  if (sequence_parallel) {
    per_mb += (2.0 * layers + (head ? 1.0 : 0.0)) *
              ring_bytes_sent(Collective::all_reduce, 2.0 * x.h * w, tp);
  }
  return per_mb * static_cast<double>(micro_batches) +
         ring_bytes_sent(Collective::all_reduce, 8.0, tp);
}

}  // namespace fourway::plan
