// Shared by the parallel tests: a tiny GPT trained by the one-rank reference (SingleRank) or by
// ShardedStrategy<Stage> on a LocalWorld of N ranks, with everything the tests compare.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "fourway/comm/counting.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/train/sharded_strategy.hpp"
#include "fourway/train/trainer.hpp"

namespace fw = fourway;

// The data-parallel test harness: one-rank and ShardedStrategy runs of the tiny GPT.
namespace harness {

/// Odd sizes on purpose: no unit, bucket or the whole model divides by 3, 4 or 8.
inline fw::models::GptConfig tiny_gpt(bool checkpoint = false) {
  fw::models::GptConfig c;
  c.layers = 2;
  c.heads = 2;
  c.dim = 12;
  c.vocab = 37;
  c.max_seq = 9;
  c.checkpoint = checkpoint;
  return c;
}
/// The meshes' GPT (the equivalence matrix, the planner against the runtime): 8 heads so that
/// tp 2, 4 and 8 split them; 4 layers for 4 pipeline stages (or 2 x 2 virtual).
inline fw::models::GptConfig mesh_gpt(bool checkpoint = false) {
  fw::models::GptConfig c = tiny_gpt(checkpoint);
  c.layers = 4;
  c.heads = 8;
  c.dim = 16;
  return c;
}
inline constexpr std::int64_t kBatch = 24;  // divides by 1, 2, 3, 4, 8 ranks (x 3 at 1, 2, 4)
inline constexpr std::int64_t kSeq = 5;
inline constexpr std::uint64_t kSeed = 20261129;

inline fw::AdamW adamw(float lr = 1e-2f) {
  fw::AdamWConfig c;
  c.lr = lr;
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.weight_decay = 0.1f;
  c.max_grad_norm = 0.4f;  // global norms here are 0.29-0.70: some steps clip, some do not
  return fw::AdamW(c);
}

/// `sequences` rows of `seq` tokens (and the next one) drawn from the models' vocabulary by a
/// generator seeded with `seed`.
inline fw::TokenBatch random_batch(unsigned seed, std::int64_t sequences, std::int64_t seq) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, tiny_gpt().vocab - 1);
  std::vector<std::int32_t> rows(static_cast<std::size_t>(sequences * (seq + 1)));
  for (auto& t : rows) t = tok(rng);
  return fw::TokenBatch::from_rows(rows, sequences, seq);
}
/// The global batch of step `step` (`sequences` rows): random tokens, the same for every mesh.
inline fw::TokenBatch batch(int step, std::int64_t sequences = kBatch) {
  return random_batch(1000u + static_cast<unsigned>(step), sequences, kSeq);
}

/// Context parallelism cuts every sequence into 2·cp chunks: the meshes' GPT at sequences of 16
/// tokens (8 chunks of 2 at cp 4), 8 sequences per step.
inline constexpr std::int64_t kLongSeq = 16;
inline constexpr std::int64_t kLongBatch = 8;
inline fw::models::GptConfig long_gpt(bool checkpoint = false) {
  fw::models::GptConfig c = mesh_gpt(checkpoint);
  c.max_seq = kLongSeq;
  return c;
}
/// Step `step`'s global batch for long_gpt(): random tokens, the same for every mesh.
inline fw::TokenBatch long_batch(int step) {
  return random_batch(3000u + static_cast<unsigned>(step), kLongBatch, kLongSeq);
}

struct RunConfig {
  int stage = 0;
  int ranks = 1;
  int steps = 20;
  int micro_batches = 1;
  bool checkpoint = false;
  std::int64_t bucket_bytes = 512;  // several buckets for this model
  bool overlap = true;
  fw::LossScalerConfig scaler{};
  int measure_step = 1;         // the step whose communication is counted
  std::int64_t batch = kBatch;  // global sequences per step
  bool deferred = true;         // build the model with Gpt::deferred (the strategy materialises it)
};

