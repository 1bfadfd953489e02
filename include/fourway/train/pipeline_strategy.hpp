//! `PipelineStrategy<Precision, B, Comm, Zero, Chunk>`: a model cut into pipeline chunks over the
//! ranks of one pipeline group, run by a schedule table (schedule/), as a training strategy
//! (train/strategy.hpp). The chunks are any `pp::pipeline_chunk` a factory builds from a
//! `ModelPart` (layers/model_part.hpp), and the model's `CutCosts` balance its blocks; no model is
//! named here. Tensor-parallel parts make every stage tensor-parallel (the 3D mesh: tp inside
//! each stage, pp across stages, dp/ZeRO across the replicas). A chunk's head is tied to its
//! embedding only when the chunk has `wte()` (GPT-2's has, examples/llama/'s has not). GPT-2's
//! factory and costs: `models::part_factory`, `models::cut_costs` (models/gpt2.hpp).
//!
//!   construction   the schedule table for (kind, ranks, M, v) is made and checked (a bad request
//!                  or table is a ScheduleError before any step); the model is cut into
//!                  ranks·chunks_per_rank chunks (parallel/pp/partition.hpp) and this rank builds
//!                  only its chunks (a `ModelPart` each: values equal the whole model's);
//!   step           the Trainer hands over the rank's rows; `run_micro_batches` cuts them into M
//!                  micro-batches and runs the table (parallel/pp/executor.hpp): the micro-batch
//!                  loop of the Trainer becomes the schedule's order;
//!   finish_step    a tied embedding (GPT): the first chunk's `wte` (embedding) and the last
//!   chunk's
//!                  copy (LM head) get the sum of both gradients (an all-reduce over the two ranks
//!                  that hold them, or an add when one rank holds both, as in ZB-V), as Megatron
//!                  does; Σg² counts `wte` once (the first chunk's) and is all-reduced over the
//!                  pipeline group, so clipping and the fp16 skip agree everywhere; AdamW runs on
//!                  the rank's own parameters (both copies of `wte` take identical steps).
//!
//! Tensor-parallel chunks: the tied-embedding sum runs between the ranks of the same tp rank
//! (they hold the same vocabulary slice); Σg² counts a replicated parameter on tp rank 0 only and
//! is summed over the chunks' tp group too; the loss is already whole on every tp rank.
//!
//! The loss lives on the rank of the last chunk; `finish_step` sums it over the pipeline group
//! (packed with Σg² in one `StepScalars` all-reduce) and the replicas, so every rank returns the
//! global-batch mean. With a `dp` group
//! (S stages x D replicas) each replica trains on its share of the batch and the gradients are
//! all-reduced (summed) over the replicas of each stage before the step: DataParallel across
//! replicas. Σg² is then the same in every replica and is summed over the pipeline group only.
//!
//! With `time_phases(true)` `finish_step` times each of its parts (`phases()`, steady clock, the
//! device synchronized at each boundary): the dp gradient all-reduce, the tied-embedding sum, the
//! local Σg², the step scalars' all-reduce over the pipeline group (loss and Σg²), the loss's
//! all-reduce over the replicas, and the optimizer step.
//!
//! `PipelineStrategy<P, B, Comm, Zero>` with Zero = 1, 2, 3 shards across the `dp` replicas
//! instead: the rank's chunks, seen as one model (`pp::ChunkSet`), are handed to
//! `ShardedStrategy<Zero, ...>` over `dp` (train/sharded_strategy.hpp), which owns their weights,
//! gradients and the optimizer state of its shard. The micro-batch policy (docs/pipeline.md,
//! "Pipelines with ZeRO"): under ZeRO-1 gradients accumulate over the M micro-batches in full
//! Ψ_r buffers and are reduce-scattered once, at the end of the step; under ZeRO-2/3 the
//! schedule drives the units (`unit_event`, one segment per unit): ZeRO-3 gathers a unit's
//! weights for each F, BW and B that runs it and frees them after, and every unit's gradients
//! are bound to full buffers for its backward and reduce-scattered into the shard when the
//! backward is complete (after the unit in BW, after the chunk's W under a split backward).
//! Per step and rank, over dp (Ψ'_r = the rank's parameters padded for D, u = its largest
//! padded unit, s = sizeof(T), ring bytes in units of (D-1)/D·Ψ'·s):
//! ```
//!   Zero  held during the step          held between steps       dp bytes
//!   1     W Ψ', G Ψ', Adam Ψ'/D         W Ψ', G Ψ', Adam Ψ'/D    RS + AG       = 2
//!   2     W Ψ', G Ψ'/D + u, Adam Ψ'/D   W Ψ', G Ψ'/D, Adam Ψ'/D  M RS + 1 AG   = M + 1
//!   3     W, G each Ψ'/D + u, Adam Ψ'/D W, G, Adam Ψ'/D          M RS + 2M AG  = 3M
//! ```
//! (a split backward holds a chunk's full gradients from its B to its next W instead of u),
//! plus one packed all-reduce of (loss, Σg²): 2(D-1)/D · 16 bytes. The tied `wte`'s two copies
//! are segments of their own under ZeRO-2/3, so their reduced shards are summed element for
//! element over the tie group.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/generate.hpp"
#include "fourway/layers/model_part.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/parallel/dp/data_parallel.hpp"
#include "fourway/parallel/pp/chunk_set.hpp"
#include "fourway/parallel/pp/executor.hpp"
#include "fourway/parallel/pp/partition.hpp"
#include "fourway/parallel/step_scalars.hpp"
#include "fourway/schedule/generators.hpp"
#include "fourway/train/sharded_strategy.hpp"
#include "fourway/train/state_runs.hpp"
#include "fourway/train/strategy.hpp"
#include "fourway/train/trainer.hpp"

