//! `pp::Executor`: runs any schedule table that `schedule::check` accepts on one pipeline rank,
//! over the chunks of a model this rank holds (one model part per chunk, parallel/pp/
//! partition.hpp: `pipeline_chunk` below; tensor-parallel parts make a pipeline of tensor-parallel
//! stages), for one optimizer step. What passes between chunks has the chunk's `boundary_shape(b,
//! T)`.
//!
//! Semantics (`schedule::Blocking::eager`, what the checker proved the table safe under):
//!   - messages travel on the pipeline's streams (parallel/pp/links.hpp): one two-rank
//!     communicator per (sender, receiver, kind), so a send that waits for its recv (NCCL's
//!     rendezvous) holds back only later sends of its own stream, never the rank;
//!   - actions run in the table's order; a run of consecutive p2p actions is one group: on every
//!     stream it touches its operations are posted between `group_start()` and `group_end()`
//!     (ncclGroupStart / ncclGroupEnd on NCCL, the same calls on every backend), sends first;
//!     the sends are waited before their buffer is freed or at the end of the step, and the rank
//!     waits for every recv of the group;
//!   - a message is the tensor alone (the table knows every message's size), under the table's
//!     tag (`schedule::message_tag`); NCCL matches by order, not tag, and the checker proves that
//!     each stream's recvs come in the order of its sends (schedule/check.hpp); the strict world
//!     (docs/comm.md) checks the tags as it matches by order;
//!   - chunks that follow each other on this rank (the turn of a V) hand over in memory;
//!   - F(mb, c) runs chunk c's units in model order (embedding on chunk 0, head + loss on the
//!     last chunk); BW(mb, c) runs them backwards and frees the micro-batch's activations;
//!   - split backward: B(mb, c) runs the chunk's backward under a `DeferWeightGrads` scope, so
//!     it computes the input gradients (and LayerNorm, bias and embedding gradients) and pushes
//!     every matrix weight-gradient GEMM, with copies of its operands, to the (mb, c) slot's
//!     `WeightGradQueue` (layers/weight_grad_queue.hpp); W(mb, c) runs that queue into the
//!     gradients and frees the copies. What the queue holds between B and W is counted by the
//!     accountant as activations (docs/pipeline.md).
//!
//! Gradients accumulate over micro-batches (`+=`); the caller passes the grad scale that makes
//! the sum that of the global-batch mean (train/strategy.hpp). Each compute and p2p group is
//! timed (steady clock) into `spans()` for the trace and the measured idle fraction.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/comm/group.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/model_part.hpp"
#include "fourway/layers/weight_grad_queue.hpp"
#include "fourway/parallel/pp/links.hpp"
#include "fourway/schedule/action.hpp"
#include "fourway/schedule/check.hpp"
#include "fourway/schedule/table.hpp"

namespace fourway::pp {

/// What the executor needs from a communicator: point-to-point, async, and split (to make the
/// pipeline's streams). Groups (`group_start` / `group_end`) are used where the communicator has
/// them.
template <class C>
concept p2p_communicator = requires(C& c, const float* s, float* r, std::int64_t n, int i) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.send_async(s, n, i, i) } -> std::same_as<Work>;
  { c.recv_async(r, n, i, i) } -> std::same_as<Work>;
  { c.split(i, i) } -> std::same_as<C>;
};

// Groups of point-to-point operations on a communicator that has them (comm/group.hpp).
using fourway::group_end;
using fourway::group_start;

/// One micro-batch's token ids and targets, (b, T) on the backend.
template <backend B>
struct MicroBatch {
  Tensor<std::int32_t, B> tokens;
  Tensor<std::int32_t, B> targets;
};

/// A unit of a compute action, or the action itself (`unit` -1), before or after it runs. `unit`
/// is the chunk's own numbering: the embedding 0 when the chunk has it, its blocks, the head last
/// (the `units()` / `visit_unit_parameters` numbering of the chunk). W (`Op::backward_weight`)
/// has the action events only: it runs the dW GEMMs B queued, which read no weights.
struct UnitEvent {
  schedule::Op op = schedule::Op::forward;
  int chunk = 0;
  int unit = -1;
  bool before = true;
};