struct RankResult {
  std::array<std::size_t, 4> state_bytes{};  // weights, grads, master_weights, optimizer_state
  double step_bytes = 0;         // modelled ring bytes sent in group "dp" in measure_step
  std::uint64_t step_moved = 0;  // bytes LocalWorld measured moving in "dp" in measure_step
  std::size_t peak_weights = 0;  // accountant peak of MemTag::weights, whole run (construction on)
  std::array<std::size_t, fw::mem_tag_count> peak{};  // every tag's peak, whole run
  std::size_t total_peak = 0;                         // the accountant's whole-run peak
  std::int64_t gathered_peak = 0;
  std::int64_t max_unit_bytes = 0;  // largest gathered set of one unit (stage 3)
  std::int64_t shard_elements = 0;
  long skipped = 0;
  float min_clip_coef = 1.0f;  // < 1: clipping on the global norm was active
  std::vector<float> losses;
  std::vector<std::size_t> backend_allocations;  // the accountant's count after every step
  std::vector<std::uint64_t> syncs;  // the context's synchronising calls after every step
};

struct RunResult {
  std::vector<float> losses;               // rank 0
  std::vector<std::vector<float>> params;  // rank 0, gathered, visit order
  std::vector<std::string> names;          // of the parameters
  std::vector<RankResult> ranks;
};

template <class T>
std::vector<std::vector<float>> model_params(fw::models::Gpt<T, fw::Host>& m) {
  std::vector<std::vector<float>> out;
  m.visit_parameters([&](fw::Parameter<T, fw::Host>& p) {
    auto& v = out.emplace_back(static_cast<std::size_t>(p.numel()));
    for (std::int64_t i = 0; i < p.numel(); ++i)
      v[static_cast<std::size_t>(i)] = fw::convert<float>(p.weight[i]);
  });
  return out;
}

/// The one-rank reference.
template <class T>
RunResult run_single(const RunConfig& rc) {
  fw::MemoryAccountant mem(0);
  fw::Context<fw::Host> ctx(mem);
  fw::models::Gpt<T, fw::Host> model(ctx, tiny_gpt(rc.checkpoint), kSeed);
  fw::TrainerOptions opts;
  opts.micro_batches = rc.micro_batches;
  opts.loss_scaler = rc.scaler;
  fw::Trainer<fw::SingleRank<fw::models::Gpt<T, fw::Host>, fw::Precision<T>, fw::Host>> t(
      opts, ctx, model, adamw());
  RunResult r;
  r.ranks.resize(1);
  for (int s = 0; s < rc.steps; ++s) {
    r.losses.push_back(t.step(batch(s, rc.batch).view()));
    r.ranks[0].backend_allocations.push_back(mem.backend_allocations());
    r.ranks[0].syncs.push_back(ctx.syncs());
  }
  r.ranks[0].skipped = t.loss_scaler().skipped_steps();
  r.params = model_params(model);
  model.visit_parameters([&](fw::Parameter<T, fw::Host>& p) { r.names.push_back(p.name); });
  return r;
}

