//! `check_mesh`: the numerics check users run — a mesh against the one-rank run of the same model
//! on the same data, with bounds derived from the precision (what torchtitan's loss_compare and
//! Megatron's ε-bound tests do by hand). `check_mesh` takes a model configuration (GPT's, or
//! one of the user's own with a `fw::model_family`, train/model_family.hpp) and any mesh;
//! `check_sharded` takes a model of the user's own (any `trainable_model` with named parameters
//! and FSDP units) under DataParallel or ZeRO-1/2/3. Both share one comparison.
//!
//!   losses     the configured mesh and the one-rank run train `steps` steps from the same
//!              initial weights on the same global batches; per step, |Δloss| / |loss₁|
//!   gradients  a probe step on fresh copies of both (the same initial weights, the first batch):
//!              AdamW with eps = E = 1e8, lr = K·E (K = 1e4), no weight decay, no clipping, moves
//!              every fp32 master by K·g/(1 + |g|/E), i.e. K·g to 1e-8 relative, so the unsplit
//!              parameters before and after give g = (w₀ − w₁)/K on both sides; per tensor the
//!              largest relative (L2) difference ‖g − g₁‖ / max(‖g₁‖, 1e-4·‖G₁‖) (G: every
//!              gradient, so a tensor whose gradient is zero, e.g. the attention key bias, is
//!              held to noise at 1e-4 of the global norm, not divided by zero). Under fp16 a probe
//!              step skipped by the loss scaler is repeated (same batch) until one is applied.
//!
//! Bounds (relative), chosen from the precision's rounding (fp32 2^-24, bf16 2^-9, fp16 2^-12 per
//! rounding, accumulated over reordered sums; the equivalence matrix measures fp32 meshes at
//! 6.6e-8 in loss and 2e-6 in parameters after 20 steps, bf16 at 3.4e-5 in loss):
//! ```
//!   precision   loss per step   gradient per tensor (step 1)
//!   fp32        1e-5            1e-4
//!   bf16        2e-2            1e-1
//!   fp16        1e-2            5e-2
//! ```
//! The one-rank run uses dp·M micro-batches of the same rows (the mesh's summation granularity).
//! It runs on world rank 0 only and the report is broadcast, so every rank returns the same
//! report; the check holds the whole model on rank 0 (and the unsplit parameters on every rank
//! for the probe): it is for meshes of a model that fits on one rank, as any such comparison is.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "fourway/comm/staged.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/train/mesh_strategy.hpp"
#include "fourway/train/sharded_strategy.hpp"
#include "fourway/train/strategy.hpp"
#include "fourway/train/trainer.hpp"

namespace fourway {

/// The bounds of a check (relative); `for_precision<T>()` gives the documented ones.
struct CheckBounds {
  double loss = 1e-5;
  double gradient = 1e-4;
  template <class T>
  static constexpr CheckBounds for_precision() {
    if constexpr (std::is_same_v<T, bf16>) {
      return {2e-2, 1e-1};
    } else if constexpr (std::is_same_v<T, fp16>) {
      return {1e-2, 5e-2};
    } else {
      return {1e-5, 1e-4};
    }
  }
};

struct CheckOptions {
  int steps = 5;
  CheckBounds bounds{};  // the precision's unless set_bounds
  bool set_bounds = false;
};

/// What `check_mesh` found; identical on every rank.
struct CheckReport {
  std::vector<double> mesh_loss, one_rank_loss;  // per step
  std::vector<std::string> tensors;              // Hugging Face order
  std::vector<double> gradient_difference;       // per tensor, step 1 (the probe)
  CheckBounds bounds;

