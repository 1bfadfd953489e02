//! `Trainer<Strategy>`: one optimizer step over a *global* batch, on any mesh.
//!
//! The trainer owns the strategy (built in place from the constructor's arguments), the loss
//! scaler and the micro-batch loop; the strategy owns gradient reduction, optimizer state and
//! parameter placement (train/strategy.hpp has the picture). The global batch of B sequences of
//! T tokens is split first over the data-parallel ranks, then into micro-batches:
//!
//!   rows:  | rank 0: mb 0 | mb 1 | ... | rank 1: mb 0 | mb 1 | ... | ...
//!          rank r, micro-batch i holds rows [r·B/dp + i·b, r·B/dp + (i+1)·b),  b = B/(dp·M)
//!
//! Every micro-batch's backward gets the factor `loss_scale · b / B`, so the gradients summed
//! over micro-batches and ranks are those of the mean loss over all B·T targets, whatever dp and
//! M are; the loss `step` returns is that mean too (identical on every rank). B must divide by
//! dp·M (a ConfigError names the numbers otherwise).
//!
//! Context parallelism (a strategy with `sequence_split()` of c ranks): the c ranks of a context
//! group take the same rows and each keeps its part of every sequence — T/c tokens, chunks r and
//! 2c − 1 − r (`cp::take_local_rows`; a target stays the next token of the whole sequence). Each
//! micro-batch's loss is then the mean over its b·T/c tokens, so the factor is
//! `loss_scale · b / (B·c)` and the step's loss the sum over dp × cp ranks divided by B·c.
//!
//! A model for the trainer has `value_type`, `backend_type`, `Stash`, `visit_parameters`, and
//!   float forward(ctx, tokens, targets, stash, hooks)   tokens, targets: Tensor<int32_t,B> (b, T)
//!   void  backward(ctx, stash, grad_scale, hooks)       grads += d(grad_scale · mean loss)/dθ
//! as `fw::models::Gpt` does.
//!
//! `evaluate(batch)` is the forward half of a step (a validation loss): the same split, no
//! backward, nothing updated; a strategy sums its ranks' losses with `sum_loss` and frees what
//! its hooks gathered with `end_forward_only` (a pipeline: `evaluate_micro_batches`).
//!
//! Synchronisation (core/sync_counter.hpp): a step uploads this rank's token ids once (checked
//! against the vocabulary on the host first); when the model has `forward_into` (a `LossSink`)
//! and the strategy `device_loss_sum()`, every micro-batch's loss is added to the strategy's
//! device scalars, and the step's one synchronising call is the strategy's read-out of its
//! scalars (loss sum and Σg² together). Otherwise each forward returns its loss to the host.
//!
//! Graph capture (`TrainerOptions::capture`, backend/capture.hpp): a strategy whose step splits
//! into a device half (`reduce_step`: no collective, nothing read back or uploaded — SingleRank)
//! and a host half (`complete_step`: the read-back, the clip, the fp16 skip, the optimizer), with
//! a model that leaves its loss on the device, can have the device half — zeroing the
//! gradients, every micro-batch's forward and backward, Σg² — captured into a CUDA graph and
//! replayed each step with one launch. The tokens are uploaded before the replay into the same
//! buffer; the learning rate, clip coefficient and skip are decided after the read-back, outside
//! the graph, so they are never stale. The graph is keyed by the micro-batch shape, the count and
//! the gradient scale (fp16's loss scale): a step with new shapes runs uncaptured (its blocks then
//! fill the cache) and the next one is captured, a new gradient scale alone is captured at once,
//! and the steps after replay the graph. While a graph is held its blocks serve only it
//! (backend/capture.hpp), so `evaluate` and `generate` drop it first — their forwards reuse the
//! step's blocks, as without a graph — and the next step recaptures. On the host the capture is
//! rehearsed (the same refusals, the same results).
#pragma once

#include <concepts>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "fourway/backend/capture.hpp"
#include "fourway/backend/ops.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/generate.hpp"
#include "fourway/optim/loss_scaler.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/train/strategy.hpp"

