//! The planner: per-GPU bytes, communication and step time of one mesh, and the search over every
//! mesh of a cluster for `--recommend`.
//!
//! A plan holds one `StagePlan` per pipeline stage (one rank of that stage: tensor and data
//! parallelism make every rank of a stage alike, up to the fullest vocabulary shard, which is
//! the one counted); the worst stage decides whether it fits. Step time is
//!   (m + p − 1) · max over stages (compute + tensor-parallel + point-to-point time of a
//!   micro-batch)
//!   + data-parallel time not hidden behind compute,
//! where ZeRO-0/1 can hide their gradient collective behind the last micro-batch's backward,
//! ZeRO-2 its reduce-scatters behind every backward, ZeRO-3 everything behind forward and
//! backward, and the parameter all-gather after a ZeRO-1/2 optimizer step is never hidden.
//!
//! Memory per rank is the peak of the whole run, not of the step alone: `total()` is the largest
//! of construction, checkpoint load, every training step and checkpoint save. With fourway's
//! runtime the three phases outside the step hold the model states and nothing else — deferred
//! construction materialises only the rank's share, `--init-from` reads only the rank's byte
//! ranges and `--save` writes them in place through bounded host buffers, gathering nothing
//! (docs/memory.md) — so the step decides; the planner says so rather than assuming it.
//!
//! The recommendation follows the seed's honest order: among the meshes whose estimated step is
//! within `prefer_within` of the fastest, the one with the fewest of {tensor, pipeline}
//! parallelism wins — mixed precision, ZeRO/FSDP and checkpointing come first.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fourway/core/error.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/mesh/policies.hpp"
#include "fourway/plan/activation.hpp"
#include "fourway/plan/architecture.hpp"
#include "fourway/plan/communication.hpp"
#include "fourway/plan/hardware.hpp"
#include "fourway/plan/model_state.hpp"
#include "fourway/plan/runtime_activation.hpp"
#include "fourway/plan/runtime_model_state.hpp"
#include "fourway/plan/runtime_pipeline_state.hpp"
#include "fourway/plan/step_time.hpp"

namespace fourway::plan {

/// The model: an architecture, or only a parameter count (model states, no activations or time).
struct Model {
  std::optional<Architecture> arch;
  std::int64_t params = 0;  // used when there is no architecture

  [[nodiscard]] std::int64_t total_params() const {
    return arch ? plan::total_params(*arch) : params;
  }
  [[nodiscard]] std::string name() const { return arch ? std::string(arch->name) : "params-only"; }
};

struct Cluster {
  Hardware hw;
  int gpus = 0;
};

struct Strategy {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero = 0;
  std::int64_t micro_batch = 1;    // sequences per micro-batch per data-parallel replica
  std::int64_t micro_batches = 1;  // per step per replica (gradient accumulation / pipeline)
  Schedule schedule = Schedule::one_f_one_b;
  Precision precision = Precision::bf16;
  Checkpointing checkpointing = Checkpointing::none;
  bool sequence_parallel = false;
  int virtual_stages = 1;  // chunks per pipeline rank of the interleaved schedule
  int cp = 1;              // context parallelism: each rank holds seq/cp tokens of a sequence
  ContextKind cp_kind = ContextKind::ring;