namespace fourway {

/// What the pipeline runs: the schedule, M micro-batches per step (equal to the Trainer's
/// `micro_batches`), virtual stages for the interleaved schedule, and optional cut points.
struct PipelineOptions {
  schedule::Kind schedule = schedule::Kind::one_f_one_b;
  int micro_batches = 1;
  int virtual_stages = 1;  // interleaved: chunks per rank (ZB-V: 2 implied)
  std::vector<int> cuts;   // first block of every chunk after the first; empty: balanced
};

template <precision_policy P, backend B, communicator Comm, int Zero, class Chunk>
requires pp::pipeline_chunk<Chunk, typename P::param_type, B>
class PipelineStrategy {
  static_assert(Zero >= 0 && Zero <= 3,
                "fourway: PipelineStrategy<P, B, Comm, Zero> needs Zero 0 (DataParallel across the "
                "replicas), 1, 2 or 3 (ZeRO across the replicas of each stage)");

 public:
  using precision_type = P;
  using backend_type = B;
  using param_type = typename P::param_type;
  using T = param_type;
  using model_type = Chunk;
  using chunk_set_type = pp::ChunkSet<T, B, Comm, Chunk>;
  /// Builds one chunk: the units a `ModelPart` names, values as the whole model's.
  using chunk_factory = std::function<std::unique_ptr<Chunk>(const ModelPart&)>;
  /// The ZeRO strategy over `dp` that owns the rank's chunks when Zero >= 1.
  using sharded_type = ShardedStrategy<(Zero > 0 ? Zero : 1), chunk_set_type, P, B, Comm>;
  static constexpr int zero_stage = Zero;
  /// The data-parallel policy across the replicas: the code below asks it what is sharded.
  using dp_policy = data_parallel_policy_t<Zero>;

  /// One pipeline (no replicas): chunks from `make(part)`; `costs` says how to balance the
  /// model's blocks over the chunks (when the options give no cut points).
  PipelineStrategy(const Context<B>& ctx, const pp::CutCosts& costs, chunk_factory make, Comm& pp,
                   PipelineOptions options, AdamW optimizer = AdamW{})
      : PipelineStrategy(ctx, costs, std::move(make), pp, nullptr, std::move(options), optimizer) {}
  /// S stages x D replicas: `pp` is this replica's pipeline group, `dp` the D ranks that hold
  /// the same stage in every replica (mesh groups pp and dp). Gradients are summed over `dp`
  /// (DataParallel, ZeRO stage 0) once per step, after the last micro-batch; with Zero >= 1 they
  /// are reduce-scattered over `dp` once per step and the rank keeps 1/D of the optimizer state.
  /// Tensor-parallel chunks: `make` builds this rank's slices of each part (their tp group is
  /// the mesh's tp group; `pp` and `dp` are the groups of this rank's tp coordinate).
  PipelineStrategy(const Context<B>& ctx, const pp::CutCosts& costs, chunk_factory make, Comm& pp,
                   Comm& dp, PipelineOptions options, AdamW optimizer = AdamW{})
      : PipelineStrategy(ctx, costs, std::move(make), pp, &dp, std::move(options), optimizer) {}
  /// Whether the chunks' LM head is tied to the embedding (`Chunk::wte()`): its two copies'
  /// gradients are summed.
  static constexpr bool tied_head = requires(Chunk & c) { c.wte(); };

 private:
  PipelineStrategy(const Context<B>& ctx, const pp::CutCosts& costs, chunk_factory make, Comm& pp,
                   Comm* dp, PipelineOptions options, AdamW optimizer)
      : ctx_(&ctx),
        pp_(&pp),
        dp_(dp),
        options_(std::move(options)),
        optimizer_(optimizer),
        table_(make_table(pp.size(), 1)),
        partition_(options_.cuts.empty() ? pp::Partition::balanced(costs, table_.chunks())
                                         : pp::Partition::at_cuts(costs.layers, options_.cuts)),
        chunks_(build_chunks(make)),
        tie_(make_tie_group()),
        state_(ctx, !dp_policy::shards_optimizer_state ? segments() : std::vector<StateSegment>{}),
        scalars_(ctx) {
    check<ConfigError>(partition_.chunks() == table_.chunks(), "fourway: ", options_.cuts.size(),
                       " cut points make ", partition_.chunks(), " chunks but the schedule '",
                       table_.name, "' runs ", table_.chunks(), " (stages x virtual stages); give ",
                       table_.chunks() - 1, " cut points");
    std::vector<model_type*> mine;
    for (auto& c : chunks_)
      if (c) mine.push_back(c.get());
    set_ = std::make_unique<chunk_set_type>(std::move(mine), tied_copy(), pp, own_segments());
    for (std::size_t c = 0, k = 0; c < chunks_.size(); ++c)
      chunk_first_unit_.push_back(chunks_[c] ? set_->first_unit(k++) : -1);
    if constexpr (!dp_policy::shards_optimizer_state) {
      std::size_t i = 0;
      visit_parameters([&](Parameter<T, B>& p) { state_.init_master(ctx, i++, p.weight.data()); });
    } else {
      check<ConfigError>(dp_ != nullptr, "fourway: ZeRO-", Zero,
                         " across pipeline replicas needs the dp group; use the constructor "
                         "taking (pp, dp)");
      // collectives are issued where the step needs them (see begin_step / finish_step)
      sharded_ = std::make_unique<sharded_type>(
          ctx, *set_, *dp_, optimizer,
          ShardedOptions{.bucket_bytes = 0, .overlap = false, .unit_segments = Zero >= 2});
    }
  }

