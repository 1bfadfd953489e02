//! A model's loss from its per-token losses, where the caller wants it: read back as the mean
//! (one synchronising call), or left on the backend in a `LossSink` (none). Every model's loss
//! ends here — the GPT's head, the vocabulary-parallel loss, and a model of your own — so any
//! model whose forward takes a sink gives the Trainer what the GPT's `forward_into` gives: a
//! step whose only synchronising call is the strategy's read-out of its scalars
//! (docs/trainer.md, "Synchronisation").
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/layers/layer.hpp"

namespace fourway {

/// The mean of `rows` per-token losses (fp32 on the backend) read back to the host; or, with a
/// sink, `sink->weight` × their sum added to `*sink->sum` on the backend, nothing read back, and
/// NaN returned.
template <class B>
float model_loss(const Context<B>& ctx, const float* losses, std::int64_t rows,
                 const LossSink* sink) {
  if (sink != nullptr) {
    Ops<B>::sum_into(ctx, sink->sum, losses, rows, sink->weight);
    return std::numeric_limits<float>::quiet_NaN();
  }
  std::vector<float> host(static_cast<std::size_t>(rows));
  Ops<B>::to_host(ctx, host.data(), losses, rows);
  double sum = 0.0;
  for (float l : host) sum += l;
  return static_cast<float>(sum / static_cast<double>(rows));
}

}  // namespace fourway