template <class T, int Stage>
RunResult run_stage(const RunConfig& rc) {
  using Model = fw::models::Gpt<T, fw::Host>;
  using Comm = fw::Counting<fw::LocalComm>;
  using S = fw::ShardedStrategy<Stage, Model, fw::Precision<T>, fw::Host, Comm>;
  RunResult r;
  r.ranks.resize(static_cast<std::size_t>(rc.ranks));
  std::mutex mu;
  fw::launch<fw::LocalWorld>(rc.ranks, [&](fw::World<fw::LocalWorld>& w) {
    Comm dp(w.comm().split(0, w.rank(), "dp"));
    Model model = rc.deferred ? Model::deferred(w.ctx(), tiny_gpt(rc.checkpoint), kSeed)
                              : Model(w.ctx(), tiny_gpt(rc.checkpoint), kSeed);
    fw::TrainerOptions opts;
    opts.micro_batches = rc.micro_batches;
    opts.loss_scaler = rc.scaler;
    fw::ShardedOptions so;
    so.bucket_bytes = rc.bucket_bytes;
    so.overlap = rc.overlap;
    fw::Trainer<S> t(opts, w.ctx(), model, dp, adamw(), so);
    RankResult rr;  // peaks from the start of the run: construction, every step
    for (int s = 0; s < rc.steps; ++s) {
      if (s == rc.measure_step) {
        dp.counters().reset();
        dp.inner().reset_traffic();
      }
      rr.losses.push_back(t.step(batch(s, rc.batch).view()));
      rr.min_clip_coef = std::min(rr.min_clip_coef, t.last_report().clip_coef);
      rr.backend_allocations.push_back(w.memory().backend_allocations());
      rr.syncs.push_back(w.ctx().syncs());
      if (s == rc.measure_step) {
        rr.step_bytes = dp.counters().modelled_bytes_sent("dp");
        rr.step_moved = dp.inner().traffic().total();
      }
    }
    auto& m = w.memory();
    rr.state_bytes = {m.current(fw::MemTag::weights), m.current(fw::MemTag::grads),
                      m.current(fw::MemTag::master_weights),
                      m.current(fw::MemTag::optimizer_state)};
    rr.peak_weights = m.peak(fw::MemTag::weights);
    for (int tag = 0; tag < fw::mem_tag_count; ++tag) {
      rr.peak[static_cast<std::size_t>(tag)] = m.peak(static_cast<fw::MemTag>(tag));
    }
    rr.total_peak = m.total_peak();
    rr.gathered_peak = t.strategy().gathered_peak_bytes();
    rr.shard_elements = t.strategy().layout().shard();
    rr.skipped = t.loss_scaler().skipped_steps();
    for (int u = 0; u < model.units(); ++u) {
      std::int64_t b = 0;
      for (int s : t.strategy().unit_segments(u)) {
        b += t.strategy().layout().segment(s).padded * static_cast<std::int64_t>(sizeof(T));
      }
      rr.max_unit_bytes = std::max(rr.max_unit_bytes, b);
    }
    auto params = t.strategy().gather_full_parameters();
    std::lock_guard lock(mu);
    if (w.rank() == 0) {
      r.losses = rr.losses;
      r.params = std::move(params);
    }
    r.ranks[static_cast<std::size_t>(w.rank())] = std::move(rr);
  });
  return r;
}

template <class T>
RunResult run(const RunConfig& rc) {
  switch (rc.stage) {
    case 0: return run_stage<T, 0>(rc);
    case 1: return run_stage<T, 1>(rc);
    case 2: return run_stage<T, 2>(rc);
    default: return run_stage<T, 3>(rc);
  }
}

/// Parameter `name`'s values as cross-mesh comparisons see them: the key third [C, 2C) of an
/// `attn.c_attn.bias` (3C values) left out. Its true gradient is exactly zero (softmax ignores a
/// constant added to every score of a row), so every run feeds rounding noise to Adam, which
/// normalises it into steps of about lr either way: no bound separates a right key bias from a
/// wrong one, so its gradient is checked directly instead (tests/layers/gpt_test.cpp,
/// Gpt.KeyBiasGradientIsZero), and its values only to the size of those steps
/// (`expect_key_bias_within`).
inline std::vector<float> comparable(const std::string& name, std::vector<float> v) {
  if (name.ends_with("attn.c_attn.bias") && v.size() % 3 == 0) {
    const auto C = static_cast<std::ptrdiff_t>(v.size() / 3);
    v.erase(v.begin() + C, v.begin() + 2 * C);
  }
  return v;
}

/// The key third of an `attn.c_attn.bias` (see `comparable`) within `bound` absolute, element by
/// element (2·lr·steps: Adam's steps of about lr on rounding noise); nothing for other tensors.
inline void expect_key_bias_within(const std::string& name, const std::vector<float>& got,
                                   const std::vector<float>& want, double bound,
                                   const std::string& what) {
  if (!name.ends_with("attn.c_attn.bias") || want.size() % 3 != 0) return;
  const std::size_t C = want.size() / 3;
  for (std::size_t k = C; k < 2 * C; ++k)
    EXPECT_LE(std::abs(got[k] - want[k]), bound) << what << " " << name << "[" << k << "]";
}

/// The largest |got - want| / |want| over the steps of two loss curves.
inline double max_relative_difference(const std::vector<float>& got,
                                      const std::vector<float>& want) {
  double d = 0;
  for (std::size_t s = 0; s < want.size(); ++s)
    d = std::max(d, std::abs(double(got[s]) - want[s]) / std::abs(double(want[s])));
  return d;
}

/// ||a - b|| / ||b|| over one tensor.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace harness
