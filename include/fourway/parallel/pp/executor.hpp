//! `pp::Executor`: runs any schedule table that `schedule::check` accepts on one pipeline rank,
//! over the chunks of a GPT this rank holds (one `models::Gpt` part per chunk, parallel/pp/
//! partition.hpp, or one `tp::Gpt` part: a pipeline of tensor-parallel stages), for one
//! optimizer step. What passes between chunks has the chunk's `boundary_shape(b, T)`.
//!
//! Semantics (`schedule::Blocking::eager`, what the checker proved the table safe under):
//!   - actions run in the table's order; a run of consecutive p2p actions is one group: its
//!     sends are posted first (`send_async`, waited before the buffer is freed or at the end of
//!     the step), then its recvs (`recv_async`), and the rank waits for every recv of the group;
//!   - every message is a 6-integer header {kind, micro-batch, chunk, b, T, C} then the tensor,
//!     both under the table's tag (`schedule::message_tag`); the receiver compares the header
//!     with what its table expects and throws `CommMismatch` naming both when they differ, so a
//!     transport that swaps two messages (NCCL matches by order, not tag) fails loudly;
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

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/layers/weight_grad_queue.hpp"
#include "fourway/schedule/action.hpp"
#include "fourway/schedule/check.hpp"
#include "fourway/schedule/table.hpp"

namespace fourway::pp {

/// What the executor needs from a communicator: point-to-point, async.
template <class C>
concept p2p_communicator = requires(C& c, const float* s, float* r, std::int64_t n, int i) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.send_async(s, n, i, i) } -> std::same_as<Work>;
  { c.recv_async(r, n, i, i) } -> std::same_as<Work>;
};