 public:
  PipelineStrategy(const PipelineStrategy&) = delete;
  PipelineStrategy& operator=(const PipelineStrategy&) = delete;

  // ---- training_strategy --------------------------------------------------------------------
  [[nodiscard]] int dp_rank() const { return dp_ != nullptr ? dp_->rank() : 0; }
  [[nodiscard]] int dp_size() const { return dp_ != nullptr ? dp_->size() : 1; }
  /// This rank's first chunk (the Trainer's model; all chunks: `chunk(c)`).
  [[nodiscard]] model_type& model() { return *first_chunk(); }
  [[nodiscard]] const Context<B>& context() const { return *ctx_; }
  [[nodiscard]] const AdamW& optimizer() const { return optimizer_; }
  [[nodiscard]] NoHooks& hooks() { return hooks_; }

  void begin_step() {
    if constexpr (!dp_policy::shards_optimizer_state) {
      for (auto& c : chunks_)
        if (c) zero_grad(*ctx_, *c);
    } else if constexpr (!dp_policy::shards_grads) {
      // ZeRO-1: the whole step is one accumulation window of the sharded strategy over full
      // gradients, reduce-scattered once in finish_step
      sharded_->begin_step();
      sharded_->begin_micro_batch(0, 1);
      auto& h = sharded_->hooks();
      h.pre_forward(0);
      for (int u = 0; u < set_->units(); ++u) h.pre_backward(u);
    } else {
      // ZeRO-2/3: the schedule drives the units (unit_event)
      sharded_->begin_step();
    }
  }
  void begin_micro_batch(int /*i*/, int /*n*/) {}
  void end_micro_batch(int /*i*/, int /*n*/) {}
  /// Context parallelism (set by the mesh, whose chunks are bound to the same split): each rank
  /// stages its part of every sequence of its rows (`cp::take_local_rows`), T/c tokens, and the
  /// boundaries between chunks are (b, T/c, C). `dp` is then the cp × dp group.
  void split_sequences(SequenceSplit s) { split_ = s; }

  /// The Trainer's micro-batch loop, in the schedule's order: rows [first, first + M·b) of the
  /// global batch in M micro-batches of b rows. Returns Σ loss_i·b (non-zero on the last chunk's
  /// rank only).
  double run_micro_batches(const Batch& batch, std::int64_t first, std::int64_t b, int M,
                           float grad_scale) {
    check_micro_batches(M);
    const std::int64_t elements = first_chunk()->boundary_shape(b, local_length(batch)).numel();
    if (!executor_ || elements != elements_) {
      elements_ = elements;
      executor_ = make_executor(make_table(pp_->size(), elements));
    }
    return executor_->run(micro_batches(batch, first, b, M), grad_scale);
  }

  /// The evaluation of the rank's rows (`Trainer::evaluate`): the same micro-batches on the
  /// forward-only table of the schedule (`schedule::forward_only`; under ZeRO-3 each unit is
  /// gathered for its forward and freed after). Returns Σ over the global batch of mean loss ·
  /// rows, summed over the pipeline (the last stage's) and the replicas: a collective of the mesh.
  double evaluate_micro_batches(const Batch& batch, std::int64_t first, std::int64_t b, int M) {
    check_micro_batches(M);
    const std::int64_t elements = first_chunk()->boundary_shape(b, local_length(batch)).numel();
    if (!eval_executor_ || elements != eval_elements_) {
      eval_elements_ = elements;
      eval_executor_ = make_executor(schedule::forward_only(make_table(pp_->size(), 1), elements));
    }
    const double mine = eval_executor_->run(micro_batches(batch, first, b, M), 1.0f);
    double sum = scalars_.sum(*pp_, std::array<double, 1>{mine})[0];
    if (dp_ != nullptr && dp_->size() > 1) sum = scalars_.sum(*dp_, std::array<double, 1>{sum})[0];
    return sum;
  }