  [[nodiscard]] double loss_difference(std::size_t s) const {
    return std::abs(mesh_loss[s] - one_rank_loss[s]) / std::max(std::abs(one_rank_loss[s]), 1e-30);
  }
  [[nodiscard]] double worst_loss_difference() const {
    double d = 0;
    for (std::size_t s = 0; s < mesh_loss.size(); ++s) d = std::max(d, loss_difference(s));
    return d;
  }
  [[nodiscard]] std::size_t worst_tensor() const {
    return static_cast<std::size_t>(
        std::max_element(gradient_difference.begin(), gradient_difference.end()) -
        gradient_difference.begin());
  }
  [[nodiscard]] bool ok() const {
    return worst_loss_difference() <= bounds.loss &&
           (gradient_difference.empty() || gradient_difference[worst_tensor()] <= bounds.gradient);
  }
  /// Per step the two losses and their difference, the largest gradient differences, a verdict.
  [[nodiscard]] std::string text() const {
    std::string out = detail::cat("check: the mesh against the one-rank run, ", mesh_loss.size(),
                                  " steps (bounds: loss ", bounds.loss, ", gradient ",
                                  bounds.gradient, " relative)\n");
    char line[200];
    for (std::size_t s = 0; s < mesh_loss.size(); ++s) {
      std::snprintf(line, sizeof line,
                    "  step %zu: loss %.7f vs %.7f, relative difference %.2e%s\n", s + 1,
                    mesh_loss[s], one_rank_loss[s], loss_difference(s),
                    loss_difference(s) <= bounds.loss ? "" : "  OUTSIDE");
      out += line;
    }
    std::vector<std::size_t> order(tensors.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return gradient_difference[a] > gradient_difference[b];
    });
    out += detail::cat("  step 1 gradients, largest relative differences of ", tensors.size(),
                       " tensors:\n");
    for (std::size_t k = 0; k < std::min<std::size_t>(5, order.size()); ++k) {
      const std::size_t i = order[k];
      std::snprintf(line, sizeof line, "    %-28s %.2e%s\n", tensors[i].c_str(),
                    gradient_difference[i],
                    gradient_difference[i] <= bounds.gradient ? "" : "  OUTSIDE");
      out += line;
    }
    out += ok() ? "check passed: every loss and gradient within its bound\n"
                : "check FAILED: the mesh does not compute what one rank computes\n";
    return out;
  }
};

namespace detail {

/// The probe optimizer: moves every master by K·g (see the top of this file).
inline constexpr double probe_k = 1e4;
inline AdamW probe_adamw() {
  AdamWConfig c;
  c.eps = 1e8f;
  c.lr = static_cast<float>(probe_k * 1e8);
  c.weight_decay = 0.0f;
  c.max_grad_norm = 0.0f;
  return AdamW(c);
}

/// Steps `t` on `batch` until the step is applied (fp16: the loss scaler skips overflowing ones).
template <class TrainerT>
void probe_step(TrainerT& t, const Batch& batch) {
  for (int tries = 0; tries < 64; ++tries) {
    (void)t.step(batch);
    if (!t.last_report().skipped) return;
  }
  throw ConfigError("fourway: check: 64 probe steps in a row were skipped for inf/NaN gradients");
}

inline std::vector<std::vector<float>> difference_over_k(const std::vector<NamedTensor>& before,
                                                         const std::vector<NamedTensor>& after) {
  std::vector<std::vector<float>> g(before.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    g[i].resize(before[i].values.size());
    for (std::size_t k = 0; k < g[i].size(); ++k)
      g[i][k] = static_cast<float>((double(before[i].values[k]) - after[i].values[k]) / probe_k);
  }
  return g;
}

}  // namespace detail