  [[nodiscard]] int gpus() const { return dp * tp * pp * cp; }
  /// The ranks that hold the same parameters and reduce their gradients together: data and
  /// context parallelism (ZeRO shards over both, as Megatron's distributed optimizer does).
  [[nodiscard]] int replicas() const { return dp * cp; }
  [[nodiscard]] std::int64_t global_batch() const { return micro_batch * micro_batches * dp; }
};

/// What a `Mesh<Policies...>` leaves to the user: the per-replica micro-batch, precision,
/// checkpointing, sequence parallelism, and the micro-batch count when the mesh has no pipeline
/// (gradient accumulation) or a `Pipeline<S, fw::dynamic>`.
struct MeshRun {
  std::int64_t micro_batch = 1;
  std::int64_t micro_batches = 0;  // 0: take the Pipeline's (1 without a pipeline)
  Precision precision = Precision::bf16;
  Checkpointing checkpointing = Checkpointing::none;
  bool sequence_parallel = false;
};

namespace detail {
template <class Tag>
constexpr Schedule schedule_of_tag() {
  if constexpr (std::is_same_v<Tag, GPipe>) {
    return Schedule::gpipe;
  } else {
    static_assert(std::is_same_v<Tag, OneFOneB>,
                  "fourway: the planner knows the pipeline schedules fw::GPipe and fw::OneFOneB");
    return Schedule::one_f_one_b;
  }
}
}  // namespace detail

/// The planner's `Strategy` read off the runtime's mesh: the policy tags fix the ZeRO stage
/// (`DataParallel` 0, `Sharded<S>` S), the micro-batches and schedule of `Pipeline<S, M, Sched>`;
/// the constructed mesh fixes tp, pp and dp (its dynamic degrees resolved). So a plan and a run
/// share one description: `plan::make_plan(model, cluster, plan::strategy_of(mesh, run))`.
template <class... Policies>
Strategy strategy_of(const Mesh<Policies...>& mesh, const MeshRun& run = {}) {
  using M = Mesh<Policies...>;
  using Dp = typename M::template policy_on<Axis::dp>;
  using Pp = typename M::template policy_on<Axis::pp>;
  Strategy s;
  s.tp = mesh.tp();
  s.pp = mesh.pp();
  s.dp = mesh.dp();
  if constexpr (!std::is_void_v<Dp>) s.zero = Dp::stage;
  s.micro_batch = run.micro_batch;
  s.micro_batches = run.micro_batches > 0 ? run.micro_batches : 1;
  if constexpr (!std::is_void_v<Pp>) {
    s.schedule = detail::schedule_of_tag<typename Pp::schedule>();
    if constexpr (Pp::micro_batches != dynamic) {
      check<ConfigError>(run.micro_batches <= 0 || run.micro_batches == Pp::micro_batches,
                         "fourway: the mesh's Pipeline runs ", Pp::micro_batches,
                         " micro-batches but MeshRun::micro_batches is ", run.micro_batches,
                         "; leave it 0 or make them agree");
      s.micro_batches = Pp::micro_batches;
    } else {
      check<ConfigError>(run.micro_batches > 0,
                         "fourway: the mesh's Pipeline<S, fw::dynamic> leaves the micro-batch "
                         "count to run time; set MeshRun::micro_batches");
    }
  }
  check<ConfigError>(run.micro_batch >= 1, "fourway: MeshRun::micro_batch is ", run.micro_batch,
                     "; a micro-batch holds at least one sequence");
  s.precision = run.precision;
  s.checkpointing = run.checkpointing;
  s.sequence_parallel = run.sequence_parallel;
  return s;
}

/// Whose bytes a plan counts: the published models (ZeRO's states, Korthikanti's activations) for
/// any mesh, or fourway's own runtime exactly (its padding per bucket or unit, its GPT-2 stash) for
/// the meshes fourway runs: GPT-2 over tp x pp x dp with ZeRO 0-3, full checkpointing of whole
/// blocks or none. Pipeline meshes get one `StagePlan` per pipeline rank with that rank's chunks
/// (plan/runtime_pipeline_state.hpp).
enum class Footprint : std::uint8_t { published, fourway };

/// The model FLOPs utilisation fourway has measured, the default of `Options::mfu`: a plan
/// assumes what fourway has shown, not a target it has not met. fourway-train-cuda's GPT-2 124M
/// bf16 step (B 8, T 1024) on one H200 ran at 271 833 tokens/s = 23.6% of the dense bf16 peak
/// (stop 38, docs/BENCHMARKS.md; docs/gpu-status.md). Larger models on more GPUs may do better or
/// worse: `--mfu` or `--tflops` give the planner a figure of your own.
inline constexpr double measured_mfu = 0.236;
/// Where `measured_mfu` comes from, as the plan's output names it.
inline constexpr const char* measured_mfu_source =
    "fourway's measured MFU: fourway-train-cuda, GPT-2 124M bf16 on one H200";

struct Options {
  Footprint footprint = Footprint::published;
  std::int64_t bucket_bytes = 25LL << 20;  // fourway's gradient buckets (ShardedOptions)
  int vocab_alignment = 1;  // fourway's vocabulary padding (GptConfig / tp::TpOptions; CUDA: 128)
  Optimizer optimizer = Optimizer::adam();
  double mfu = measured_mfu;       // achievable fraction of the dense peak
  double achievable_tflops = 0.0;  // > 0 overrides mfu · peak
  // the attention core's achievable fraction of the peak when it differs from the GEMMs' (an
  // attention kernel rarely runs as fast as a large GEMM); 0: the same rate as the rest
  double attention_mfu = 0.0;
  // fraction of the compute window a data-parallel collective can hide behind
  double overlap = 1.0;
  double tp_overlap = 0.0;  // fraction of tensor-parallel collective time hidden behind the GEMMs
                            // (Megatron-Core's --tp-comm-overlap; fourway does not: 0)
  // what the attention stores and streams (plan/step_time.hpp); the default is Korthikanti's model
  AttentionKernel attention = AttentionKernel::published;
  // Megatron's scatter/gather of pipeline sends without sequence parallelism: 1/t over the
  // pipeline's link, an all-gather inside the tensor-parallel group
  bool pp_scatter_gather = false;
  double headroom = 0.05;  // of GPU memory kept free: CUDA context, fragmentation, buffers
};

/// One rank of one pipeline stage.
struct StagePlan {
  int stage = 0;
  std::int64_t layers = 0;
  std::int64_t params = 0;  // held by this rank before ZeRO sharding
  ModelStateBytes states;
  std::int64_t in_flight = 0;     // micro-batches whose activations are alive at the peak
  double activations = 0;         // stored activations of all in-flight micro-batches
  double recompute_working = 0;   // one layer rebuilt during backward
  double zero3_gathered = 0;      // ZeRO-3: two gathered units + one unit's full gradients
                                  // (fourway pipelines: every unit and full gradients, all step)
  double zero2_buckets = 0;       // ZeRO-2 (fourway): full gradients of the head's buckets
                                  // (fourway pipelines: of every parameter, all step)
  double backward_workspace = 0;  // fourway pipelines: the backward's gradient chain above the
                                  // activations' peak (plan/runtime_pipeline_state.hpp)
  // Peaks of the phases outside a step (modelled): construction, checkpoint load and save.
  double construct_peak = 0;
  double load_peak = 0;
  double save_peak = 0;
  // One micro-batch on this rank, as it lies on the step's critical path:
  double compute_per_micro_batch = 0;   // the arithmetic at the achievable rate
  double memory_per_micro_batch = 0;    // an unfused attention's score traffic
  double tensor_per_micro_batch = 0;    // tensor-parallel collectives not hidden (tp_overlap)
  double pipeline_per_micro_batch = 0;  // point-to-point sends
  double context_per_micro_batch = 0;   // context-parallel transfers the attention cannot cover
  double seconds_per_micro_batch = 0;   // their sum
  Traffic tensor_parallel;              // per step
  Traffic pipeline;                     // per step
  Traffic context_parallel;             // per step, before overlap
  DataParallelTraffic data_parallel;

  /// The peak of one training step.
  [[nodiscard]] double step_peak() const {
    return static_cast<double>(states.total()) + activations + recompute_working + zero3_gathered +
           zero2_buckets + backward_workspace;
  }
  /// The peak of the whole run: construction, load, every step, save.
  [[nodiscard]] double total() const {
    return std::max({step_peak(), construct_peak, load_peak, save_peak});
  }
  [[nodiscard]] double comm_bytes() const {
    return tensor_parallel.bytes + pipeline.bytes + context_parallel.bytes + data_parallel.bytes();
  }
};

struct StepTime {
  double compute_s = 0;   // m/(1 − bubble) micro-batch slots, compute only
  double memory_s = 0;    // an unfused attention's score traffic on the critical path
  double tensor_s = 0;    // tensor-parallel collectives on the critical path
  double pipeline_s = 0;  // point-to-point transfers on the critical path
  double context_s = 0;   // context-parallel transfers on the critical path
  double data_s = 0;      // data-parallel time not hidden
  double bubble = 0;      // the schedule's idle fraction, (p − 1)/(m + p − 1) for 1F1B
  double total_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs (6Ψ + attention, no recomputation) / (time · peak)
};

struct Plan {
  Model model;
  Cluster cluster;
  Strategy strategy;
  Options options;
  std::vector<StagePlan> stages;
  int worst_stage = 0;
  double memory_bytes = 0;    // per GPU
  double reserved_bytes = 0;  // headroom
  bool fits = false;
  std::optional<StepTime> time;  // with an architecture only