/// A timed piece of a step: a compute action, or a p2p group (op = its first action's).
struct ExecSpan {
  schedule::Op op = schedule::Op::forward;
  int micro_batch = 0;
  int chunk = 0;
  double start = 0.0;  // seconds since the step began
  double end = 0.0;
};

/// What the executor runs a chunk with: a model part's units one at a time (models::Gpt and
/// split over a tp group both are, and so can a model of the user's own). A chunk whose LM head is
/// tied to its embedding also has `wte()` (train/pipeline_strategy.hpp sums the two copies'
/// gradients).
template <class M, class T, class B>
concept pipeline_chunk = requires(M& m, const Context<B>& ctx, typename M::Stash& s,
                                  const Tensor<T, B>& x, const Tensor<std::int32_t, B>& ids,
                                  std::int64_t n) {
  { m.part() } -> std::convertible_to<ModelPart>;
  { m.boundary_shape(n, n) } -> std::same_as<Shape>;
  { m.forward_embedding(ctx, ids, s) } -> std::same_as<Tensor<T, B>>;
  { m.forward_block(ctx, 0, x, s) } -> std::same_as<Tensor<T, B>>;
  { m.forward_head(ctx, x, ids, s) } -> std::convertible_to<float>;
  { m.backward_head(ctx, s, 1.0f) } -> std::same_as<Tensor<T, B>>;
  { m.backward_block(ctx, 0, x, s) } -> std::same_as<Tensor<T, B>>;
  m.backward_embedding(ctx, x, s);
};

template <floating_dtype T, backend B, p2p_communicator Comm, class Model>
requires pipeline_chunk<Model, T, B>
class Executor {
 public:
  /// `chunks[c]` is chunk c's model part when this rank holds chunk c, else null.
  Executor(const Context<B>& ctx, Comm& comm, const schedule::Table& table,
           std::vector<Model*> chunks)
      : ctx_(&ctx),
        comm_(&comm),
        table_((schedule::verify(table, schedule::Blocking::eager), table)),  // before any split
        chunks_(std::move(chunks)),
        links_(comm, table) {
    check<ConfigError>(comm.size() == table.ranks, "fourway: the pipeline group has ", comm.size(),
                       " ranks but the schedule '", table.name, "' has ", table.ranks);
    check<ConfigError>(static_cast<int>(chunks_.size()) == table.chunks(),
                       "fourway: the executor got ", chunks_.size(), " chunk slots for ",
                       table.chunks(), " chunks");
    for (int c = 0; c < table.chunks(); ++c) {
      check<ConfigError>((table.rank_of(c) == comm.rank()) == (chunks_[idx(c)] != nullptr),
                         "fourway: pipeline rank ", comm.rank(),
                         (chunks_[idx(c)] ? " holds" : " lacks"), " chunk ", c,
                         ", which the schedule places on rank ", table.rank_of(c));
    }
  }

  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  /// Waits for the sends still in flight (after a failure: they fail fast), so that no
  /// communicator thread reads a freed buffer.
  ~Executor() {
    for (auto& p : pending_) {
      try {
        p.wait();
      } catch (...) {  // NOLINT(bugprone-empty-catch): the step already failed and reported why
      }
    }
  }

  [[nodiscard]] const schedule::Table& table() const { return table_; }
  [[nodiscard]] const std::vector<ExecSpan>& spans() const { return spans_; }
  /// Called on this rank's thread after every compute action (tests observe B and W with it).
  void on_compute(std::function<void(const schedule::Action&)> f) { on_compute_ = std::move(f); }
  /// Called before and after every unit a compute action runs, and at the action's start and end
  /// (`UnitEvent::unit` -1): the owner of the chunks' units (ZeRO-2/3 across the replicas of a
  /// stage, train/pipeline_strategy.hpp) gathers and reduces there.
  void on_unit(std::function<void(const UnitEvent&)> f) { on_unit_ = std::move(f); }
  /// When the last `run` began: the origin of its spans (to line up the ranks' spans).
  [[nodiscard]] std::chrono::steady_clock::time_point spans_origin() const { return t0_; }