namespace detail {

/// Every parameter of `m` as host floats, by name, in `visit_parameters` order.
template <class Model, class B>
std::vector<NamedTensor> model_values(const Context<B>& ctx, Model& m) {
  std::vector<NamedTensor> out;
  m.visit_parameters([&](auto& p) { out.push_back({p.name, parameter_values(ctx, p)}); });
  return out;
}

/// The comparison both front ends share. `train(optimizer)` builds a fresh run of the mesh and
/// returns it as a trainer (a unique_ptr); `full(trainer)` its unsplit parameters (a collective);
/// `one_rank(optimizer)` a fresh one-rank run on world rank 0 ({model, trainer} pointers).
template <class T, class B, class Comm, class Train, class Full, class OneRank>
CheckReport compare_with_one_rank(const Context<B>& world_ctx, Comm& world, const AdamW& optimizer,
                                  const std::function<Batch(int)>& batch_at,
                                  const CheckOptions& check_options, Train&& train, Full&& full,
                                  OneRank&& one_rank) {
  check<ConfigError>(check_options.steps >= 1, "fourway: check needs steps >= 1, got ",
                     check_options.steps);
  CheckReport r;
  r.bounds = check_options.set_bounds ? check_options.bounds : CheckBounds::for_precision<T>();
  const int steps = check_options.steps;
  {  // the mesh: the configured run, then the probe on a fresh copy
    auto t = train(optimizer);
    for (int s = 0; s < steps; ++s) r.mesh_loss.push_back(t->step(batch_at(s)));
  }
  std::vector<std::vector<float>> g_mesh;
  {
    auto t = train(probe_adamw());
    const std::vector<NamedTensor> before = full(*t);
    probe_step(*t, batch_at(0));
    g_mesh = difference_over_k(before, full(*t));
    for (const auto& nt : before) r.tensors.push_back(nt.name);
  }
  std::vector<double> numbers(static_cast<std::size_t>(steps) + r.tensors.size(), 0.0);
  if (world.rank() == 0) {
    {
      auto run = one_rank(optimizer);
      for (int s = 0; s < steps; ++s)
        numbers[static_cast<std::size_t>(s)] = run.trainer->step(batch_at(s));
    }
    auto run = one_rank(probe_adamw());
    const auto& ctx = run.trainer->strategy().context();
    const std::vector<NamedTensor> before = model_values(ctx, *run.model);
    probe_step(*run.trainer, batch_at(0));
    const auto g_ref = difference_over_k(before, model_values(ctx, *run.model));
    check<ConfigError>(g_ref.size() == g_mesh.size(), "fourway: check: the mesh has ",
                       g_mesh.size(), " tensors, the one-rank model ", g_ref.size());
    double global = 0;
    for (const auto& g : g_ref)
      for (float v : g) global += double(v) * v;
    const double floor = 1e-4 * std::sqrt(global);
    for (std::size_t i = 0; i < g_ref.size(); ++i) {
      check<ConfigError>(g_ref[i].size() == g_mesh[i].size() && before[i].name == r.tensors[i],
                         "fourway: check: tensor ", r.tensors[i], " does not match the one-rank ",
                         before[i].name);
      double num = 0, den = 0;
      for (std::size_t k = 0; k < g_ref[i].size(); ++k) {
        const double d = double(g_mesh[i][k]) - g_ref[i][k];
        num += d * d;
        den += double(g_ref[i][k]) * g_ref[i][k];
      }
      numbers[static_cast<std::size_t>(steps) + i] =
          std::sqrt(num) / std::max(std::sqrt(den), floor);
    }
  }
  staged_broadcast(world_ctx, world, numbers.data(), static_cast<std::int64_t>(numbers.size()), 0);
  r.one_rank_loss.assign(numbers.begin(), numbers.begin() + steps);
  r.gradient_difference.assign(numbers.begin() + steps, numbers.end());
  return r;
}

/// A one-rank run: the model and its trainer (the trainer points into the model).
template <class Model, class P, class B>
struct OneRankRun {
  std::unique_ptr<Model> model;
  std::unique_ptr<Trainer<SingleRank<Model, P, B>>> trainer;
};

}  // namespace detail

/// Runs the mesh `MeshT` (every rank calls it with its groups; a collective over `world`) and,
/// on world rank 0, the one-rank run of `cfg`, and compares them (see the top of this file).
/// `cfg` names the model: GPT's `models::GptConfig`, or the configuration of a model of your own
/// with a `fw::model_family` (train/model_family.hpp). `batch_at(step)` gives the global batch of
/// step `step` (0-based; the probe uses step 0's); its spans must stay valid until the next call.
/// `load` / `load_one_rank` set the initial weights of the mesh's rank models / of the one-rank
/// model (empty: the seed's).
template <class MeshT, precision_policy P, backend B, communicator Comm,
          class Config = models::GptConfig>