  /// `o.tokens` new tokens after `prompt` from the pipeline as it stands (`Trainer::generate`,
  /// layers/generate.hpp), one token per step: each token runs through the chunks in model
  /// order, each rank's chunks over their own KV caches (ZeRO-3: a unit gathered for its decode
  /// and freed after), the (1, 1, C) boundary sent to the next chunk's rank on the pipeline
  /// group (p2p, in the order both sides make the calls), and the last chunk's rank picks the
  /// next token, which a sum over the pipeline group gives every rank. Every rank of the mesh
  /// calls it with the same prompt and options; the replicas generate the same tokens.
  std::vector<std::int32_t> generate(std::span<const std::int32_t> prompt,
                                     const SampleOptions& o) requires generative_model<Chunk> {
    check<ConfigError>(!prompt.empty() && o.tokens >= 1, "fourway: generate needs a prompt and at ",
                       "least one new token, got ", prompt.size(), " and ", o.tokens);
    const auto n = static_cast<std::int64_t>(prompt.size());
    std::vector<std::vector<KvCache<T, B>>> caches(chunks_.size());
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      if (chunks_[c]) caches[c] = chunks_[c]->kv_caches(*ctx_, n + o.tokens);
    std::mt19937_64 rng(o.seed);
    const bool picks = last_chunk() != nullptr;  // this rank holds the head
    std::vector<std::int32_t> out;
    std::int32_t token = prompt[0];
    for (std::int64_t pos = 0; pos < n + o.tokens - 1; ++pos) {
      const std::vector<float> logits = decode_through_chunks(token, pos, caches);
      if (pos + 1 < n) {
        token = prompt[static_cast<std::size_t>(pos + 1)];
        continue;
      }
      const double mine = picks ? static_cast<double>(pick_token(logits, o, rng)) : 0.0;
      token = static_cast<std::int32_t>(scalars_.sum(*pp_, std::array<double, 1>{mine})[0]);
      out.push_back(token);
    }
    return out;
  }

  StepReport finish_step(const StepControl& c) {
    phases_.clear();
    auto t = phase_start();
    if constexpr (dp_policy::shards_optimizer_state) {
      if constexpr (dp_policy::shards_grads) {
        tie_embedding_shards();  // every unit was reduce-scattered by the schedule
        t = phase_end("tied embedding sum", t);
      } else {
        tie_embedding_gradients();  // on the full, accumulated gradients
        t = phase_end("tied embedding sum", t);
        sharded_->end_micro_batch(0, 1);
        t = phase_end("dp gradient reduce-scatter", t);
      }
      StepControl over_pp = c;  // the loss lives on the last stage; the sharded step sums over dp
      over_pp.loss_sum = scalars_.sum(*pp_, std::array<double, 1>{c.loss_sum})[0];
      t = phase_end("step scalars all-reduce", t);
      const StepReport r = sharded_->finish_step(over_pp);
      phase_end("optimizer step", t);
      return r;
    }
    if (dp_ != nullptr && dp_->size() > 1) {
      visit_parameters([&](Parameter<T, B>& p) {
        dp_->all_reduce(p.grad.data(), p.grad.data(), p.grad.numel(), ReduceOp::sum);
      });
      t = phase_end("dp gradient all-reduce", t);
    }
    const bool tied =
        tied_head && table_.chunks() > 1 && (chunks_.front() != nullptr || last_chunk() != nullptr);
    tie_embedding_gradients();
    if (tied) t = phase_end("tied embedding sum", t);
    // the step's scalars in backend memory: the loss (on the last stage) in slot 0, this rank's
    // counted Σg² in slot 1 (the tied copy and, under tp, replicated parameters off tp rank 0
    // are not counted); summed over the pipeline, Σg² also over tp, the loss over the replicas
    // (their gradients, hence Σg², are already equal); then one read-back
    scalars_.set(0, c.loss_sum);
    scalars_.zero(1);
    std::vector<std::span<const T>> counted;
    int i = 0;
    visit_parameters([&](Parameter<T, B>& p) {
      if (set_->counts_in_norm(i++))
        counted.emplace_back(p.grad.data(), static_cast<std::size_t>(p.grad.numel()));
    });
    Ops<B>::sum_squares_into(*ctx_, scalars_.slot(1), counted);
    t = phase_end("sum of squares", t);
    scalars_.reduce(*pp_, 0, 2);
    set_->sum_over_tensor_parallel(scalars_, 1);  // every tp rank's slices
    if (dp_ != nullptr && dp_->size() > 1) scalars_.reduce(*dp_, 0);
    const auto sums = scalars_.template read<2>();
    double ss = sums[1];
    t = phase_end("step scalars all-reduce", t);
    StepReport r;
    r.loss_sum = sums[0];
    r.found_inf = c.check_finite && !std::isfinite(ss);
    std::vector<SegmentBinding<T>> bindings;
    visit_parameters([&](Parameter<T, B>& p) {
      bindings.push_back({p.weight.data(), p.grad.data()});
    });
    r = apply_optimizer_step(*ctx_, optimizer_, state_, c, r, ss, bindings);
    phase_end("optimizer step", t);
    return r;
  }

  /// A timed part of `finish_step`.
  struct Phase {
    std::string name;
    std::chrono::steady_clock::time_point start, end;
  };
  /// Time the parts of every `finish_step` from now on (off by default: no device syncs).
  void time_phases(bool on) { time_phases_ = on; }
  /// The last step's parts, in order (empty unless `time_phases(true)`).
  [[nodiscard]] const std::vector<Phase>& phases() const { return phases_; }