/// One micro-batch's token ids and targets, (b, T) on the backend.
template <backend B>
struct MicroBatch {
  Tensor<std::int32_t, B> tokens;
  Tensor<std::int32_t, B> targets;
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
/// tp::Gpt both are, and so can a model of the user's own). A chunk whose LM head is tied to its
/// embedding also has `wte()` (train/pipeline_strategy.hpp sums the two copies' gradients).
template <class M, class T, class B>
concept pipeline_chunk = requires(M& m, const Context<B>& ctx, typename M::Stash& s,
                                  const Tensor<T, B>& x, const Tensor<std::int32_t, B>& ids,
                                  std::int64_t n) {
  { m.part() } -> std::convertible_to<models::GptPart>;
  { m.boundary_shape(n, n) } -> std::same_as<Shape>;
  { m.forward_embedding(ctx, ids, s) } -> std::same_as<Tensor<T, B>>;
  { m.forward_block(ctx, 0, x, s) } -> std::same_as<Tensor<T, B>>;
  { m.forward_head(ctx, x, ids, s) } -> std::convertible_to<float>;
  { m.backward_head(ctx, s, 1.0f) } -> std::same_as<Tensor<T, B>>;
  { m.backward_block(ctx, 0, x, s) } -> std::same_as<Tensor<T, B>>;
  m.backward_embedding(ctx, x, s);
};

template <floating_dtype T, backend B, p2p_communicator Comm, class Model = models::Gpt<T, B>>
requires pipeline_chunk<Model, T, B>
class Executor {
 public:
  /// `chunks[c]` is chunk c's model part when this rank holds chunk c, else null.
  Executor(const Context<B>& ctx, Comm& comm, const schedule::Table& table,
           std::vector<Model*> chunks)
      : ctx_(&ctx), comm_(&comm), table_(table), chunks_(std::move(chunks)) {
    check<ConfigError>(comm.size() == table.ranks, "fourway: the pipeline group has ", comm.size(),
                       " ranks but the schedule '", table.name, "' has ", table.ranks);
    check<ConfigError>(static_cast<int>(chunks_.size()) == table.chunks(),
                       "fourway: the executor got ", chunks_.size(), " chunk slots for ",
                       table.chunks(), " chunks");
    schedule::verify(table_, schedule::Blocking::eager);
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
  /// When the last `run` began: the origin of its spans (to line up the ranks' spans).
  [[nodiscard]] std::chrono::steady_clock::time_point spans_origin() const { return t0_; }

  /// Runs the table once: forwards and backwards of every micro-batch on this rank's chunks.
  /// Returns Σ over micro-batches of (mean loss · rows) on the rank holding the last chunk, 0
  /// elsewhere. Gradients are added to the chunks' parameters.
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
  static constexpr int header_size = 6;

  /// What one (micro-batch, chunk) keeps between its actions.
  struct Slot {
    typename Model::Stash stash;
    Tensor<T, B> input;                  // received activation (kept until the backward)
    Tensor<T, B> output;                 // view of F's output (in the stash)
    Tensor<T, B> grad_in;                // received d loss / d output
    Tensor<T, B> grad_out;               // B's d loss / d input
    WeightGradQueue<T, B> weight_grads;  // B's deferred dW GEMMs, run and freed by W
  };
  /// A posted send and the buffers it reads.
  struct Pending {
    int micro_batch = 0;
    int chunk = 0;
    bool gradient = false;
    std::vector<std::int64_t> header;
    Tensor<T, B> keep;  // the gradient being sent (activations stay in their stash)
    Work header_work;
    Work data_work;
    void wait() {
      header_work.wait();
      data_work.wait();
    }
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
    const int mb = a.micro_batch;
    const int c = a.chunk;
    Model& g = *chunks_[idx(c)];
    Slot& s = slot(mb, c);
    const auto& part = g.part();
    if (a.op == Op::forward) {
      Tensor<T, B> x;
      if (part.embedding) {
        x = g.forward_embedding(*ctx_, mbs[idx(mb)].tokens, s.stash);
      } else {
        x = (local(c - 1) ? slot(mb, c - 1).output : s.input).view();
      }
      for (int i = part.first_block; i < part.end_block; ++i)
        x = g.forward_block(*ctx_, i, x, s.stash);
      if (part.head) {
        const float loss = g.forward_head(*ctx_, x, mbs[idx(mb)].targets, s.stash);
        return static_cast<double>(loss) * static_cast<double>(dims_[0]);
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
      dx = g.backward_head(*ctx_, s.stash, grad_scale);
    } else {
      Slot& next = slot(mb, c + 1);
      dx = local(c + 1) ? std::move(next.grad_out) : std::move(s.grad_in);
    }
    for (int i = part.end_block; i-- > part.first_block;)
      dx = g.backward_block(*ctx_, i, dx, s.stash);
    if (part.embedding) {
      g.backward_embedding(*ctx_, dx, s.stash);
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

  [[nodiscard]] std::vector<std::int64_t> header_of(const schedule::Action& a) const {
    const bool grad = a.op == Op::send_gradient || a.op == Op::recv_gradient;
    return {grad ? 1 : 0, a.micro_batch, a.chunk, dims_[0], dims_[1], dims_[2]};
  }
  static std::string describe_header(const std::vector<std::int64_t>& h) {
    return detail::cat(h[0] ? "gradient" : "activation", " of micro-batch ", h[1], " from chunk ",
                       h[2], " shaped (", h[3], ", ", h[4], ", ", h[5], ")");
  }

  /// One group of p2p actions: post the sends, then the recvs; wait for the recvs; check them.
  void exchange(const std::vector<schedule::Action>& row, std::size_t lo, std::size_t hi) {
    const int C = table_.chunks();
    for (std::size_t i = lo; i < hi; ++i) {
      const schedule::Action& a = row[i];
      if (!schedule::is_send(a.op)) continue;
      const int tag = schedule::message_tag(a, C);
      Slot& s = slot(a.micro_batch, a.chunk);
      Pending p;
      p.micro_batch = a.micro_batch;
      p.chunk = a.chunk;
      p.gradient = a.op == Op::send_gradient;
      p.header = header_of(a);
      const Tensor<T, B>& data = p.gradient ? s.grad_out : s.output;
      check<ShapeError>(data.numel() == a.elements || a.elements <= 1, "fourway: pipeline rank ",
                        comm_->rank(), " sends ", data.numel(), " elements for ",
                        schedule::to_string(a), " but the table says ", a.elements);
      p.header_work = comm_->send_async(p.header.data(), header_size, a.peer, tag);
      p.data_work = comm_->send_async(data.data(), data.numel(), a.peer, tag);
      if (p.gradient) p.keep = std::move(s.grad_out);
      pending_.push_back(std::move(p));
    }
    struct Incoming {
      const schedule::Action* a;
      std::vector<std::int64_t> header;
      Work header_work;
      Work data_work;
    };
    std::vector<Incoming> in;
    for (std::size_t i = lo; i < hi; ++i) {
      const schedule::Action& a = row[i];
      if (!schedule::is_recv(a.op)) continue;
      const int tag = schedule::message_tag(a, C);
      const bool grad = a.op == Op::recv_gradient;
      // the consumer: the next chunk's input, or the previous chunk's output gradient
      Slot& s = slot(a.micro_batch, grad ? a.chunk - 1 : a.chunk + 1);
      Tensor<T, B>& buf = grad ? s.grad_in : s.input;
      buf = Tensor<T, B>(shape(), grad ? MemTag::workspace : MemTag::activations, ctx_->memory());
      Incoming m{&a, std::vector<std::int64_t>(header_size, -1), {}, {}};
      m.header_work = comm_->recv_async(m.header.data(), header_size, a.peer, tag);
      m.data_work = comm_->recv_async(buf.data(), buf.numel(), a.peer, tag);
      in.push_back(std::move(m));
    }
    try {
      for (auto& m : in) {
        m.header_work.wait();
        std::exception_ptr data_error;  // the buffer stays alive until its recv is done either way
        try {
          m.data_work.wait();
        } catch (...) {
          data_error = std::current_exception();
        }
        const auto want = header_of(*m.a);
        check<CommMismatch>(m.header == want, "fourway: pipeline rank ", comm_->rank(),
                            " expected the ", describe_header(want), " from rank ", m.a->peer,
                            " under tag ", schedule::message_tag(*m.a, C), " (",
                            schedule::to_string(*m.a), ") but received the ",
                            describe_header(m.header),
                            ": messages were swapped or the ranks run different schedules");
        if (data_error) std::rethrow_exception(data_error);
      }
    } catch (...) {
      for (auto& m : in) {  // no recv may still write into a buffer once we unwind
        try {
          m.header_work.wait();
          m.data_work.wait();
        } catch (...) {  // NOLINT(bugprone-empty-catch): the first failure is rethrown below
        }
      }
      throw;
    }
    // drop finished gradient sends early: their buffers are workspace
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->gradient && it->header_work.test() && it->data_work.test()) {
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
  std::array<std::int64_t, 3> dims_{};  // b, T, C (the messages' header)
  Shape boundary_;                      // what passes between chunks
  std::chrono::steady_clock::time_point t0_{};
};

}  // namespace fourway::pp
