//! The vocabulary-parallel LM head and cross-entropy (Megatron-LM's vocab-parallel loss): rank r
//! of the tensor-parallel group holds rows [start, start + Vv) of the output matrix W (Vv <= Vp/N
//! real rows; padding rows never enter a product), computes only its logits (rows, Vv) and joins
//! the softmax with two all-reduces: MAX of the row maxima, then SUM of (Σ exp, target logit).
//! Full logits are never formed, and the backward communicates nothing; the input gradient it
//! returns is this rank's partial sum (the caller reduces it over the group). Used by models::Gpt
//! over a tp group (the tied head, W = wte's slice) and by any tensor-parallel model (an untied
//! head). Both all-reduces are completed in stream order (layers/conjugate.hpp): no host wait.
//! Given a `LossSink`, the loss stays on the device too (added to the sink, as fw::models::Gpt's
//! `forward_into` does), so the forward makes no synchronising call at all; without one it reads
//! the loss back, one synchronising call.
#pragma once

#include <cstdint>
#include <limits>

#include "fourway/backend/matmul.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/layers/conjugate.hpp"
#include "fourway/layers/layer.hpp"
#include "fourway/layers/loss.hpp"

namespace fourway::tp {

/// Where this rank's rows of the head lie and what the forward keeps for the backward.
template <class T, class B>
struct VocabSlice {
  const T* weight = nullptr;  // (Vv, C) this rank's real vocabulary rows
  std::int64_t start = 0;     // first vocabulary id of those rows
  std::int64_t valid = 0;     // Vv (0: a rank whose rows are all padding)
};

/// The mean cross-entropy of `targets` (rows ids, any rank of the group may read any id) for the
/// hidden states h (rows, C); keeps this rank's logits (rows, Vv) and the row statistics (3,
/// rows: max | Σ exp | target logit) for the backward. Without `sink`: one read-back of the
/// loss. With it: `*sink->sum += sink->weight · Σ per-row losses` on the device, no read-back,
/// and NaN is returned (every rank of the group adds the same sum).
/// `reduce(p, count, op)` joins `count` floats at p over the group in place, in stream order (a
/// group of one: nothing).
template <class T, class B, class Reduce>
float vocab_parallel_loss_forward_with(const Context<B>& ctx, Reduce&& reduce,
                                       const VocabSlice<T, B>& w, const T* h, std::int64_t rows,
                                       std::int64_t C, const std::int32_t* targets,
                                       Tensor<T, B>& logits, Tensor<float, B>& stats,
                                       const LossSink* sink = nullptr) {
  const std::int64_t Vv = w.valid;
  stats = detail::activation<float, B>(ctx, Shape{3, rows});
  float* maxes = stats.data();
  float* rest = maxes + rows;  // Σ exp | target logit
  if (Vv > 0) {
    logits = detail::activation<T, B>(ctx, Shape{rows, Vv});
    // logits (rows, Vv) = h (rows, C) · Wᵀ (C, Vv)
    matmul(ctx, matrix(logits), matrix(h, rows, C), matrix(w.weight, Vv, C).t());
    Ops<B>::vocab_local_max(ctx, maxes, logits.data(), rows, Vv);
  } else {
    Ops<B>::fill(ctx, maxes, rows, -std::numeric_limits<float>::infinity());
  }
  reduce(maxes, rows, ReduceOp::max);
  if (Vv > 0) {
    Ops<B>::vocab_local_sumexp(ctx, rest, logits.data(), maxes, rows, Vv);
    Ops<B>::vocab_target_logit(ctx, rest + rows, logits.data(), targets, rows, Vv, w.start);
  } else {
    Ops<B>::fill(ctx, rest, 2 * rows, 0.0f);
  }
  reduce(rest, 2 * rows, ReduceOp::sum);
  Tensor<float, B> losses = detail::workspace<float, B>(ctx, Shape{rows});
  Ops<B>::vocab_loss(ctx, losses.data(), maxes, rest, rest + rows, rows);
  return model_loss(ctx, losses.data(), rows, sink);
}

/// The same over a communicator's group.
template <class T, class B, communicator Comm>
float vocab_parallel_loss_forward(const Context<B>& ctx, Comm& tp, const VocabSlice<T, B>& w,
                                  const T* h, std::int64_t rows, std::int64_t C,
                                  const std::int32_t* targets, Tensor<T, B>& logits,
                                  Tensor<float, B>& stats, const LossSink* sink = nullptr) {
  const auto reduce = [&tp](float* p, std::int64_t count, ReduceOp op) {
    if (tp.size() > 1) all_reduce_in_layer(tp, p, count, op);
  };
  return vocab_parallel_loss_forward_with(ctx, reduce, w, h, rows, C, targets, logits, stats, sink);
}

/// The backward of grad_scale × the mean loss: dh (rows, C) = this rank's partial sum of the
/// input gradient (written); dW (Vv, C) += dlogitsᵀ · h. The logits become their gradient in
/// place; logits and stats are released.
template <class T, class B>
void vocab_parallel_loss_backward(const Context<B>& ctx, const VocabSlice<T, B>& w, T* dweight,
                                  const T* h, std::int64_t rows, std::int64_t C,
                                  const std::int32_t* targets, Tensor<T, B>& logits,
                                  Tensor<float, B>& stats, float grad_scale, T* dh) {
  const std::int64_t Vv = w.valid;
  if (Vv > 0) {
    T* dlogits = logits.data();  // in place
    Ops<B>::vocab_local_grad(ctx, dlogits, logits.data(), targets, stats.data(),
                             stats.data() + rows, rows, Vv, w.start,
                             grad_scale / static_cast<float>(rows));
    const Matrix<T> dL = matrix(dlogits, rows, Vv);
    // dh (rows, C) = dlogits (rows, Vv) · W (Vv, C)
    matmul(ctx, matrix(dh, rows, C), dL, matrix(w.weight, Vv, C));
    // dW (Vv, C) += dlogitsᵀ (Vv, rows) · h (rows, C)
    matmul_add(ctx, matrix(dweight, Vv, C), dL.t(), matrix(h, rows, C));
  } else {
    Ops<B>::fill(ctx, dh, rows * C, convert<T>(0.0f));
  }
  logits.reset();
  stats.reset();
}

}  // namespace fourway::tp