  [[nodiscard]] const StagePlan& worst() const {
    return stages[static_cast<std::size_t>(worst_stage)];
  }
  [[nodiscard]] double usable_bytes() const { return memory_bytes - reserved_bytes; }
  /// Model-state bytes per GPU: the largest over the pipeline ranks (every rank of a stage holds
  /// alike).
  [[nodiscard]] ModelStateBytes states_per_gpu() const {
    ModelStateBytes m = stages.front().states;
    for (const StagePlan& sp : stages)
      if (sp.states.total() > m.total()) m = sp.states;
    return m;
  }
};

/// How fourway's `PipelineStrategy` runs the strategy's pipeline.
inline PipelineSplit pipeline_split(const Strategy& s) {
  return PipelineSplit{s.pp, s.schedule, s.micro_batches, s.virtual_stages};
}

/// Whether context parallelism of degree `cp` can split the model's sequences: the ring's causal
/// load balance cuts each into 2·cp chunks (rank r holds chunks r and 2cp − 1 − r, as
/// Megatron-Core does); Ulysses gives each rank heads/(tp·cp) query heads and kv_heads/(tp·cp)
/// key/value heads.
inline bool splits_sequences(const Architecture& a, int tp, int cp, ContextKind k) {
  if (cp <= 1) return true;
  return k == ContextKind::ring ? a.seq % (2 * static_cast<std::int64_t>(cp)) == 0
                                : (a.heads / tp) % cp == 0 && (a.kv_heads / tp) % cp == 0;
}

/// `splits_sequences`, or a `ConfigError` naming the numbers and the fix.
inline void check_context_parallel(const Architecture& a, int tp, int cp, ContextKind k) {
  if (splits_sequences(a, tp, cp, k)) return;
  if (k == ContextKind::ring) {
    detail::require(
        false, "fourway: ring context ", "parallelism ", cp, " cuts each sequence into 2 × ", cp,
        " = ", 2 * cp, " chunks (rank r holds chunks r and ", 2 * cp - 1,
        " − r, balancing the causal mask), but the sequence of ", a.seq,
        " tokens does not divide by ", 2 * cp, "; choose cp with 2·cp dividing ", a.seq);
  } else {
    detail::require(false, "fourway: Ulysses context parallelism ", cp,
                    " hands each rank whole heads, ", "but tensor parallelism ", tp, " leaves ",
                    a.heads / tp, " query and ", a.kv_heads / tp,
                    " key/value heads per rank, which ", cp,
                    " does not divide; use the ring (--cp-kind ring) or a cp dividing both");
  }
}

/// Throws `ConfigError` naming the numbers and the fix when the mesh cannot exist.
inline void validate(const Model& model, const Cluster& cluster, const Strategy& s,
                     const Options& o = {}) {
  detail::require(cluster.gpus >= 1, "fourway: ", cluster.gpus,
                  " GPUs; a plan needs at least one (--gpus N)");
  detail::require(cluster.hw.gpus_per_node >= 1, "fourway: ", cluster.hw.gpus_per_node,
                  " GPUs per node; need at least one (--gpus-per-node N)");
  detail::require(cluster.hw.memory_gb > 0, "fourway: GPU memory ", cluster.hw.memory_gb,
                  " GB; give --gpu-mem GB or a --hw preset");
  detail::require(s.dp >= 1 && s.tp >= 1 && s.pp >= 1, "fourway: degrees dp=", s.dp, " tp=", s.tp,
                  " pp=", s.pp, " must all be >= 1");
  detail::require(s.cp >= 1, "fourway: context-parallel degree ", s.cp, " must be >= 1");
  detail::require(s.gpus() == cluster.gpus, "fourway: dp × tp × pp", s.cp > 1 ? " × cp" : "", " = ",
                  s.dp, " × ", s.tp, " × ", s.pp,
                  s.cp > 1 ? fourway::detail::cat(" × ", s.cp) : std::string(), " = ", s.gpus(),
                  " but the cluster has ", cluster.gpus, " GPUs; choose degrees whose product is ",
                  cluster.gpus);
  check_zero_stage(s.zero);
  detail::require(s.micro_batch >= 1, "fourway: micro-batch size ", s.micro_batch, " must be >= 1");
  detail::require(s.micro_batches >= 1, "fourway: ", s.micro_batches,
                  " micro-batches per step; need at least one");
  detail::require(o.mfu > 0 && o.mfu <= 1, "fourway: achievable fraction of peak ", o.mfu,
                  " must be in (0, 1]");
  detail::require(o.attention_mfu >= 0 && o.attention_mfu <= 1,
                  "fourway: the attention's achievable fraction of peak ", o.attention_mfu,
                  " must be in (0, 1] (or 0: the rest's rate)");
  detail::require(o.overlap >= 0 && o.overlap <= 1, "fourway: overlap ", o.overlap,
                  " must be in [0, 1]");
  detail::require(o.headroom >= 0 && o.headroom < 1, "fourway: headroom ", o.headroom,
                  " must be in [0, 1)");
  detail::require(o.tp_overlap >= 0 && o.tp_overlap <= 1, "fourway: tensor-parallel overlap ",
                  o.tp_overlap, " must be in [0, 1]");
  detail::require(
      o.attention != AttentionKernel::unfused || cluster.hw.memory_tbs > 0,
      "fourway: an unfused attention is timed at the memory bandwidth, and the GPU's is ",
      cluster.hw.memory_tbs, " TB/s; give --hbm-tbs X or a --hw preset");
  if (s.cp > 1) {
    detail::require(model.arch.has_value(), "fourway: context parallelism ", s.cp,
                    " splits sequences; give an architecture (--gpt2, --llama or --layers ...), "
                    "not --params");
    detail::require(o.footprint == Footprint::published || s.cp_kind == ContextKind::ring,
                    "fourway: --footprint fourway models the meshes fourway's runtime runs, and "
                    "its context parallelism is the ring (cp ",
                    s.cp, "); plan Ulysses with --footprint published");
  }
  if (model.arch) {
    validate(*model.arch, s.tp);
    check_context_parallel(*model.arch, s.tp, s.cp, s.cp_kind);
    (void)layers_on_stage(model.arch->layers, s.pp, 0);
    if (o.footprint == Footprint::fourway) {
      detail::require(model.arch->family == Family::gpt2, "fourway: --footprint fourway models ",
                      "fourway's GPT-2; ", model.arch->name,
                      " is not one (use --footprint published)");
      if (s.pp > 1) check_pipeline_split(pipeline_split(s));
      detail::require(o.vocab_alignment >= 1, "fourway: vocabulary alignment ", o.vocab_alignment,
                      " must be >= 1 (--vocab-align A)");
      detail::require(o.bucket_bytes >= 0, "fourway: bucket size ", o.bucket_bytes,
                      " B must be >= 0");
    }
  } else {
    detail::require(o.footprint == Footprint::published, "fourway: --footprint fourway needs ",
                    "an architecture (--gpt2 SIZE or --layers ...), not --params");
    detail::require(model.params >= 1, "fourway: the model has ", model.params,
                    " parameters; give --params N or an architecture");
  }
}

namespace detail {
inline double achievable_flops(const Hardware& hw, Precision p, const Options& o) {
  const double tflops = o.achievable_tflops > 0 ? o.achievable_tflops : o.mfu * hw.peak_tflops(p);
  return tflops * 1e12;
}

/// The attention core's rate: `attention_mfu` of the peak, or the rest's.
inline double achievable_attention_flops(const Hardware& hw, Precision p, const Options& o) {
  return o.attention_mfu > 0 ? o.attention_mfu * hw.peak_tflops(p) * 1e12
                             : achievable_flops(hw, p, o);
}
}  // namespace detail

/// Bytes, traffic and time of one mesh. Throws `ConfigError` when the mesh cannot exist.
inline Plan make_plan(const Model& model, const Cluster& cluster, const Strategy& s,
                      const Options& o = {}) {
  validate(model, cluster, s, o);
  Plan plan{model, cluster, s, o, {}, 0, cluster.hw.memory_gb * 1e9, 0, false, std::nullopt};
  plan.reserved_bytes = o.headroom * plan.memory_bytes;
  const AxisLinks links = axis_links(s.tp, s.pp, s.dp, cluster.hw.gpus_per_node, s.cp);
  const Link tp_link = links.tp_in_node ? cluster.hw.nvlink : cluster.hw.infiniband;
  const Link pp_link = links.pp_in_node ? cluster.hw.nvlink : cluster.hw.infiniband;
  const Link dp_link = links.dp_in_node ? cluster.hw.nvlink : cluster.hw.infiniband;
  const Link cp_link = links.cp_in_node ? cluster.hw.nvlink : cluster.hw.infiniband;
  // ZeRO shards, and gradients reduce, over the data- and context-parallel ranks together
  const int replicas = s.replicas();
  const std::int64_t w = working_bytes(s.precision);
  const double m = static_cast<double>(s.micro_batches);

  for (int st = 0; st < s.pp; ++st) {
    StagePlan sp;
    sp.stage = st;
    if (model.arch) {
      const Architecture& a = *model.arch;
      sp.layers = layers_on_stage(a.layers, s.pp, st);
      sp.params = stage_params(a, s.tp, s.pp, st);
    } else {
      sp.layers = 0;
      sp.params = ceil_div(model.params, static_cast<std::int64_t>(s.tp) * s.pp);
    }
    const bool own = o.footprint == Footprint::fourway;
    const bool own_pp = own && s.pp > 1;
    // models::Gpt (tp = 1) pads the vocabulary to a multiple of the alignment
    // (GptConfig::vocab_alignment); split over a tp group it is padded to tp·alignment
    const TensorSplit split{s.tp, o.vocab_alignment};
    // the logits' row width of the tp = 1 head: the padded vocabulary
    const std::int64_t head_vocab = !own        ? 0
                                    : s.tp == 1 ? runtime_vocab_rows(*model.arch, split)
                                                : model.arch->vocab;
    std::optional<PipelineRankState> rank;  // fourway's pipeline rank `st`
    if (own_pp) {
      rank = runtime_pipeline_rank_state(*model.arch, s.precision, s.zero, replicas,
                                         pipeline_split(s), st, o.optimizer, split);
      sp.layers = rank->layers;
      sp.params = rank->params;
      sp.states = rank->states;
    } else if (own) {
      sp.params = runtime_rank_params(*model.arch, split);  // wte's padding rows included
      sp.states = runtime_model_state_bytes(*model.arch, s.precision, s.zero, replicas,
                                            o.bucket_bytes, o.optimizer, split);
    } else {
      sp.states =
          model_state_bytes(sp.params, s.precision, s.zero, replicas, Padding::flat(), o.optimizer);
    }
    // deferred construction, positioned reads and in-place writes: the states and nothing more
    sp.construct_peak = sp.load_peak = sp.save_peak = static_cast<double>(sp.states.total());
    if (rank) sp.construct_peak = static_cast<double>(rank->construct);  // eager chunks (ZeRO 1-3)
    const std::int64_t padded = shard_elements(sp.params, replicas) * replicas;
    sp.data_parallel =
        data_parallel_traffic(zero_sharding(s.zero).shards_optimizer_state ? padded : sp.params,
                              s.precision, s.zero, replicas, s.micro_batches, dp_link);
    if (model.arch) {
      const Architecture& a = *model.arch;
      // Without a pipeline, micro-batches run forward and backward one after another; with one,
      // the schedule's table says how many chunk-activations the stage keeps at once, each
      // 1/(chunks per rank) of the stage's layers.
      const int chunks_per_rank = s.schedule == Schedule::zb_v          ? 2
                                  : s.schedule == Schedule::interleaved ? s.virtual_stages
                                                                        : 1;
      sp.in_flight = s.pp == 1 ? 1
                               : micro_batches_in_flight(s.schedule, s.pp, s.micro_batches, st,
                                                         s.virtual_stages);
      // a context-parallel rank holds seq/cp tokens of each sequence, scored against all seq keys
      const double local_seq = static_cast<double>(a.seq) / static_cast<double>(s.cp);
      const LayerShape x{local_seq,
                         static_cast<double>(s.micro_batch),
                         static_cast<double>(a.hidden),
                         static_cast<double>(a.heads),
                         static_cast<double>(s.tp),
                         static_cast<double>(a.seq),
                         o.attention != AttentionKernel::fused};
      const double scale = static_cast<double>(w) / 2.0;  // Korthikanti counts 16-bit values
      double per_mb = static_cast<double>(sp.layers) *
                      korthikanti_layer_bytes(x, s.sequence_parallel, s.checkpointing);
      // ZB-V's V holds both ends on the first rank
      const int head_stage = s.schedule == Schedule::zb_v ? 0 : s.pp - 1;
      if (st == 0) per_mb += korthikanti_embedding_bytes(x);
      if (st == head_stage) per_mb += korthikanti_output_bytes(x, static_cast<double>(a.vocab));
      sp.activations =
          scale * per_mb * static_cast<double>(sp.in_flight) / static_cast<double>(chunks_per_rank);
      sp.recompute_working =
          scale * korthikanti_recompute_working_bytes(x, s.sequence_parallel, s.checkpointing);
      // fourway's context-parallel ranks hold seq/cp rows of every tensor of the stash (flash
      // attention keeps a log-sum-exp per row, no scores)
      const std::int64_t own_seq = a.seq / s.cp;
      if (own) {  // fourway's stash: kept outputs + head, and the larger of a block and the head
        const GptActivationShape g{s.micro_batch, own_seq,  a.hidden,   a.heads,
                                   head_vocab,    a.layers, s.precision};
        const std::int64_t head = runtime_head_activation_bytes(g);
        const std::int64_t block = runtime_block_activation_bytes(g);
        if (own_pp) {  // the rank's chunks, action by action through the schedule's table
          const PipelineActivation act = runtime_pipeline_activation(
              a, g, split, s.sequence_parallel, s.checkpointing, pipeline_split(s), st);
          sp.in_flight = act.in_flight;
          sp.activations = static_cast<double>(act.kept);
          sp.recompute_working = static_cast<double>(act.peak - act.kept);
          sp.backward_workspace = static_cast<double>(act.with_workspace - act.peak);
        } else if (s.tp > 1) {  // split: the fullest rank holds min(Vp/tp, V) real vocabulary rows
          const std::int64_t rows = std::min(runtime_vocab_rows(a, split), a.vocab);
          const std::int64_t out =
              runtime_tp_embedding_activation_bytes(g, s.tp, s.sequence_parallel);
          const std::int64_t tp_head =
              runtime_tp_head_activation_bytes(g, s.tp, s.sequence_parallel, rows);
          const std::int64_t tp_block =
              runtime_tp_block_activation_bytes(g, s.tp, s.sequence_parallel);
          if (s.checkpointing == Checkpointing::full) {
            // kept: the embedding's output and every block's (the same shape), the head; the
            // recomputed block's stash replaces the head's at the peak when it is larger
            sp.activations = static_cast<double>(out + a.layers * out + tp_head);
            sp.recompute_working =
                static_cast<double>(runtime_block_peak_extra(g, out, tp_block, tp_head, true));
          } else if (s.checkpointing == Checkpointing::selective) {
            const std::int64_t kept = runtime_selective_kept_bytes(g, s.tp, out, tp_block, tp_head);
            sp.activations = static_cast<double>(kept);
            sp.recompute_working =
                static_cast<double>(runtime_selective_activation_bytes(
                                        g, s.tp, out, tp_block, tp_head,
                                        runtime_block_peak_extra(g, out, tp_block, 0, false)) -
                                    kept);
          } else {
            sp.activations = static_cast<double>(
                runtime_tp_activation_bytes(g, s.tp, s.sequence_parallel, rows));
            sp.recompute_working = 0;
          }
        } else if (s.checkpointing == Checkpointing::full) {
          const std::int64_t kept = runtime_embedding_activation_bytes(g) +
                                    a.layers * own_seq * a.hidden * s.micro_batch * w + head;
          sp.activations = static_cast<double>(kept);
          sp.recompute_working = static_cast<double>(std::max<std::int64_t>(block - head, 0));
        } else if (s.checkpointing == Checkpointing::selective) {
          const std::int64_t kept = runtime_selective_kept_bytes(
              g, 1, runtime_embedding_activation_bytes(g), block, head);
          sp.activations = static_cast<double>(kept);
          sp.recompute_working =
              static_cast<double>(runtime_activation_bytes(g, Checkpointing::selective) - kept);
        } else {
          sp.activations = static_cast<double>(runtime_activation_bytes(g, false));
          sp.recompute_working = 0;
        }
      }
      if (own_pp) {
        // one accumulation window per step: full gradients (ZeRO-2), gathered units (ZeRO-3)
        const auto weights = static_cast<double>(rank->in_step.weights - rank->states.weights);
        const auto grads = static_cast<double>(rank->in_step.grads - rank->states.grads);
        if (zero_sharding(s.zero).shards_params)
          sp.zero3_gathered = weights + grads;
        else
          sp.zero2_buckets = grads;
      } else if (own && zero_sharding(s.zero).shards_grads &&
                 !zero_sharding(s.zero).shards_params) {
        // The buckets the head's backward adds to (ln_f's, the first in backward order, and
        // wte's, the last) hold full gradients from the start of backward, when the activations
        // peak, until their reduce-scatter.
        const auto segs = runtime_segments(a, 2, o.bucket_bytes, s.precision, split);
        std::int64_t full = ceil_div(segs.front(), replicas) * replicas;
        if (segs.size() > 1) full += ceil_div(segs.back(), replicas) * replicas;
        sp.zero2_buckets = static_cast<double>(full * w);
      }
      // fourway's ZeRO-3 gathers each unit into its full buffers on one rank too
      if (zero_sharding(s.zero).shards_params && (replicas > 1 || own) && !own_pp) {
        std::int64_t unit = sp.layers > 0 ? layer_params(a, s.tp) : 0;
        if (st == 0) unit = std::max(unit, embedding_params(a, s.tp));
        if (st == s.pp - 1) unit = std::max(unit, head_params(a, s.tp, s.pp));
        if (own) {  // fourway gathers padded units
          for (std::int64_t u : runtime_units(a, split)) {
            unit = std::max(unit, ceil_div(u, replicas) * replicas);
          }
        }
        sp.zero3_gathered = 3.0 * static_cast<double>(unit * w);
      }
      const ActivationShape xs{x.s, x.b, x.h, sp.layers};
      const Traffic tp_mb = tensor_parallel_traffic_per_micro_batch(
          xs, s.tp, s.precision, s.checkpointing == Checkpointing::full, st == 0, st == s.pp - 1,
          tp_link);
      const Traffic pp_mb =
          pipeline_traffic_per_micro_batch(xs, s.tp, s.sequence_parallel, s.precision, s.pp, st,
                                           pp_link, o.pp_scatter_gather, tp_link);
      sp.tensor_parallel = Traffic{tp_mb.bytes * m, tp_mb.seconds * m};
      if (own) {  // what fourway's tp group sends, as Counting counts it (the same time model)
        sp.tensor_parallel.bytes =
            runtime_tensor_parallel_bytes(xs, s.tp, s.sequence_parallel, s.precision,
                                          s.checkpointing == Checkpointing::full, s.micro_batches);
      }
      sp.pipeline = Traffic{pp_mb.bytes * m, pp_mb.seconds * m};
      if (rank) {
        // fourway's pipeline ranks (never selective: `validate` refuses it under
        // --footprint fourway), as Counting counts them (the same time model), every schedule
        const GptActivationShape g{s.micro_batch, own_seq,  a.hidden,   a.heads,
                                   head_vocab,    a.layers, s.precision};
        const PipelineRankTraffic tr =
            runtime_pipeline_traffic(a, g, s.zero, replicas, pipeline_split(s), st, split,
                                     s.sequence_parallel, s.checkpointing == Checkpointing::full);
        sp.tensor_parallel.bytes = tr.tp;
        sp.pipeline.bytes = tr.pp + tr.tie;
      }
      // the rank's share of the stage's arithmetic: its tokens, 1/cp of the micro-batch's
      const double rate = detail::achievable_flops(cluster.hw, s.precision, o);
      const double attention_rate = detail::achievable_attention_flops(cluster.hw, s.precision, o);
      const double tokens = static_cast<double>(s.micro_batch) * local_seq;
      const double attention_flops =
          stage_attention_flops_per_token(a, s.tp, s.pp, st, s.checkpointing) * tokens;
      sp.compute_per_micro_batch =
          (stage_flops_per_token(a, s.tp, s.pp, st, s.checkpointing) * tokens - attention_flops) /
              rate +
          attention_flops / attention_rate;
      const bool recompute = s.checkpointing != Checkpointing::none;
      if (o.attention == AttentionKernel::unfused) {
        sp.memory_per_micro_batch =
            unfused_attention_bytes(a, sp.layers, s.tp, static_cast<double>(s.micro_batch),
                                    local_seq, static_cast<double>(a.seq), recompute) /
            (cluster.hw.memory_tbs * 1e12);
      }
      sp.tensor_per_micro_batch = tp_mb.seconds * (1.0 - o.tp_overlap);
      sp.pipeline_per_micro_batch = pp_mb.seconds;
      if (s.cp > 1) {
        const double hd = static_cast<double>(a.head_dim());
        const ContextShape cx{static_cast<double>(a.seq), static_cast<double>(s.micro_batch),
                              static_cast<double>(a.heads / s.tp) * hd,
                              static_cast<double>(a.kv_heads / s.tp) * hd, sp.layers};
        const Traffic cp_mb = context_parallel_traffic_per_micro_batch(
            cx, s.cp, s.cp_kind, s.precision, recompute, cp_link);
        sp.context_parallel = Traffic{cp_mb.bytes * m, cp_mb.seconds * m};
        // a ring's blocks travel while the previous block's attention runs (forward, backward
        // and any recomputation: 12 or 16 FLOPs per query, key and hidden unit, as counted in
        // flops_per_token); Ulysses' all-to-alls sit between the layers' kernels
        const double attention_s = attention_flops / attention_rate;
        sp.context_per_micro_batch = s.cp_kind == ContextKind::ring
                                         ? std::max(0.0, cp_mb.seconds - attention_s)
                                         : cp_mb.seconds;
      }
      sp.seconds_per_micro_batch = sp.compute_per_micro_batch + sp.memory_per_micro_batch +
                                   sp.tensor_per_micro_batch + sp.pipeline_per_micro_batch +
                                   sp.context_per_micro_batch;
    }
    plan.stages.push_back(sp);
  }
  for (int st = 1; st < s.pp; ++st) {
    if (plan.stages[static_cast<std::size_t>(st)].total() > plan.worst().total())
      plan.worst_stage = st;
  }
  plan.fits = plan.worst().total() <= plan.usable_bytes();

  if (model.arch) {
    const Architecture& a = *model.arch;
    StepTime t;
    // m micro-batch slots of the slowest stage and the schedule's bubble: m + p − 1 for GPipe
    // and 1F1B
    const double bubble = schedule_bubble(s.schedule, s.pp, s.micro_batches, s.virtual_stages);
    const bool closed_form = s.schedule == Schedule::gpipe || s.schedule == Schedule::one_f_one_b;
    const double slots = closed_form ? m + static_cast<double>(s.pp) - 1.0 : m / (1.0 - bubble);
    const StagePlan* slowest = &plan.stages.front();
    for (const StagePlan& sp : plan.stages) {
      if (sp.seconds_per_micro_batch > slowest->seconds_per_micro_batch) slowest = &sp;
    }
    const double slot = slowest->seconds_per_micro_batch;
    double data = 0;
    for (const StagePlan& sp : plan.stages) {
      const double backward = 2.0 / 3.0 * sp.seconds_per_micro_batch;
      const ZeroSharding z = zero_sharding(s.zero);
      const double window = !z.shards_grads    ? backward
                            : !z.shards_params ? m * backward
                                               : m * sp.seconds_per_micro_batch;
      const DataParallelTraffic& d = sp.data_parallel;
      data = std::max(
          data, d.exposed_seconds + std::max(0.0, d.overlappable_seconds - o.overlap * window));
    }
    t.compute_s = slots * slowest->compute_per_micro_batch;
    t.memory_s = slots * slowest->memory_per_micro_batch;
    t.tensor_s = slots * slowest->tensor_per_micro_batch;
    t.pipeline_s = slots * slowest->pipeline_per_micro_batch;
    t.context_s = slots * slowest->context_per_micro_batch;
    t.data_s = data;
    t.bubble = bubble;
    t.total_s = slots * slot + data;
    const double tokens = static_cast<double>(s.global_batch() * a.seq);
    t.tokens_per_s = tokens / t.total_s;
    const double peak = cluster.hw.peak_tflops(s.precision) * 1e12;
    t.mfu = flops_per_token(a) * tokens / (t.total_s * static_cast<double>(cluster.gpus) * peak);
    plan.time = t;
  }
  return plan;
}

// ---- recommendation -------------------------------------------------------------------------

/// What `recommend` may choose. Empty optionals are searched.
struct SearchSpace {
  std::int64_t global_batch = 0;  // sequences per step; 0: one micro-batch per GPU
  std::int64_t micro_batch = 1;
  Precision precision = Precision::bf16;
  Schedule schedule = Schedule::one_f_one_b;
  int virtual_stages = 1;  // chunks per pipeline rank of the interleaved schedule
  std::optional<int> dp, tp, pp, zero;
  std::optional<int> cp;  // context parallelism: searched (1 and every degree that splits the
                          // sequence) unless fixed
  ContextKind cp_kind = ContextKind::ring;
  std::optional<Checkpointing> checkpointing;
  std::optional<bool> sequence_parallel;
  double prefer_within = 0.10;  // a simpler mesh wins when this close to the fastest
};

struct Recommendation {
  std::vector<Plan> fitting;  // every fitting mesh, fastest first
  std::optional<std::size_t> chosen;
  std::string why;      // one line
  std::string missing;  // when nothing fits: what would
  std::size_t searched = 0;
};

namespace detail {
inline std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

inline std::vector<Plan> all_plans(const Model& model, const Cluster& cluster,
                                   const SearchSpace& space, const Options& o) {
  std::vector<Plan> out;
  const std::int64_t gb = space.global_batch > 0
                              ? space.global_batch
                              : static_cast<std::int64_t>(cluster.gpus) * space.micro_batch;
  for (int tp : divisors(cluster.gpus)) {
    if (space.tp && *space.tp != tp) continue;
    if (!model.arch && !space.tp && tp > 1) continue;  // no shape: tensor parallelism is unmodelled
    if (model.arch) {
      const Architecture& a = *model.arch;
      if (a.heads % tp != 0 || a.kv_heads % tp != 0 || a.ffn % tp != 0) continue;
    }
    for (int cp : divisors(cluster.gpus / tp)) {
      if (space.cp ? *space.cp != cp
                   : cp > 1 && (!model.arch || o.footprint != Footprint::published)) {
        continue;  // fourway's GPU runtime has no context parallelism; --params no sequence
      }
      if (model.arch && !splits_sequences(*model.arch, tp, cp, space.cp_kind)) continue;
      for (int pp : divisors(cluster.gpus / (tp * cp))) {
        if (space.pp && *space.pp != pp) continue;
        if (!model.arch && !space.pp && pp > 1) continue;
        if (model.arch && pp > model.arch->layers) continue;
        const int dp = cluster.gpus / (tp * cp * pp);
        if (space.dp && *space.dp != dp) continue;
        if (gb % (static_cast<std::int64_t>(dp) * space.micro_batch) != 0) continue;
        const std::int64_t m = gb / (static_cast<std::int64_t>(dp) * space.micro_batch);
        for (int zero = 0; zero <= 3; ++zero) {
          if (space.zero && *space.zero != zero) continue;
          if (o.footprint == Footprint::fourway && pp > 1 &&
              schedule::validate(
                  pipeline_split(Strategy{dp, tp, pp, zero, space.micro_batch, m, space.schedule,
                                          Precision::bf16, Checkpointing::none, false,
                                          space.virtual_stages})
                      .request()) != schedule::RequestProblem::none) {
            continue;  // the runtime refuses this schedule (e.g. 1f1b with m < pp)
          }
          if (dp * cp == 1 && zero_sharding(zero).shards_optimizer_state && !space.zero) {
            continue;  // nothing to shard over
          }
          for (Checkpointing r :
               {Checkpointing::none, Checkpointing::selective, Checkpointing::full}) {
            if (space.checkpointing && *space.checkpointing != r) continue;
            if (!model.arch && r != Checkpointing::none) continue;
            const bool sp = space.sequence_parallel ? *space.sequence_parallel : tp > 1;
            Strategy s{dp,
                       tp,
                       pp,
                       zero,
                       space.micro_batch,
                       m,
                       space.schedule,
                       space.precision,
                       r,
                       sp,
                       space.virtual_stages,
                       cp,
                       space.cp_kind};
            out.push_back(make_plan(model, cluster, s, o));
          }
        }
      }
    }
  }
  return out;
}

inline std::string describe(const Strategy& s) {
  std::string d = fourway::detail::cat("dp=", s.dp, " tp=", s.tp, " pp=", s.pp, " zero=", s.zero,
                                       " ", precision_name(s.precision),
                                       " checkpoint=", checkpointing_name(s.checkpointing));
  if (s.tp > 1 && s.sequence_parallel) d += " +sequence-parallel";
  if (s.cp > 1) {
    d += fourway::detail::cat(" cp=", s.cp,
                              s.cp_kind == ContextKind::ulysses ? " ulysses" : std::string());
  }
  if (s.pp > 1)
    d += fourway::detail::cat(" ", schedule_name(s.schedule), " m=", s.micro_batches,
                              s.schedule == Schedule::interleaved
                                  ? fourway::detail::cat(" v=", s.virtual_stages)
                                  : std::string());
  else if (s.micro_batches > 1)
    d += fourway::detail::cat(" accumulate=", s.micro_batches);
  return d;
}

/// Why a recommendation splits the sequence: nothing without context parallelism fits, or the
/// simplest mesh that fits without it recomputes activations, or is slower.
inline std::string context_reason(const std::vector<Plan>& fitting, const Plan& chosen) {
  const Plan* plain = nullptr;   // the fastest fitting mesh without context parallelism
  const Plan* simple = nullptr;  // the fastest without context, tensor or pipeline parallelism
  for (const Plan& p : fitting) {
    if (p.strategy.cp > 1) continue;
    if (!plain || p.time->total_s < plain->time->total_s) plain = &p;
    if (p.strategy.tp == 1 && p.strategy.pp == 1 &&
        (!simple || p.time->total_s < simple->time->total_s)) {
      simple = &p;
    }
  }
  const std::int64_t seq = chosen.model.arch->seq;
  std::string why = fourway::detail::cat("; context parallelism ", chosen.strategy.cp, " holds ",
                                         seq / chosen.strategy.cp, " of the ", seq,
                                         " tokens of each sequence per rank");
  if (!plain) {
    return why + "; the sequence is what does not fit: no mesh without it fits, even with " +
           "ZeRO-3 and full recomputation";
  }
  const auto percent = [&](const Plan& p) {
    const double r = p.time->total_s / chosen.time->total_s - 1.0;
    std::ostringstream os;
    os << std::fixed << std::setprecision(0) << std::fabs(r) * 100.0 << "% "
       << (r < 0 ? "faster" : "slower");
    return os.str();
  };
  const Plan& alt = simple ? *simple : *plain;
  why += fourway::detail::cat("; without it the ", simple ? "simplest" : "fastest",
                              " mesh that fits (", describe(alt.strategy), ") ");
  if (alt.strategy.checkpointing != Checkpointing::none &&
      chosen.strategy.checkpointing == Checkpointing::none) {
    why += fourway::detail::cat("recomputes activations (",
                                checkpointing_name(alt.strategy.checkpointing), ") and is ");
  } else {
    why += "is ";
  }
  return why + percent(alt);
}

inline std::string gb(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << bytes / 1e9 << " GB";
  return os.str();
}
}  // namespace detail

/// Searches every mesh (tp × pp × dp = GPUs, ZeRO 0–3, recomputation none/selective/full) of the
/// cluster at a fixed global batch, keeps those that fit, ranks them by estimated step time
/// (by memory when there is no architecture) and picks one in the honest order.
inline Recommendation recommend(const Model& model, const Cluster& cluster,
                                const SearchSpace& space, const Options& o = {}) {
  Strategy probe;
  probe.dp = cluster.gpus;
  // Validates what does not depend on the mesh (GPUs, memory, the model itself).
  detail::require(cluster.gpus >= 1, "fourway: ", cluster.gpus,
                  " GPUs; a plan needs at least one (--gpus N)");
  validate(model, cluster, probe, o);
  detail::require(space.micro_batch >= 1, "fourway: micro-batch size ", space.micro_batch,
                  " must be >= 1");
  Recommendation rec;
  std::vector<Plan> plans = detail::all_plans(model, cluster, space, o);
  rec.searched = plans.size();
  for (Plan& p : plans) {
    if (p.fits) rec.fitting.push_back(p);
  }
  auto seconds = [](const Plan& p) { return p.time ? p.time->total_s : 0.0; };
  // Without an architecture there is no time: the traffic per step ranks instead (ZeRO-1/2 move
  // what data parallelism moves, ZeRO-3 half as much again), then the memory.
  std::stable_sort(rec.fitting.begin(), rec.fitting.end(), [&](const Plan& a, const Plan& b) {
    if (seconds(a) != seconds(b)) return seconds(a) < seconds(b);
    if (!a.time && a.worst().comm_bytes() != b.worst().comm_bytes()) {
      return a.worst().comm_bytes() < b.worst().comm_bytes();
    }
    return a.worst().total() < b.worst().total();
  });
  if (rec.fitting.empty()) {
    if (plans.empty()) {
      rec.missing = fourway::detail::cat(
          "no mesh of ", cluster.gpus, " GPUs can hold a global batch of ",
          space.global_batch > 0 ? space.global_batch : cluster.gpus * space.micro_batch,
          " sequences in micro-batches of ", space.micro_batch,
          " (the data-parallel degree must divide it); change --global-batch or --micro-batch");
      return rec;
    }
    const Plan* lean = &plans.front();
    for (const Plan& p : plans) {
      if (p.worst().total() < lean->worst().total()) lean = &p;
    }
    const double need = lean->worst().total() / (1.0 - o.headroom);
    std::string more;
    for (int k = 1; k <= 16; ++k) {
      Cluster bigger = cluster;
      bigger.gpus = cluster.gpus << k;
      SearchSpace sp = space;
      if (sp.global_batch > 0) sp.global_batch <<= k;
      bool any = false;
      for (const Plan& p : detail::all_plans(model, bigger, sp, o)) any = any || p.fits;
      if (any) {
        more = fourway::detail::cat(", or at least ", bigger.gpus,
                                    " GPUs of this kind (at the same batch per GPU)");
        break;
      }
    }
    rec.missing = fourway::detail::cat(
        "nothing fits on ", cluster.gpus, " × ", detail::gb(lean->memory_bytes),
        ": the leanest mesh (", detail::describe(lean->strategy), ") needs ",
        detail::gb(lean->worst().total()), " per GPU but ", detail::gb(lean->usable_bytes()),
        " are usable; missing ", detail::gb(lean->worst().total() - lean->usable_bytes()),
        " per GPU — use GPUs with at least ", detail::gb(need), more);
    return rec;
  }
  const double fastest = seconds(rec.fitting.front());
  auto complexity = [](const Plan& p) {
    return (p.strategy.pp > 1 ? 1 : 0) + (p.strategy.tp > 1 ? 1 : 0) + (p.strategy.cp > 1 ? 1 : 0);
  };
  std::size_t best = 0;
  for (std::size_t i = 0; i < rec.fitting.size(); ++i) {
    const Plan& p = rec.fitting[i];
    if (seconds(p) > fastest * (1.0 + space.prefer_within)) continue;
    const Plan& b = rec.fitting[best];
    const auto key = [&](const Plan& q) {
      return std::tuple(complexity(q), q.strategy.pp, q.strategy.tp, q.strategy.cp, seconds(q));
    };
    if (key(p) < key(b)) best = i;
  }
  rec.chosen = best;
  const Plan& c = rec.fitting[best];
  std::string why = fourway::detail::cat("recommended ", detail::describe(c.strategy), ": fits in ",
                                         detail::gb(c.worst().total()), " of ",
                                         detail::gb(c.usable_bytes()), " usable");
  if (c.time) {
    std::ostringstream os;
    os << std::setprecision(3) << c.time->total_s;
    why += fourway::detail::cat(", ", os.str(), " s/step");
  }
  if (!c.time) {
    why += "; no architecture, so no step time: the least traffic per step, then the least memory";
  } else if (complexity(c) == 0) {
    why +=
        best == 0
            ? "; the fastest fitting mesh, and it needs no tensor, pipeline or context parallelism"
            : fourway::detail::cat(
                  "; needs no tensor, pipeline or context parallelism and is within ",
                  static_cast<int>(std::lround(space.prefer_within * 100)), "% of the fastest (",
                  detail::describe(rec.fitting.front().strategy), ")");
  } else {
    bool simpler_fits = false;
    for (const Plan& p : rec.fitting) simpler_fits = simpler_fits || complexity(p) < complexity(c);
    why += simpler_fits ? fourway::detail::cat(
                              "; simpler meshes fit but are more than ",
                              static_cast<int>(std::lround(space.prefer_within * 100)), "% slower")
                        : "; no mesh with less tensor/pipeline/context parallelism fits, even with "
                          "ZeRO-3 and full checkpointing";
  }
  if (c.strategy.cp > 1) why += detail::context_reason(rec.fitting, c);
  rec.why = why;
  return rec;
}

}  // namespace fourway::plan
