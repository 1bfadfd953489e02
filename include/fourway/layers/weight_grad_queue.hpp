//! `WeightGradQueue<T, B>`: the weight-gradient half (W) of a split backward, as zero-bubble
//! pipeline schedules (Qi et al. 2023) need it. While a `DeferWeightGrads` scope is alive on a
//! thread, the matrix layers' backward on that thread (Linear, the GPT's tied LM head) computes
//! its input gradient as usual but, instead of the GEMM dW += Aᵀ·D, pushes (A, D) here; `run`
//! performs the pushed GEMMs later, into the same gradient buffers, with the same arguments.
//!
//! ```
//!   { DeferWeightGrads<T, B> scope(q); dx = layer.backward(ctx, dy, s); }  // B: dx only
//!   q.run(ctx);                                                           // W: dW += xᵀ·dy
//! ```
//! Each entry owns A (rows, m) and D (rows, n) (MemTag::activations, so the accountant counts
//! what W keeps alive): a view is copied (the stash it points into is freed by B), an owning
//! tensor is moved in. Entries run in push order, so per micro-batch and parameter the GEMM is
//! the one the fused backward would run: gradients are bitwise equal when W's run in B's order.
//! LayerNorm gains and biases, biases and the embedding tables keep their gradients in B.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "fourway/backend/matmul.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/memory.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/parameter.hpp"

namespace fourway {

template <floating_dtype T, backend B>
class WeightGradQueue {
 public:
  WeightGradQueue() = default;
  WeightGradQueue(const WeightGradQueue&) = delete;
  WeightGradQueue& operator=(const WeightGradQueue&) = delete;
  WeightGradQueue(WeightGradQueue&&) noexcept = default;
  WeightGradQueue& operator=(WeightGradQueue&&) noexcept = default;
  ~WeightGradQueue() = default;

  /// Defers p.grad (m, n) += aᵀ·d with a (rows, m) and d (rows, n), row-major.
  void push(const Context<B>& ctx, Parameter<T, B>& p, Tensor<T, B> a, Tensor<T, B> d,
            std::int64_t rows) {
    check<ShapeError>(a.numel() % rows == 0 && d.numel() % rows == 0 &&
                          p.grad.numel() == (a.numel() / rows) * (d.numel() / rows),
                      "fourway: deferred weight gradient of ", p.name, " ", p.grad.shape().str(),
                      " from ", a.shape().str(), " and ", d.shape().str(), " over ", rows,
                      " rows does not fit");
    entries_.push_back(Entry{&p, keep(ctx, std::move(a)), keep(ctx, std::move(d)), rows});
  }

  /// W: every pushed GEMM in push order, added to the gradients; then frees what was kept.
  void run(const Context<B>& ctx) {
    for (Entry& e : entries_) {
      const std::int64_t m = e.a.numel() / e.rows;
      const std::int64_t n = e.d.numel() / e.rows;
      // grad (m, n) += Aᵀ (m, rows) · D (rows, n)
      matmul_add(ctx, matrix(e.p->bound_grad().data(), m, n), matrix(e.a.data(), e.rows, m).t(),
                 matrix(e.d.data(), e.rows, n));
    }
    clear();
  }

  void clear() { entries_.clear(); }
  [[nodiscard]] bool empty() const { return entries_.empty(); }
  [[nodiscard]] std::size_t size() const { return entries_.size(); }
  /// Bytes held for W (also reported to the accountant under MemTag::activations).
  [[nodiscard]] std::int64_t bytes() const {
    std::int64_t n = 0;
    for (const Entry& e : entries_) n += e.a.numel() + e.d.numel();
    return n * static_cast<std::int64_t>(sizeof(T));
  }

 private:
  struct Entry {
    Parameter<T, B>* p;  // grad.data() is read at run time, never cached
    Tensor<T, B> a;      // (rows, m)
    Tensor<T, B> d;      // (rows, n)
    std::int64_t rows;
  };

  static Tensor<T, B> keep(const Context<B>& ctx, Tensor<T, B> t) {
    if (t.owning()) return t;
    Tensor<T, B> c(t.shape(), MemTag::activations, ctx.memory());
    Ops<B>::copy(ctx, c.data(), t.data(), t.numel());
    return c;
  }

  std::vector<Entry> entries_;
};

namespace detail {
template <class T, class B>
WeightGradQueue<T, B>*& weight_grad_queue() {
  thread_local WeightGradQueue<T, B>* q = nullptr;
  return q;
}
}  // namespace detail

/// While alive, matrix weight gradients computed on this thread go to `q` (see the file comment).
template <floating_dtype T, backend B>
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WeightGradQueue<T, B>& q)
      : prev_(std::exchange(detail::weight_grad_queue<T, B>(), &q)) {}
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;
  DeferWeightGrads(DeferWeightGrads&&) = delete;
  DeferWeightGrads& operator=(DeferWeightGrads&&) = delete;
  ~DeferWeightGrads() { detail::weight_grad_queue<T, B>() = prev_; }

  /// The queue of the innermost live scope on this thread, or null (compute dW now).
  [[nodiscard]] static WeightGradQueue<T, B>* active() { return detail::weight_grad_queue<T, B>(); }

 private:
  WeightGradQueue<T, B>* prev_;
};

}  // namespace fourway