  /// Runs the table once: forwards and backwards of every micro-batch on this rank's chunks.
  /// Returns Σ over micro-batches of (mean loss · rows) on the rank holding the last chunk, 0
  /// elsewhere. Gradients are added to the chunks' parameters. A `forward_only` table
  /// (`schedule::forward_only`, an evaluation) runs the forwards alone: each F frees its stash
  /// at once, keeping only the boundary it hands on, and `grad_scale` is unused.
  double run(std::span<const MicroBatch<B>> mbs, float grad_scale) {
    check<ConfigError>(static_cast<int>(mbs.size()) == table_.micro_batches, "fourway: the ",
                       "schedule runs ", table_.micro_batches, " micro-batches, got ", mbs.size());
    const int C = table_.chunks();
    const std::int64_t b = mbs[0].tokens.shape()[0];
    const std::int64_t Tn = mbs[0].tokens.shape()[1];
    dims_ = {b, Tn, first_chunk().config().dim};
    boundary_ = first_chunk().boundary_shape(b, Tn);
    for (Model* m : chunks_) {  // a chunk without the embedding cannot see T in its input
      if constexpr (requires { m->set_sequence_length(Tn); })
        if (m != nullptr) m->set_sequence_length(Tn);
    }
    slots_.clear();
    slots_.resize(static_cast<std::size_t>(table_.micro_batches * C));
    pending_.clear();
    spans_.clear();
    t0_ = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    const auto& row = table_.actions[static_cast<std::size_t>(comm_->rank())];
    for (std::size_t i = 0; i < row.size();) {
      const schedule::Action& a = row[i];
      if (schedule::is_compute(a.op)) {
        const double s = now();
        loss_sum += compute(a, mbs, grad_scale);
        spans_.push_back({a.op, a.micro_batch, a.chunk, s, now()});
        if (on_compute_) on_compute_(a);
        ++i;
        continue;
      }
      const std::size_t end = schedule::detail::group_end(row, i);
      const double s = now();
      exchange(row, i, end);
      spans_.push_back({a.op, a.micro_batch, a.chunk, s, now()});
      i = end;
    }
    for (auto& p : pending_) p.wait();
    pending_.clear();
    slots_.clear();
    return loss_sum;
  }

 private:
  using Op = schedule::Op;

  /// What one (micro-batch, chunk) keeps between its actions.
  struct Slot {
    typename Model::Stash stash;
    Tensor<T, B> input;                  // received activation (kept until the backward)
    Tensor<T, B> output;                 // view of F's output (in the stash)
    Tensor<T, B> grad_in;                // received d loss / d output
    Tensor<T, B> grad_out;               // B's d loss / d input
    WeightGradQueue<T, B> weight_grads;  // B's deferred dW GEMMs, run and freed by W
  };
  /// A posted send and the buffer it reads.
  struct Pending {
    int micro_batch = 0;
    int chunk = 0;
    bool gradient = false;
    Tensor<T, B> keep;  // the gradient being sent (activations stay in their stash)
    Work work;
    void wait() { work.wait(); }
  };

  static std::size_t idx(int i) { return static_cast<std::size_t>(i); }
  [[nodiscard]] double now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  Model& first_chunk() {
    for (Model* m : chunks_)
      if (m) return *m;
    throw ConfigError("fourway: pipeline rank holds no chunk");
  }
  Slot& slot(int mb, int c) { return slots_[idx(mb * table_.chunks() + c)]; }
  [[nodiscard]] bool local(int c) const { return table_.rank_of(c) == comm_->rank(); }
  [[nodiscard]] Shape shape() const { return boundary_; }

