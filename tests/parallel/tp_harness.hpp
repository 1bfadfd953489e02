// Shared by the tensor-parallel tests: a GPT whose vocabulary (301) divides by no tp > 1, trained
// by the one-rank reference (fw::models::Gpt<T, Host> + SingleRank) or split over a tp group
// (fw::models::Gpt<T, Host, Comm>) under ShardedStrategy on a LocalWorld mesh of dp x tp ranks,
// with what the tests compare.
#pragma once

#include <algorithm>
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
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/train/trainer.hpp"

namespace fw = fourway;

namespace tph {

/// 8 heads of size 3 (tp up to 8), vocabulary 301 = 7·43 (padded for every tp > 1).
inline fw::models::GptConfig config(bool checkpoint = false) {
  fw::models::GptConfig c;
  c.layers = 2;
  c.heads = 8;
  c.dim = 24;
  c.vocab = 301;
  c.max_seq = 9;
  c.checkpoint = checkpoint;
  return c;
}
inline constexpr std::int64_t kBatch = 8;  // B·T = 40 rows: divides by tp·dp <= 8
inline constexpr std::int64_t kSeq = 5;
inline constexpr std::uint64_t kSeed = 20261201;

/// The placement table of GPT-2 `cfg` split over `n` ranks with the vocabulary padded to a
/// multiple of n·`alignment`, as the split model reads it off its layers (built described, on a
/// LocalWorld of n ranks; rank 0's table, which every rank shares).
inline std::vector<fw::tp::Placement> gpt_placements(const fw::models::GptConfig& cfg, int n,
                                                     int alignment) {
  std::vector<fw::tp::Placement> table;
  std::mutex mu;
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    const fw::DeferredInit describe_only;
    fw::tp::TpOptions to;
    to.vocab_alignment = alignment;
    const fw::models::Gpt<float, fw::Host, fw::LocalComm> m(w.ctx(), cfg, w.comm(), 0, to);
    const std::lock_guard<std::mutex> lock(mu);
    if (w.rank() == 0) table = m.placements();
  });
  return table;
}

inline fw::AdamW adamw() {
  fw::AdamWConfig c;
  c.lr = 1e-3f;  // at 1e-2 Adam amplifies reordered-sum rounding to ~1e-5 by step 20
  c.beta1 = 0.9f;
  c.beta2 = 0.95f;
  c.weight_decay = 0.1f;
  c.max_grad_norm = 1.0f;
  return fw::AdamW(c);
}

inline fw::TokenBatch batch(int step) {
  std::mt19937 rng(7000u + static_cast<unsigned>(step));
  std::uniform_int_distribution<int> tok(0, config().vocab - 1);
  std::vector<std::int32_t> rows(static_cast<std::size_t>(kBatch * (kSeq + 1)));
  for (auto& t : rows) t = tok(rng);
  return fw::TokenBatch::from_rows(rows, kBatch, kSeq);
}

struct RunConfig {
  int tp = 1;
  int dp = 1;
  int stage = 0;  // ZeRO stage across the dp groups
  bool sequence_parallel = false;
  bool checkpoint = false;
  int alignment = 1;
  int steps = 20;
  int measure_step = 1;                    // the step whose communication is counted
  fw::models::GptConfig model = config();  // (checkpoint is taken from `checkpoint`)
};

struct RunResult {
  std::vector<float> losses;               // rank 0
  std::vector<double> norms;               // rank 0: global gradient norm of every step
  std::vector<std::vector<float>> params;  // full (unsplit) final values, visit order
  std::vector<std::string> names;
  std::vector<std::vector<float>> rank_losses;  // every rank
  std::vector<double> tp_bytes;                 // every rank: ring bytes in its tp group
  std::vector<double> tp_measured;  // every rank: bytes LocalWorld moved in its tp group
  std::vector<std::array<fw::OpCount, 3>> tp_ops;  // every rank: all_reduce, reduce_scatter,
                                                   // all_gather in its tp group
  std::vector<std::size_t> weight_bytes;           // every rank: accountant MemTag::weights
  std::vector<std::array<std::size_t, 4>> states;  // every rank after the last step: weights,
                                                   // grads, master weights, optimizer state
  std::vector<std::size_t> activation_peak;        // every rank: peak of MemTag::activations
  bool padding_zero = true;                        // wte's padding rows stayed zero on every rank
};

template <class T>
RunResult run_single(int steps, bool checkpoint = false, fw::models::GptConfig cfg = config()) {
  fw::MemoryAccountant mem(0);
  fw::Context<fw::Host> ctx(mem);
  using Model = fw::models::Gpt<T, fw::Host>;
  cfg.checkpoint = checkpoint;
  Model model(ctx, cfg, kSeed);
  fw::Trainer<fw::SingleRank<Model, fw::Precision<T>, fw::Host>> t(fw::TrainerOptions{}, ctx, model,
                                                                   adamw());
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    r.losses.push_back(t.step(batch(s).view()));
    r.norms.push_back(t.last_report().grad_norm);
  }
  model.visit_parameters([&](fw::Parameter<T, fw::Host>& p) {
    r.names.push_back(p.name);
    auto& v = r.params.emplace_back(static_cast<std::size_t>(p.numel()));
    for (std::int64_t i = 0; i < p.numel(); ++i) v[i] = fw::convert<float>(p.weight[i]);
  });
  return r;
}