CheckReport check_mesh(
    const Context<B>& ctx, const MeshT& mesh, MeshGroups<Comm>& groups, Comm& world,
    const Config& cfg, std::uint64_t seed, const MeshOptions& options, const AdamW& optimizer,
    const TrainerOptions& trainer, const std::function<Batch(int)>& batch_at,
    CheckOptions check_options = {},
    const typename MeshStrategy<MeshT, P, B, Comm, Config>::loader& load = {},
    const std::function<void(const Context<B>&,
                             typename model_family<Config>::template one_rank_model<
                                 typename P::param_type, B, Comm>&)>& load_one_rank = {}) {
  using T = typename P::param_type;
  using S = MeshStrategy<MeshT, P, B, Comm, Config>;
  using family = model_family<Config>;
  using Whole = typename family::template one_rank_model<T, B, Comm>;
  TrainerOptions one = trainer;  // dp·M micro-batches of the same rows
  one.micro_batches = trainer.micro_batches * mesh.dp();
  Comm single = world.split(world.rank(), 0);  // a group of one rank, for the one-rank model
  return detail::compare_with_one_rank<T>(
      ctx, world, optimizer, batch_at, check_options,
      [&](const AdamW& opt) {
        return std::make_unique<Trainer<S>>(trainer, ctx, mesh, groups, cfg, seed, options, opt,
                                            load);
      },
      [](Trainer<S>& t) { return t.strategy().full_parameters(); },
      [&](const AdamW& opt) {
        detail::OneRankRun<Whole, P, B> run;
        run.model = family::template make_one_rank<T, B, Comm>(ctx, cfg, seed, single);
        if (load_one_rank) load_one_rank(ctx, *run.model);
        run.trainer = std::make_unique<Trainer<SingleRank<Whole, P, B>>>(one, ctx, *run.model, opt);
        return run;
      });
}

/// The same check for a model of your own under DataParallel (Stage 0) or ZeRO-1/2/3 over `dp`
/// (a collective over `dp`, which is the world here): `make_model(ctx)` builds the model with
/// its initial values (the same on every rank); any `trainable_model` whose parameters are
/// `fw::Parameter`s with names works, e.g. one built from layers/.
template <int Stage, precision_policy P, backend B, communicator Comm, class MakeModel>
CheckReport check_sharded(const Context<B>& ctx, Comm& dp, MakeModel&& make_model,
                          const AdamW& optimizer, const TrainerOptions& trainer,
                          const std::function<Batch(int)>& batch_at,
                          CheckOptions check_options = {}, ShardedOptions sharded = {}) {
  using Model = std::remove_cvref_t<decltype(make_model(ctx))>;
  using S = ShardedStrategy<Stage, Model, P, B, Comm>;
  struct MeshRun {  // the strategy keeps a pointer to the model: both live here
    std::unique_ptr<Model> model;
    std::unique_ptr<Trainer<S>> trainer;
    float step(const Batch& b) { return trainer->step(b); }
    [[nodiscard]] const StepReport& last_report() const { return trainer->last_report(); }
  };
  TrainerOptions one = trainer;
  one.micro_batches = trainer.micro_batches * dp.size();
  return detail::compare_with_one_rank<typename P::param_type>(
      ctx, dp, optimizer, batch_at, check_options,
      [&](const AdamW& opt) {
        auto run = std::make_unique<MeshRun>();
        run->model = std::make_unique<Model>(make_model(ctx));
        run->trainer = std::make_unique<Trainer<S>>(trainer, ctx, *run->model, dp, opt, sharded);
        return run;
      },
      [](MeshRun& run) {
        auto values = run.trainer->strategy().gather_full_parameters();
        std::vector<NamedTensor> out;
        std::size_t i = 0;
        run.model->visit_parameters([&](auto& p) {
          out.push_back({p.name, std::move(values[i++])});
        });
        return out;
      },
      [&](const AdamW& opt) {
        detail::OneRankRun<Model, P, B> run;
        run.model = std::make_unique<Model>(make_model(ctx));
        run.trainer = std::make_unique<Trainer<SingleRank<Model, P, B>>>(one, ctx, *run.model, opt);
        return run;
      });
}

}  // namespace fourway