  // ---- inspection -----------------------------------------------------------------------------
  [[nodiscard]] const schedule::Table& table() const { return table_; }
  [[nodiscard]] const pp::Partition& partition() const { return partition_; }
  [[nodiscard]] int pipeline_rank() const { return pp_->rank(); }
  /// Chunk c's model part, or null when another rank holds it.
  [[nodiscard]] model_type* chunk(int c) { return chunks_[static_cast<std::size_t>(c)].get(); }
  /// The last step's timed actions (empty before the first step).
  [[nodiscard]] std::vector<pp::ExecSpan> spans() const {
    return executor_ ? executor_->spans() : std::vector<pp::ExecSpan>{};
  }
  /// The origin of `spans()` (steady clock), to line up the ranks' spans.
  [[nodiscard]] std::chrono::steady_clock::time_point spans_origin() const {
    return executor_ ? executor_->spans_origin() : std::chrono::steady_clock::time_point{};
  }
  /// Runs `f()` with every parameter of the rank's chunks bound to its full value. ZeRO-3: a
  /// collective over `dp` (each unit is gathered for the call); otherwise just `f()`.
  template <class F>
  void with_gathered_parameters(F&& f) {
    if constexpr (dp_policy::shards_params) {
      sharded_->with_gathered_parameters(f);
    } else {
      f();
    }
  }
  /// Loads the rank's chunks from `read(p, first, count, host)` (elements [first, first + count)
  /// of parameter p into a host buffer, e.g. `gpt2_element_reader`): every element of the
  /// chunks' parameters under ZeRO 0 (the fp32 masters follow), only those the rank owns under
  /// ZeRO 1-3 (`ShardedStrategy::load_weights`: a collective over `dp` under ZeRO-1/2). Before
  /// the first step.
  template <class Source>
  requires(
      !model_parallel_model<Chunk>)  // whole tensors; tensor-parallel slices load in the factory
      void load_weights(Source&& read) {
    if constexpr (dp_policy::shards_optimizer_state) {
      sharded_->load_weights(read);
    } else {
      constexpr std::int64_t piece = 1 << 16;
      std::vector<T> host;
      std::size_t i = 0;
      visit_parameters([&](Parameter<T, B>& p) {
        host.resize(static_cast<std::size_t>(std::min(piece, p.numel())));
        for (std::int64_t at = 0; at < p.numel(); at += piece) {
          const std::int64_t n = std::min(piece, p.numel() - at);
          read(p, at, n, host.data());
          Ops<B>::from_host(*ctx_, p.weight.data() + at, host.data(), n);
        }
        state_.init_master(*ctx_, i++, p.weight.data());
      });
    }
  }
  /// Zero >= 1: the ZeRO strategy over `dp` (layout, shards, optimizer state); null otherwise.
  [[nodiscard]] const sharded_type* sharded() const { return sharded_.get(); }
  /// The optimizer state this rank holds (its ZeRO shard under Zero >= 1).
  [[nodiscard]] const MasterState<T, B>& state() const {
    if constexpr (dp_policy::shards_optimizer_state) {
      return sharded_->state();
    } else {
      return state_;
    }
  }

  // ---- checkpoints (train/state_runs.hpp, train/resume.hpp) ---------------------------------
  /// The ranks a checkpoint of this pipeline is written by: every stage of every replica.
  [[nodiscard]] int checkpoint_ranks() const { return pp_->size() * dp_size(); }
  /// What this rank owns of the optimizer state, in its chunks' parameters: under Zero 0 (every
  /// replica holds its stage whole) its 1/D of each parameter, so over the replicas every
  /// element is written once; under Zero >= 1 its shard.
  [[nodiscard]] std::vector<OwnedRun<T, B>> saved_state_runs() const {
    if constexpr (dp_policy::shards_optimizer_state) {
      return sharded_->saved_state_runs();
    } else {
      return owned_runs(true);
    }
  }
  /// The global runs this rank writes (`saving`) or loads (the chunk set's views: tp slices,
  /// the tied copy of `wte` not written).
  [[nodiscard]] std::vector<StateRun<T, B>> checkpoint_runs(bool saving) const {
    if constexpr (dp_policy::shards_optimizer_state) {
      return sharded_->checkpoint_runs(saving);
    } else {
      const auto owned = owned_runs(saving);
      return state_runs(*set_, owned, saving);
    }
  }
  template <class Put>
  void save_state(Put&& put) {
    if constexpr (dp_policy::shards_optimizer_state) {
      sharded_->save_state(put);
    } else {
      const auto runs = checkpoint_runs(true);
      save_state_runs(*ctx_, state_, runs, put);
    }
  }
  /// Fills what this rank holds from `read(tensor, first, n, host)`, whatever mesh wrote it; no
  /// communication (`sync_loaded_state` then runs ZeRO-1/2's weight all-gather).
  template <class Read>
  void load_state(int adam_step, Read&& read) {
    if constexpr (dp_policy::shards_optimizer_state) {
      sharded_->load_state(adam_step, read);
    } else {
      const auto runs = checkpoint_runs(false);
      load_state_runs(*ctx_, state_, runs, read);
      state_.restore_step(adam_step);
    }
  }
  void sync_loaded_state() {
    if constexpr (dp_policy::shards_optimizer_state) sharded_->sync_loaded_state();
  }
  /// Waits for what the data-parallel reduction still has queued (train/weights_save.hpp).
  void wait_idle() {
    if constexpr (dp_policy::shards_optimizer_state) sharded_->wait_idle();
  }
  /// Every parameter this rank holds, chunk by chunk in model order (the tied `wte` once per
  /// chunk that holds it).
  template <class F>
  void visit_parameters(F&& f) {
    for (auto& c : chunks_)
      if (c) c->visit_parameters(f);
  }