using Comm = fw::Counting<fw::LocalComm>;
using TpMesh = fw::Mesh<fw::TensorParallel<fw::dynamic>, fw::DataParallel>;

template <class T, int Stage>
RunResult run_tp_stage(const RunConfig& rc) {
  using Model = fw::models::Gpt<T, fw::Host, Comm>;
  using S = fw::TensorParallelStrategy<Stage, T, fw::Host, Comm>;
  const int world = rc.tp * rc.dp;
  RunResult r;
  r.rank_losses.resize(static_cast<std::size_t>(world));
  r.tp_bytes.resize(static_cast<std::size_t>(world));
  r.tp_measured.resize(static_cast<std::size_t>(world));
  r.tp_ops.resize(static_cast<std::size_t>(world));
  r.weight_bytes.resize(static_cast<std::size_t>(world));
  r.states.resize(static_cast<std::size_t>(world));
  r.activation_peak.resize(static_cast<std::size_t>(world));
  std::mutex mu;
  fw::launch<fw::LocalWorld>(world, [&](fw::World<fw::LocalWorld>& w) {
    const TpMesh mesh(world, {.tp = rc.tp});
    Comm all(w.comm().split(0, w.rank(), "world"));
    fw::MeshGroups<Comm> groups(mesh, all);
    fw::tp::TpOptions to;
    to.sequence_parallel = rc.sequence_parallel;
    to.vocab_alignment = rc.alignment;
    fw::models::GptConfig cfg = rc.model;
    cfg.checkpoint = rc.checkpoint;
    Model model(w.ctx(), cfg, groups.tp(), kSeed, to);
    fw::ShardedOptions so;
    so.bucket_bytes = 2048;
    fw::Trainer<S> t(fw::TrainerOptions{}, w.ctx(), model, groups.dp(), adamw(), so);
    std::vector<float> losses;
    std::vector<double> norms;
    double bytes = 0;
    double measured = 0;
    std::array<fw::OpCount, 3> ops{};
    const std::string tp_name = groups.group_name(fw::Axis::tp);
    for (int s = 0; s < rc.steps; ++s) {
      if (s == rc.measure_step) {
        all.counters().reset();
        groups.tp().inner().reset_traffic();
      }
      losses.push_back(t.step(batch(s).view()));
      norms.push_back(t.last_report().grad_norm);
      if (s == rc.measure_step) {
        bytes = all.counters().modelled_bytes_sent(tp_name);
        measured = static_cast<double>(groups.tp().inner().traffic().total());
        ops = {all.counters().get(tp_name, fw::CommOp::all_reduce),
               all.counters().get(tp_name, fw::CommOp::reduce_scatter),
               all.counters().get(tp_name, fw::CommOp::all_gather)};
      }
    }
    const std::size_t wbytes = w.memory().current(fw::MemTag::weights);
    const auto& m = w.memory();
    const std::array<std::size_t, 4> states{
        m.current(fw::MemTag::weights), m.current(fw::MemTag::grads),
        m.current(fw::MemTag::master_weights), m.current(fw::MemTag::optimizer_state)};
    const std::size_t act_peak = m.peak(fw::MemTag::activations);
    auto local = t.strategy().gather_full_parameters();
    bool pad_zero = true;
    {
      const auto& v = model.placements().front();
      const std::int64_t valid = v.valid_rows(rc.tp, model.tp_rank());
      for (std::size_t k = static_cast<std::size_t>(valid * v.cols); k < local[0].size(); ++k) {
        pad_zero = pad_zero && local[0][k] == 0.0f;
      }
    }
    auto full = model.gather_over_tp(w.ctx(), local);
    std::lock_guard lock(mu);
    const auto i = static_cast<std::size_t>(w.rank());
    r.rank_losses[i] = losses;
    r.tp_bytes[i] = bytes;
    r.tp_measured[i] = measured;
    r.tp_ops[i] = ops;
    r.weight_bytes[i] = wbytes;
    r.states[i] = states;
    r.activation_peak[i] = act_peak;
    r.padding_zero = r.padding_zero && pad_zero;
    if (w.rank() == 0) {
      r.losses = losses;
      r.norms = norms;
      r.params = std::move(full);
      for (const auto& p : model.placements()) r.names.push_back(p.name);
    }
  });
  return r;
}

template <class T>
RunResult run_tp(const RunConfig& rc) {
  switch (rc.stage) {
    case 0: return run_tp_stage<T, 0>(rc);
    case 1: return run_tp_stage<T, 1>(rc);
    case 2: return run_tp_stage<T, 2>(rc);
    default: return run_tp_stage<T, 3>(rc);
  }
}

}  // namespace tph