namespace fourway {

/// A model the Trainer can train (see the file comment).
template <class M>
concept trainable_model = requires(M& m, const Context<typename M::backend_type>& ctx,
                                   const Tensor<std::int32_t, typename M::backend_type>& tok,
                                   typename M::Stash& s, NoHooks& h, float g) {
  typename M::value_type;
  typename M::backend_type;
  typename M::Stash;
  { m.forward(ctx, tok, tok, s, h) } -> std::convertible_to<float>;
  m.backward(ctx, s, g, h);
};

/// The global batch, in host memory: `inputs` and `targets` are (B, T) row-major token ids.
struct Batch {
  std::span<const std::int32_t> inputs;
  std::span<const std::int32_t> targets;
  std::int64_t B = 0;
  std::int64_t T = 0;
};

/// A global batch that owns its tokens, cut from B rows of T + 1 consecutive tokens each
/// (inputs are a row's first T tokens, targets its last T, as llm.c and nanoGPT do).
struct TokenBatch {
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
  std::int64_t B = 0;
  std::int64_t T = 0;

  static TokenBatch from_rows(std::span<const std::int32_t> rows, std::int64_t B, std::int64_t T) {
    check<ShapeError>(B >= 1 && T >= 1 && static_cast<std::int64_t>(rows.size()) == B * (T + 1),
                      "fourway: a batch of B=", B, " rows of T+1=", T + 1, " tokens needs ",
                      B * (T + 1), " tokens, got ", rows.size());
    TokenBatch b;
    b.B = B;
    b.T = T;
    for (std::int64_t r = 0; r < B; ++r) {
      const auto row =
          rows.subspan(static_cast<std::size_t>(r * (T + 1)), static_cast<std::size_t>(T + 1));
      b.inputs.insert(b.inputs.end(), row.begin(), row.end() - 1);
      b.targets.insert(b.targets.end(), row.begin() + 1, row.end());
    }
    return b;
  }
  [[nodiscard]] Batch view() const { return Batch{inputs, targets, B, T}; }
};

/// A strategy that generates itself (a pipeline's, over its chunks' ranks).
template <class S>
concept generating_strategy = requires(S& s, std::span<const std::int32_t> prompt,
                                       const SampleOptions& o) {
  { s.generate(prompt, o) } -> std::same_as<std::vector<std::int32_t>>;
};

/// Whether a Trainer captures the device half of its step in a CUDA graph and replays it (see the
/// file comment).
enum class StepCapture {
  off,            // every step launches its kernels
  on,             // captured; a strategy or model that cannot be is a ConfigError, a failed
                  // capture a GraphCaptureError
  when_possible,  // captured where it can be; otherwise uncaptured, with the reason in
                  // `Trainer::capture_note()`
};

struct TrainerOptions {
  int micro_batches = 1;           // per data-parallel rank and step (gradient accumulation)
  LossScalerConfig loss_scaler{};  // used when the precision is fp16
  StepCapture capture = StepCapture::off;
};

template <training_strategy S>
class Trainer {
 public:
  using strategy_type = S;
  using model_type = typename S::model_type;
  using precision_type = typename S::precision_type;
  using backend_type = typename S::backend_type;
  using B = backend_type;
  /// The strategy runs the micro-batches itself (a pipeline schedule).
  static constexpr bool pipelined =
      requires(S & s, const Batch& batch, std::int64_t r, int M, float g) {
    s.run_micro_batches(batch, r, r, M, g);
  };
  static_assert(trainable_model<model_type>,
                "fourway: the strategy's model_type does not model fw::trainable_model (forward "
                "with tokens and targets returning the mean loss, backward with a grad scale)");
  static_assert(
      std::is_same_v<typename model_type::value_type, typename precision_type::param_type>,
      "fourway: the model's element type differs from Precision<T>; build the model "
      "with the precision's element type");