 private:
  schedule::Table make_table(int ranks, std::int64_t elements) const {
    return schedule::make(schedule::Request{options_.schedule, ranks, options_.micro_batches,
                                            options_.virtual_stages, elements});
  }

  std::vector<std::unique_ptr<model_type>> build_chunks(const chunk_factory& make) const {
    std::vector<std::unique_ptr<model_type>> out(static_cast<std::size_t>(table_.chunks()));
    for (int c = 0; c < table_.chunks(); ++c) {
      if (table_.rank_of(c) == pp_->rank()) {
        out[static_cast<std::size_t>(c)] = make(partition_.part(c));
        check<ConfigError>(out[static_cast<std::size_t>(c)] != nullptr,
                           "fourway: the pipeline's chunk factory built no chunk ", c);
      }
    }
    return out;
  }

  model_type* first_chunk() const {
    for (const auto& c : chunks_)
      if (c) return c.get();
    return nullptr;
  }
  model_type* last_chunk() const { return chunks_.back().get(); }

  std::chrono::steady_clock::time_point phase_start() const {
    if (time_phases_) ctx_->synchronize();
    return std::chrono::steady_clock::now();
  }
  /// Records [start, now) as `name` when timing; returns now, the next part's start.
  std::chrono::steady_clock::time_point phase_end(const char* name,
                                                  std::chrono::steady_clock::time_point start) {
    if (!time_phases_) return start;
    const auto now = phase_start();
    phases_.push_back(Phase{name, start, now});
    return now;
  }

  /// The two ranks holding wte (first and last chunk) form a group; others split off alone.
  std::unique_ptr<Comm> make_tie_group() {
    if constexpr (!tied_head) return nullptr;
    const int first = table_.rank_of(0);
    const int last = table_.rank_of(table_.chunks() - 1);
    const int me = pp_->rank();
    const bool member = first != last && (me == first || me == last);
    return std::make_unique<Comm>(pp_->split(member ? 0 : 1 + me, me == first ? 0 : 1));
  }

  /// The last chunk's copy of wte when it is a copy (the model has more than one chunk).
  Parameter<T, B>* tied_copy() const {
    if constexpr (!tied_head) {
      return nullptr;
    } else {
      model_type* last = last_chunk();
      return last != nullptr && table_.chunks() > 1 ? &last->wte() : nullptr;
    }
  }