  double compute(const schedule::Action& a, std::span<const MicroBatch<B>> mbs, float grad_scale) {
    unit_event(a.op, a.chunk, -1, true);
    const double loss = run_action(a, mbs, grad_scale);
    unit_event(a.op, a.chunk, -1, false);
    return loss;
  }
  void unit_event(Op op, int c, int u, bool before) {
    if (on_unit_) on_unit_(UnitEvent{op, c, u, before});
  }
  /// Runs `f()` as unit u of chunk c inside action `op` (an exception skips the after event:
  /// the step is abandoned).
  template <class F>
  auto as_unit(Op op, int c, int u, F&& f) {
    unit_event(op, c, u, true);
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      unit_event(op, c, u, false);
    } else {
      auto r = f();
      unit_event(op, c, u, false);
      return r;
    }
  }

  double run_action(const schedule::Action& a, std::span<const MicroBatch<B>> mbs,
                    float grad_scale) {
    const int mb = a.micro_batch;
    const int c = a.chunk;
    Model& g = *chunks_[idx(c)];
    Slot& s = slot(mb, c);
    const auto& part = g.part();
    // the chunk's own unit numbers: the embedding 0 (when it has it), its blocks, the head last
    const int first_block_unit = part.embedding ? 1 : 0;
    const int head_unit = first_block_unit + (part.end_block - part.first_block);
    const auto block_unit = [&](int i) { return first_block_unit + (i - part.first_block); };
    if (a.op == Op::forward) {
      Tensor<T, B> x;
      if (part.embedding) {
        x = as_unit(a.op, c, 0,
                    [&] { return g.forward_embedding(*ctx_, mbs[idx(mb)].tokens, s.stash); });
      } else {
        x = (local(c - 1) ? slot(mb, c - 1).output : s.input).view();
      }
      for (int i = part.first_block; i < part.end_block; ++i)
        x = as_unit(a.op, c, block_unit(i), [&] { return g.forward_block(*ctx_, i, x, s.stash); });
      if (part.head) {
        const float loss = as_unit(a.op, c, head_unit, [&] {
          return g.forward_head(*ctx_, x, mbs[idx(mb)].targets, s.stash);
        });
        if (table_.forward_only) forget_inputs(mb, c);
        return static_cast<double>(loss) * static_cast<double>(dims_[0]);
      }
      if (table_.forward_only) {
        // evaluation: the boundary is all that lives on (until sent or read by the next chunk)
        Tensor<T, B> kept(x.shape(), MemTag::activations, ctx_->memory());
        Ops<B>::copy(*ctx_, kept.data(), x.data(), x.numel());
        forget_inputs(mb, c);
        s.output = std::move(kept);
        return 0.0;
      }
      s.output = std::move(x);
      return 0.0;
    }
    if (a.op == Op::backward_weight) {
      s.weight_grads.run(*ctx_);
      return 0.0;
    }
    std::optional<DeferWeightGrads<T, B>> defer;
    if (a.op == Op::backward_input) defer.emplace(s.weight_grads);
    Tensor<T, B> dx;
    if (part.head) {
      dx = as_unit(a.op, c, head_unit, [&] { return g.backward_head(*ctx_, s.stash, grad_scale); });
    } else {
      Slot& next = slot(mb, c + 1);
      dx = local(c + 1) ? std::move(next.grad_out) : std::move(s.grad_in);
    }
    for (int i = part.end_block; i-- > part.first_block;)
      dx = as_unit(a.op, c, block_unit(i), [&] { return g.backward_block(*ctx_, i, dx, s.stash); });
    if (part.embedding) {
      as_unit(a.op, c, 0, [&] { g.backward_embedding(*ctx_, dx, s.stash); });
    } else {
      s.grad_out = std::move(dx);
    }
    finish_sends(mb, c, false);  // the activation sent from this stash has arrived
    s.stash = typename Model::Stash{};
    s.output.reset();
    s.input.reset();
    s.grad_in.reset();
    return 0.0;
  }

  /// Forward-only tables: after F(mb, c), its stash and its input (the received activation, or
  /// the previous local chunk's kept output) are freed; nothing runs backward through them.
  void forget_inputs(int mb, int c) {
    Slot& s = slot(mb, c);
    s.stash = typename Model::Stash{};
    s.input.reset();
    if (c > 0 && local(c - 1)) slot(mb, c - 1).output.reset();
  }

  void finish_sends(int mb, int c, bool gradient) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->micro_batch == mb && it->chunk == c && it->gradient == gradient) {
        it->wait();
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// One group of p2p actions: on every stream it touches, the sends then the recvs are posted
  /// between group_start and group_end; then the rank waits for the recvs.
  void exchange(const std::vector<schedule::Action>& row, std::size_t lo, std::size_t hi) {
    const int C = table_.chunks();
    std::vector<Comm*> touched;
    auto stream = [&](Comm& c) -> Comm& {
      if (std::find(touched.begin(), touched.end(), &c) == touched.end()) {
        touched.push_back(&c);
        pp::group_start(c);
      }
      return c;
    };
    struct Incoming {
      const schedule::Action* a;
      Work work;
    };
    std::vector<Incoming> in;
    try {
      for (std::size_t i = lo; i < hi; ++i) {
        const schedule::Action& a = row[i];
        if (!schedule::is_send(a.op)) continue;
        Slot& s = slot(a.micro_batch, a.chunk);
        Pending p;
        p.micro_batch = a.micro_batch;
        p.chunk = a.chunk;
        p.gradient = a.op == Op::send_gradient;
        const Tensor<T, B>& data = p.gradient ? s.grad_out : s.output;
        check<ShapeError>(data.numel() == a.elements || a.elements <= 1, "fourway: pipeline rank ",
                          comm_->rank(), " sends ", data.numel(), " elements for ",
                          schedule::to_string(a), " but the table says ", a.elements);
        p.work = stream(links_.to(a.peer, p.gradient))
                     .send_async(data.data(), data.numel(), 1, schedule::message_tag(a, C));
        if (p.gradient) p.keep = std::move(s.grad_out);
        if (table_.forward_only) p.keep = std::move(s.output);  // freed when the send is done
        pending_.push_back(std::move(p));
      }
      for (std::size_t i = lo; i < hi; ++i) {
        const schedule::Action& a = row[i];
        if (!schedule::is_recv(a.op)) continue;
        const bool grad = a.op == Op::recv_gradient;
        // the consumer: the next chunk's input, or the previous chunk's output gradient
        Slot& s = slot(a.micro_batch, grad ? a.chunk - 1 : a.chunk + 1);
        Tensor<T, B>& buf = grad ? s.grad_in : s.input;
        buf = Tensor<T, B>(shape(), grad ? MemTag::workspace : MemTag::activations, ctx_->memory());
        in.push_back(
            {&a, stream(links_.from(a.peer, grad))
                     .recv_async(buf.data(), buf.numel(), 0, schedule::message_tag(a, C))});
      }
    } catch (...) {
      for (Comm* c : touched) pp::group_end(*c);
      throw;
    }
    for (Comm* c : touched) pp::group_end(*c);
    std::exception_ptr first;
    for (auto& m : in) {  // every recv finishes before we go on (or unwind): its buffer lives here
      try {
        m.work.wait();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
    // drop finished gradient sends early: their buffers are workspace (and, forward-only, the
    // activations sent)
    for (auto it = pending_.begin(); it != pending_.end();) {
      if ((it->gradient || table_.forward_only) && it->work.test()) {
        it->wait();
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  const Context<B>* ctx_;
  Comm* comm_;
  schedule::Table table_;
  std::vector<Model*> chunks_;
  std::vector<Slot> slots_;
  std::vector<Pending> pending_;
  std::vector<ExecSpan> spans_;
  std::function<void(const schedule::Action&)> on_compute_;
  std::function<void(const UnitEvent&)> on_unit_;
  std::array<std::int64_t, 3> dims_{};  // b, T, C
  Shape boundary_;                      // what passes between chunks
  std::chrono::steady_clock::time_point t0_{};
  Links<Comm> links_;  // last: made (a collective) after the checks above
};

}  // namespace fourway::pp