  /// Builds the strategy in place from `strategy_args` (e.g. ctx, model, AdamW for SingleRank).
  template <class... Args>
  explicit Trainer(TrainerOptions opts, Args&&... strategy_args)
      : opts_(opts),
        strategy_(std::forward<Args>(strategy_args)...),
        scaler_(precision_type::loss_scaling ? LossScaler::dynamic(opts.loss_scaler)
                                             : LossScaler::none()) {
    check<ConfigError>(opts_.micro_batches >= 1, "fourway: micro_batches must be >= 1, got ",
                       opts_.micro_batches);
    if (!capturable && capture_ != StepCapture::off) {
      check<ConfigError>(capture_ != StepCapture::on,
                         "fourway: the step cannot be captured in a CUDA graph (", uncapturable(),
                         "); set TrainerOptions::capture to when_possible or off");
      capture_ = StepCapture::off;
      capture_note_ = detail::cat("not captured: ", uncapturable());
    }
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One optimizer step on the global batch; returns its mean loss (the same on every rank).
  float step(const Batch& batch) {
    const int M = opts_.micro_batches;
    const std::int64_t b = micro_batch_rows(batch);
    const std::int64_t T = local_length(batch);
    const double shares = static_cast<double>(batch.B) * sequence_split_of(strategy_).ranks;
    const float loss_scale = scaler_.scale();
    const auto grad_scale =
        static_cast<float>(static_cast<double>(loss_scale) * static_cast<double>(b) / shares);
    const auto& ctx = strategy_.context();
    model_type& model = strategy_.model();

    double local_sum = 0.0;
    bool loss_on_device = false;
    bool graph = false;
    if constexpr (pipelined) {
      // a pipeline runs the rank's micro-batches in its schedule's order
      // (train/pipeline_strategy.hpp); the weighting is the same
      strategy_.begin_step();
      local_sum = strategy_.run_micro_batches(
          batch, static_cast<std::int64_t>(strategy_.dp_rank()) * M * b, b, M, grad_scale);
    } else {
      graph = capture_ != StepCapture::off;
      if (!graph) strategy_.begin_step();
      // this rank's rows [first, first + M·b): uploaded once, then one view per micro-batch
      stage_rows(ctx, model, batch, strategy_.dp_rank() * static_cast<std::int64_t>(M) * b, M * b);
      loss_on_device = sinks_loss;
      if (graph) {
        graph_step(ctx, CaptureKey{b, T, M, grad_scale});
      } else {
        local_sum = micro_batches(b, T, M, grad_scale);
      }
    }
    const StepControl control{strategy_.optimizer().lr_at(iteration_), loss_scale,
                              precision_type::loss_scaling, local_sum, loss_on_device};
    report_ = graph ? complete_step(control) : strategy_.finish_step(control);
    scaler_.update(report_.found_inf);
    ++iteration_;
    return static_cast<float>(report_.loss_sum / shares);
  }

  /// The mean loss of the global batch under the current weights, forward only (a validation
  /// loss): each rank runs its data-parallel share in the step's micro-batches (a pipeline runs
  /// them on its forward-only table, `schedule::forward_only`), and the losses are summed over
  /// the mesh like a step's. No gradient, optimizer state, loss scale or step count changes, and
  /// every activation is freed before it returns. A collective of the whole mesh: every rank
  /// calls it with the same batch and gets the same value.
  float evaluate(const Batch& batch) {
    const int M = opts_.micro_batches;
    const std::int64_t b = micro_batch_rows(batch);
    const std::int64_t T = local_length(batch);
    const double shares = static_cast<double>(batch.B) * sequence_split_of(strategy_).ranks;
    const std::int64_t first = strategy_.dp_rank() * static_cast<std::int64_t>(M) * b;
    double sum = 0.0;
    drop_graph();
    if constexpr (pipelined) {
      sum = strategy_.evaluate_micro_batches(batch, first, b, M);
    } else {
      const auto& ctx = strategy_.context();
      model_type& model = strategy_.model();
      stage_rows(ctx, model, batch, first, M * b);
      for (int i = 0; i < M; ++i) {
        const auto tokens = staged(false, i * b * T, Shape{b, T});
        const auto targets = staged(true, i * b * T, Shape{b, T});
        const float loss = model.forward(ctx, tokens, targets, stash_, strategy_.hooks());
        sum += static_cast<double>(loss) * static_cast<double>(b);
        stash_ = typename model_type::Stash{};
        if constexpr (requires { strategy_.end_forward_only(); }) strategy_.end_forward_only();
      }
      if constexpr (requires { strategy_.sum_loss(sum); }) sum = strategy_.sum_loss(sum);
    }
    return static_cast<float>(sum / shares);
  }

  /// `o.tokens` new tokens after `prompt` from the model as the mesh holds it now
  /// (layers/generate.hpp: one token per step over KV caches): the strategy's hooks gather what
  /// ZeRO-3 shards one unit at a time, as in a forward, and free it after. A collective of the
  /// data-parallel group: every rank calls it with the same prompt and options and gets the
  /// same tokens. Nothing a step uses changes.
  std::vector<std::int32_t> generate(
      std::span<const std::int32_t> prompt,
      const SampleOptions& o) requires((pipelined && generating_strategy<S>) ||
                                       (!pipelined && generative_model<model_type>)) {
    check<ConfigError>(sequence_split_of(strategy_).ranks == 1,
                       "fourway: generate on a context-parallel mesh (each rank holding 1/",
                       sequence_split_of(strategy_).ranks,
                       " of a sequence) is not supported: decoding keeps whole sequences; save the "
                       "model and generate on a mesh without ContextParallel");
    drop_graph();
    if constexpr (pipelined) {
      return strategy_.generate(prompt, o);  // the chunks' ranks in turn
    } else {
      std::vector<std::int32_t> out;
      std::exception_ptr failed;
      try {
        out =
            fourway::generate(strategy_.context(), strategy_.model(), prompt, o, strategy_.hooks());
      } catch (...) {
        failed = std::current_exception();
      }
      // what the hooks gathered is released whether or not the generation finished
      if constexpr (requires { strategy_.end_forward_only(); }) strategy_.end_forward_only();
      if (failed) std::rethrow_exception(failed);
      return out;
    }
  }

  [[nodiscard]] S& strategy() { return strategy_; }
  [[nodiscard]] model_type& model() { return strategy_.model(); }
  /// This rank's accountant (bytes per tag: weights, grads, master_weights, optimizer_state...).
  [[nodiscard]] MemoryAccountant& memory() const { return strategy_.context().memory(); }
  [[nodiscard]] const LossScaler& loss_scaler() const { return scaler_; }
  /// What the last step did: skipped or not, gradient norm, clip coefficient.
  [[nodiscard]] const StepReport& last_report() const { return report_; }
  /// Calls of `step` so far (skipped fp16 steps included); the learning-rate schedule's index.
  [[nodiscard]] long iteration() const { return iteration_; }
  [[nodiscard]] const TrainerOptions& options() const { return opts_; }
  /// The step capture in force: the option, or off where it could not be had (`capture_note`).
  [[nodiscard]] StepCapture capture() const { return capture_; }
  /// Why the step is not captured (empty while it is, or when capture was never asked for).
  [[nodiscard]] const std::string& capture_note() const { return capture_note_; }
  /// Steps captured (each also ran once) and replayed so far.
  [[nodiscard]] long captures() const { return captures_; }
  [[nodiscard]] long replays() const { return replays_; }
  /// Restores the step counter (the schedule's index) and the loss scaler from a checkpoint.
  void restore_progress(long iteration, float loss_scale, int clean_run, long skipped) {
    check<CheckpointError>(iteration >= 0, "fourway: a checkpoint's iteration must be >= 0, got ",
                           iteration);
    scaler_.restore(loss_scale, clean_run, skipped);
    iteration_ = iteration;
  }

 private:
  /// The model leaves its loss in the strategy's device scalars (no read-back per micro-batch).
  static constexpr bool sinks_loss =
      requires(model_type & m, S& s, const Context<B>& ctx, const Tensor<std::int32_t, B>& tok,
               typename model_type::Stash& st, const LossSink& sink) {
    { s.device_loss_sum() } -> std::same_as<double*>;
    m.forward_into(ctx, tok, tok, st, sink, s.hooks());
  };

  /// The strategy's step splits into a device half a graph can hold and a host half, and the model
  /// leaves its loss on the device (see the file comment).
  static constexpr bool capturable =
      !pipelined && sinks_loss && requires(S & s, const StepControl& c) {
    s.reduce_step(c);
    { s.complete_step(c) } -> std::same_as<StepReport>;
  };
  static constexpr const char* uncapturable() {
    if (pipelined) return "a pipeline's schedule exchanges activations between ranks";
    if (!sinks_loss) return "the model returns each micro-batch's loss to the host";
    return "the strategy's step has collectives or reads values back before its end; only "
           "SingleRank's step splits into a device half and a host half";
  }
  /// What a captured graph was recorded for: a replay must have the same.
  struct CaptureKey {
    std::int64_t rows = 0;
    std::int64_t length = 0;
    int micro_batches = 0;
    float grad_scale = 0.0f;
    bool operator==(const CaptureKey&) const = default;
    [[nodiscard]] bool same_shapes(const CaptureKey& o) const {
      return rows == o.rows && length == o.length && micro_batches == o.micro_batches;
    }
  };
  /// Forgets the captured graph, so that its blocks serve other work (a validation's or a
  /// generation's forward) instead of new ones; the next step recaptures (its shapes are warm).
  void drop_graph() {
    if constexpr (capturable) {
      graph_.drop();
      graph_key_.reset();
    }
  }

  /// The micro-batches' forwards and backwards over the staged rows; Σ loss·rows of those whose
  /// loss came back to the host (0 when the model leaves it on the device).
  double micro_batches(std::int64_t b, std::int64_t T, int M, float grad_scale) {
    const auto& ctx = strategy_.context();
    model_type& model = strategy_.model();
    double local_sum = 0.0;
    for (int i = 0; i < M; ++i) {
      strategy_.begin_micro_batch(i, M);
      const auto tokens = staged(false, i * b * T, Shape{b, T});
      const auto targets = staged(true, i * b * T, Shape{b, T});
      if constexpr (sinks_loss) {
        // Σ per-token losses · b / (b·T): the micro-batch's mean loss times its rows
        const LossSink sink{strategy_.device_loss_sum(), 1.0 / static_cast<double>(T),
                            B::on_device && checks_tokens};
        model.forward_into(ctx, tokens, targets, stash_, sink, strategy_.hooks());
      } else {
        const float loss = model.forward(ctx, tokens, targets, stash_, strategy_.hooks());
        local_sum += static_cast<double>(loss) * static_cast<double>(b);
      }
      model.backward(ctx, stash_, grad_scale, strategy_.hooks());
      strategy_.end_micro_batch(i, M);
    }
    return local_sum;
  }

  /// The device half of a step: the gradients zeroed, the micro-batches, Σg² (what a graph holds).
  void device_step(const CaptureKey& k) {
    if constexpr (capturable) {
      strategy_.begin_step();
      (void)micro_batches(k.rows, k.length, k.micro_batches, k.grad_scale);
      strategy_.reduce_step(StepControl{0.0f, 1.0f, false, 0.0, true});
    } else {
      (void)k;
    }
  }
  /// The host half after `graph_step`.
  StepReport complete_step(const StepControl& c) {
    if constexpr (capturable) {
      return strategy_.complete_step(c);
    } else {
      return strategy_.finish_step(c);  // not reached: graph_step needs a capturable step
    }
  }

  /// The device half of a step under `capture_`: replayed when the graph was recorded for `key`;
  /// otherwise run uncaptured once for new shapes (their blocks then fill the cache), or captured
  /// (which runs it) — a new gradient scale alone recaptures at once. A capture that fails under
  /// `when_possible` leaves the step uncaptured for good, the reason in `capture_note_`.
  void graph_step(const Context<B>& ctx, const CaptureKey& key) {
    if constexpr (capturable) {
      if (graph_.captured() && graph_key_ == key) {
        graph_.replay(ctx);
        ++replays_;
        return;
      }
      graph_.drop();
      const bool warm = warm_key_ && warm_key_->same_shapes(key);
      warm_key_ = key;
      if (!warm) {
        device_step(key);  // new shapes: their blocks fill the cache
        return;
      }
      try {
        graph_.capture(ctx, [this, key] { device_step(key); });
        graph_key_ = key;
        ++captures_;
      } catch (const GraphCaptureError& e) {
        uncaptured_after(e, key);
      } catch (const DeviceError& e) {
        uncaptured_after(e, key);
      }
    } else {
      (void)ctx, (void)key;
    }
  }
  /// A failed capture: rethrown under `on`; under `when_possible` the step runs uncaptured now
  /// and from now on.
  void uncaptured_after(const Error& e, const CaptureKey& key) {
    if (capture_ == StepCapture::on) throw;
    capture_ = StepCapture::off;
    capture_note_ = detail::cat("not captured (", e.what(), ")");
    stash_ = typename model_type::Stash{};
    device_step(key);
  }

  /// The rows of one micro-batch of `batch` on one rank, after checking that the batch is whole
  /// and splits into the data-parallel ranks x micro-batches.
  std::int64_t micro_batch_rows(const Batch& batch) const {
    const int dp = strategy_.dp_size();
    const int M = opts_.micro_batches;
    check<ConfigError>(batch.B >= 1 && batch.T >= 1 &&
                           static_cast<std::int64_t>(batch.inputs.size()) == batch.B * batch.T &&
                           static_cast<std::int64_t>(batch.targets.size()) == batch.B * batch.T,
                       "fourway: a batch of B=", batch.B, " x T=", batch.T, " needs ",
                       batch.B * batch.T, " inputs and targets, got ", batch.inputs.size(), " and ",
                       batch.targets.size());
    check<ConfigError>(batch.B % (static_cast<std::int64_t>(dp) * M) == 0,
                       "fourway: the global batch of B=", batch.B,
                       " sequences does not split into ", dp, " data-parallel ranks x ", M,
                       " micro-batches; use a B that is a multiple of ",
                       static_cast<std::int64_t>(dp) * M);
    return batch.B / (static_cast<std::int64_t>(dp) * M);
  }

  /// The tokens of a sequence this rank holds: T, or T/c under context parallelism.
  std::int64_t local_length(const Batch& batch) const {
    return fourway::local_length(sequence_split_of(strategy_), batch.T);
  }

  /// Stages `rows` sequences of `batch` from row `first`: whole, or this rank's part of each under
  /// context parallelism (the parts gathered on the host first, then staged as whole rows are).
  void stage_rows(const Context<B>& ctx, model_type& model, const Batch& batch, std::int64_t first,
                  std::int64_t rows) {
    const std::int64_t T = batch.T;
    const auto at = static_cast<std::size_t>(first * T);
    const auto n = static_cast<std::size_t>(rows * T);
    const TokenRows mine = local_rows(sequence_split_of(strategy_),
                                      {batch.inputs.subspan(at, n), batch.targets.subspan(at, n)},
                                      rows, T, local_tokens_);
    stage_tokens(ctx, model, mine.inputs, mine.targets);
  }

  /// The model names its vocabulary, so `stage_tokens` checks the ids on the host (and a device
  /// embedding's bounds flag need not be read back); otherwise the model checks them itself.
  static constexpr bool checks_tokens = requires(model_type & m) { m.config().vocab; };

  /// This rank's inputs and targets of the step, their ids checked against the model's vocabulary
  /// here, on the host (a device embedding then need not read its bounds flag back): views of
  /// the host batch on Host, one upload into a (2 · n) device buffer otherwise.
  void stage_tokens(const Context<B>& ctx, model_type& model, std::span<const std::int32_t> inputs,
                    std::span<const std::int32_t> targets) {
    const auto n = static_cast<std::int64_t>(inputs.size());
    if constexpr (checks_tokens) {
      check_token_ids(inputs, model.config().vocab, "input");
      check_token_ids(targets, model.config().vocab, "target");
    }
    if constexpr (!B::on_device) {
      (void)ctx;
      host_inputs_ = inputs;
      host_targets_ = targets;
    } else {
      staged_.assign(inputs.begin(), inputs.end());
      staged_.insert(staged_.end(), targets.begin(), targets.end());
      if (device_tokens_.numel() != 2 * n) {
        device_tokens_ = Tensor<std::int32_t, B>(Shape{2 * n}, MemTag::activations, ctx.memory());
      }
      Ops<B>::from_host(ctx, device_tokens_.data(), staged_.data(), 2 * n);
    }
  }

  /// A (shape) view of the staged inputs or targets from element `at` of this rank's rows.
  Tensor<std::int32_t, B> staged(bool targets, std::int64_t at, Shape shape) {
    if constexpr (!B::on_device) {
      const auto ids = targets ? host_targets_ : host_inputs_;
      return Tensor<std::int32_t, B>::view_of(const_cast<std::int32_t*>(ids.data()) + at, shape);
    } else {
      return device_tokens_.slice((targets ? device_tokens_.numel() / 2 : 0) + at, shape);
    }
  }

  static void check_token_ids(std::span<const std::int32_t> ids, std::int64_t vocab,
                              const char* what) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      check<ShapeError>(ids[i] >= 0 && ids[i] < vocab, "fourway: ", what, " token id ", ids[i],
                        " at position ", i, " of this rank's rows is outside the vocabulary [0, ",
                        vocab, ")");
    }
  }

  TrainerOptions opts_;
  S strategy_;
  LossScaler scaler_;
  typename model_type::Stash stash_{};
  std::span<const std::int32_t> host_inputs_;  // Host: this rank's rows of the batch
  std::span<const std::int32_t> host_targets_;
  std::vector<std::int32_t>
      local_tokens_;                       // context parallelism: this rank's parts, inputs|targets
  std::vector<std::int32_t> staged_;       // device backends: the host side of the upload
  Tensor<std::int32_t, B> device_tokens_;  // device backends: (2 · M·b·T) inputs, then targets
  StepReport report_{};
  long iteration_ = 0;
  StepCapture capture_ = opts_.capture;
  std::string capture_note_;  // why the step is not captured
  std::conditional_t<capturable, StepGraph<B>, std::monostate> graph_;
  std::optional<CaptureKey> graph_key_;  // what graph_ was recorded for
  std::optional<CaptureKey> warm_key_;   // the key whose step last ran uncaptured
  long captures_ = 0;
  long replays_ = 0;
};

}  // namespace fourway