  /// The full, accumulated gradients of the tied `wte` (ZeRO 0-1).
  void tie_embedding_gradients() {
    if constexpr (tied_head) {
      sum_tied_copies([](model_type& m) {
        auto& g = m.wte().grad;
        return std::span<T>(g.data(), static_cast<std::size_t>(g.numel()));
      });
    }
  }
  /// ZeRO-2/3: the same sum on the reduced shards. Both copies of `wte` are segments of their
  /// own (own_segments), padded alike, so a rank's shards of the two hold the same elements.
  void tie_embedding_shards() {
    if constexpr (tied_head)
      sum_tied_copies([this](model_type& m) { return sharded_->gradient_shard_of(m.wte()); });
  }
  /// The first chunk's `wte` (embedding) and the last chunk's copy (LM head) each get the sum of
  /// both gradients `grad_of(chunk)`: an add when this rank holds both ends (ZB-V), an all-reduce
  /// over the two ranks that hold them otherwise, as Megatron does.
  template <class GradOf>
  void sum_tied_copies(GradOf grad_of) {
    if (table_.chunks() == 1) return;
    model_type* first = chunks_.front().get();
    model_type* last = last_chunk();
    if (first != nullptr && last != nullptr) {
      const std::span<T> g0 = grad_of(*first);
      const std::span<T> g1 = grad_of(*last);
      const auto n = static_cast<std::int64_t>(g0.size());
      Ops<B>::residual_forward(*ctx_, g0.data(), g0.data(), g1.data(), n);
      Ops<B>::copy(*ctx_, g1.data(), g0.data(), n);
    } else if (first != nullptr || last != nullptr) {
      const std::span<T> g = grad_of(first != nullptr ? *first : *last);
      tie_->all_reduce(g.data(), g.data(), static_cast<std::int64_t>(g.size()), ReduceOp::sum);
    }
  }
  /// ZeRO-2/3: the copies of a tied `wte` (first and last chunk) are segments of their own.
  std::vector<const Parameter<T, B>*> own_segments() const {
    std::vector<const Parameter<T, B>*> out;
    if constexpr (tied_head && Zero >= 2) {
      if (table_.chunks() > 1) {
        if (chunks_.front()) out.push_back(&chunks_.front()->wte());
        if (last_chunk() != nullptr) out.push_back(&last_chunk()->wte());
      }
    }
    return out;
  }
  /// ZeRO-2/3 across the replicas, unit by unit as the schedule runs them (pp::UnitEvent):
  ///   F        gather the unit's weights (ZeRO-3), run, free them
  ///   BW       gather, bind full gradient buffers (carrying the shard so far), run, free the
  ///            weights, reduce-scatter the gradients the unit completes and free their buffers
  ///   B        gather, bind, run, free the weights; the buffers stay for W
  ///   W        bind every unit of the chunk (fresh buffers when an earlier W reduced them),
  ///            run the queued dW GEMMs, reduce-scatter every unit (last first) and free them
  /// A reduce-scatter may carry part of a later micro-batch (a B that ran before this W): the
  /// sum is linear and each contribution sits in exactly one reduced buffer, so the shard is the
  /// same. The replicas of a stage run the same table row, so they issue the same collectives
  /// in the same order.
  void unit_event(const pp::UnitEvent& e) {
    using Op = schedule::Op;
    const auto c = static_cast<std::size_t>(e.chunk);
    const int base = chunk_first_unit_[c];
    if (e.unit < 0) {
      if (e.op != Op::backward_weight) return;
      const int units = chunks_[c]->units();
      if (e.before) {
        for (int u = 0; u < units; ++u) sharded_->open_unit_gradients(base + u);
      } else {
        for (int u = units; u-- > 0;) sharded_->reduce_unit_gradients(base + u);
      }
      return;
    }
    const int u = base + e.unit;
    if (e.before) {
      sharded_->gather_unit(u);
      if (e.op != Op::forward) sharded_->open_unit_gradients(u);
      return;
    }
    sharded_->release_unit(u);
    if (e.op == Op::backward) sharded_->reduce_unit_gradients(u);
  }
  /// Zero 0: every parameter of the rank's chunks as one run (segment = its index), or with
  /// `split` the replica's 1/D of it (the part it writes).
  std::vector<OwnedRun<T, B>> owned_runs(bool split) const {
    std::vector<OwnedRun<T, B>> runs;
    int i = 0;
    const int D = dp_size(), d = dp_rank();
    for (const auto& c : chunks_) {
      if (!c) continue;
      c->visit_parameters([&](Parameter<T, B>& p) {
        std::int64_t lo = 0, hi = p.numel();
        if (split) {
          const std::int64_t part = shard_numel(p.numel(), D);
          lo = std::min(p.numel(), d * part);
          hi = std::min(p.numel(), lo + part);
        }
        if (hi > lo) {
          runs.push_back(
              {&p, lo, hi - lo, static_cast<std::size_t>(i), lo, p.weight.data() + lo, i});
        }
        ++i;
      });
    }
    return runs;
  }

  std::vector<StateSegment> segments() {
    std::vector<StateSegment> segs;
    std::int64_t off = 0;
    visit_parameters([&](Parameter<T, B>& p) {
      segs.push_back(StateSegment{off, p.weight.numel(), p.decay});
      off += p.weight.numel();
    });
    return segs;
  }

  /// A micro-batch's token ids as a (b, T) tensor: a view of the host batch on Host, a copy
  /// into a reused buffer on a device.
  /// One token of `generate` through this rank's chunks in model order; the next token's logits
  /// on the rank of the last chunk (empty elsewhere).
  std::vector<float> decode_through_chunks(std::int32_t token, std::int64_t pos,
                                           std::vector<std::vector<KvCache<T, B>>>& caches) requires
      generative_model<Chunk> {
    // one stream of boundaries, received in the order sent; the largest tag every MPI takes
    // (MPI_TAG_UB >= 32767), far above the schedule's message tags
    constexpr int tag = 32767;
    const int me = pp_->rank();
    const int C = table_.chunks();
    const std::int64_t width = first_chunk()->config().dim;
    Tensor<T, B> x;
    std::vector<float> logits;
    for (int c = 0; c < C; ++c) {
      if (table_.rank_of(c) != me) continue;
      Chunk& g = *chunks_[static_cast<std::size_t>(c)];
      const ModelPart& part = g.part();
      const int base = chunk_first_unit_[static_cast<std::size_t>(c)];
      const int first_block_unit = part.embedding ? 1 : 0;
      const auto unit = [&](int u, auto&& f) {
        if constexpr (dp_policy::shards_params) sharded_->gather_unit(base + u);
        auto r = f();
        if constexpr (dp_policy::shards_params) sharded_->release_unit(base + u);
        return r;
      };
      if (part.embedding) {
        x = unit(0, [&] { return g.decode_embedding(*ctx_, token, pos); });
      } else if (table_.rank_of(c - 1) != me) {
        x = Tensor<T, B>(Shape{1, 1, width}, MemTag::activations, ctx_->memory());
        pp_->recv_async(x.data(), width, table_.rank_of(c - 1), tag).wait();
      }
      for (int i = part.first_block; i < part.end_block; ++i) {
        auto& cache =
            caches[static_cast<std::size_t>(c)][static_cast<std::size_t>(i - part.first_block)];
        x = unit(first_block_unit + (i - part.first_block),
                 [&] { return g.decode_block(*ctx_, i, x, cache, pos); });
      }
      if (part.head) {
        logits = unit(first_block_unit + (part.end_block - part.first_block),
                      [&] { return g.decode_head(*ctx_, x); });
      } else if (table_.rank_of(c + 1) != me) {
        pp_->send_async(x.data(), width, table_.rank_of(c + 1), tag).wait();
      }
    }
    return logits;
  }

  void check_micro_batches(int M) const {
    check<ConfigError>(M == options_.micro_batches, "fourway: the pipeline schedule was built for ",
                       options_.micro_batches, " micro-batches but the Trainer runs ", M,
                       "; give both the same --micro-batches");
  }
  /// An executor of `table` over the rank's chunks; under ZeRO-2/3 the units report to
  /// `unit_event`.
  std::unique_ptr<pp::Executor<T, B, Comm, Chunk>> make_executor(const schedule::Table& table) {
    std::vector<model_type*> ptrs;
    for (auto& c : chunks_) ptrs.push_back(c.get());
    auto e = std::make_unique<pp::Executor<T, B, Comm, Chunk>>(*ctx_, *pp_, table, std::move(ptrs));
    if constexpr (dp_policy::shards_grads)
      e->on_unit([this](const pp::UnitEvent& u) { unit_event(u); });
    return e;
  }
  /// The tokens of a sequence this rank holds: T, or T/c under context parallelism.
  [[nodiscard]] std::int64_t local_length(const Batch& batch) const {
    return fourway::local_length(split_, batch.T);
  }

  /// The rank's M micro-batches of b rows from row `first` of `batch`, staged on the backend
  /// (this rank's part of each sequence under context parallelism).
  std::vector<pp::MicroBatch<B>> micro_batches(const Batch& batch, std::int64_t first,
                                               std::int64_t b, int M) {
    const auto at = static_cast<std::size_t>(first * batch.T);
    const auto whole = static_cast<std::size_t>(M * b * batch.T);
    const TokenRows mine =
        local_rows(split_, {batch.inputs.subspan(at, whole), batch.targets.subspan(at, whole)},
                   M * b, batch.T, local_tokens_);
    const std::int64_t Tn = local_length(batch);
    std::vector<pp::MicroBatch<B>> mbs(static_cast<std::size_t>(M));
    staged_.resize(2 * static_cast<std::size_t>(M));
    for (int i = 0; i < M; ++i) {
      const auto off = static_cast<std::size_t>(i * b * Tn);
      const auto n = static_cast<std::size_t>(b * Tn);
      auto& mb = mbs[static_cast<std::size_t>(i)];
      mb.tokens =
          stage(staged_[static_cast<std::size_t>(2 * i)], mine.inputs.subspan(off, n), b, Tn);
      mb.targets =
          stage(staged_[static_cast<std::size_t>(2 * i + 1)], mine.targets.subspan(off, n), b, Tn);
    }
    return mbs;
  }

  Tensor<std::int32_t, B> stage(Tensor<std::int32_t, B>& buffer, std::span<const std::int32_t> src,
                                std::int64_t b, std::int64_t Tn) const {
    if constexpr (!B::on_device) {
      (void)buffer;
      return Tensor<std::int32_t, B>::view_of(const_cast<std::int32_t*>(src.data()), Shape{b, Tn});
    } else {
      if (buffer.numel() != b * Tn)
        buffer = Tensor<std::int32_t, B>(Shape{b, Tn}, MemTag::activations, ctx_->memory());
      Ops<B>::from_host(*ctx_, buffer.data(), src.data(), b * Tn);
      return buffer.view(Shape{b, Tn});
    }
  }

  const Context<B>* ctx_;
  Comm* pp_;
  Comm* dp_;  // null: one replica
  PipelineOptions options_;
  AdamW optimizer_;
  schedule::Table table_;
  pp::Partition partition_;
  std::vector<std::unique_ptr<model_type>> chunks_;
  std::unique_ptr<Comm> tie_;
  MasterState<T, B> state_;  // Zero == 0 (Zero >= 1: the sharded strategy's)
  StepScalars<B> scalars_;
  std::unique_ptr<chunk_set_type> set_;
  std::unique_ptr<sharded_type> sharded_;
  NoHooks hooks_;
  SequenceSplit split_{};                   // context parallelism: this rank's part of sequences
  std::vector<std::int32_t> local_tokens_;  // ... staged from here: inputs | targets
  std::vector<Tensor<std::int32_t, B>> staged_;
  std::unique_ptr<pp::Executor<T, B, Comm, Chunk>> executor_;
  std::unique_ptr<pp::Executor<T, B, Comm, Chunk>> eval_executor_;  // forward-only (evaluate)
  std::int64_t eval_elements_ = 0;
  std::int64_t elements_ = -1;  // message size the executor's table was made for
  bool time_phases_ = false;
  std::vector<Phase> phases_;
  std::vector<int> chunk_first_unit_;  // chunk c's first unit in the chunk set (-1: not here)
};

}  // namespace fourway
