//! A tensor-parallel model's values through its placement table (tp/placement.hpp): set every
//! parameter to its slice of the unsplit tensors, and gather the unsplit tensors back from every
//! rank's slices; `SlicedModel`, what the strategies ask of such a model, answered from the
//! table. Shared by models::Gpt over a tp group and any model that describes its split with
//! `Placement`s (examples/llama/).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/comm/staged.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/placement.hpp"

namespace fourway::tp {

/// Sets `m`'s parameters (its `visit_parameters` order is `table`'s) to rank `r` of `n`'s slices:
/// `read(placement, first, count, out)` writes elements [first, first + count) of the unsplit
/// tensor (as float) to `out`; only the runs the rank holds are asked for, padding rows are
/// zero. Gradients are untouched.
template <class Model, class B, class Read>
void load_slices(const Context<B>& ctx, Model& m, std::span<const Placement> table, int n, int r,
                 Read&& read) {
  using T = typename Model::value_type;
  std::size_t i = 0;
  std::vector<float> run;
  m.visit_parameters([&](Parameter<T, B>& p) {
    check<ConfigError>(i < table.size(), "fourway: placement table of ", table.size(),
                       " rows for a model with more parameters (", p.name, ")");
    const Placement& pl = table[i++];
    check<ConfigError>(p.name == pl.name && p.numel() == pl.local_numel(n),
                       "fourway: placement table out of order: ", pl.name, " (local ",
                       pl.local_numel(n), ") describes parameter ", p.name, " (", p.numel(), ")");
    std::vector<T> local(static_cast<std::size_t>(p.numel()), convert<T>(0.0f));
    pl.for_each_run(n, r, [&](std::int64_t from, std::int64_t to, std::int64_t count) {
      run.resize(static_cast<std::size_t>(count));
      read(pl, from, count, run.data());
      for (std::int64_t k = 0; k < count; ++k) {
        local[static_cast<std::size_t>(to + k)] = convert<T>(run[static_cast<std::size_t>(k)]);
      }
    });
    Ops<B>::from_host(ctx, p.weight.data(), local.data(), p.numel());
  });
}

/// The unsplit tensors from every rank's `local` slices (one per row of `table`; a collective
/// over `tp`, staged through backend memory; padding is dropped).
template <class B, communicator Comm>
std::vector<std::vector<float>> gather_slices(const Context<B>& ctx, Comm& tp,
                                              std::span<const Placement> table,
                                              const std::vector<std::vector<float>>& local) {
  check<ShapeError>(local.size() == table.size(), "fourway: gather of ", local.size(),
                    " tensors over the tensor-parallel group, the model has ", table.size());
  const int n = tp.size();
  std::vector<std::vector<float>> out(table.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    const Placement& pl = table[i];
    if (pl.split == Split::replicated || n == 1) {
      out[i] = local[i];
      continue;
    }
    const std::int64_t count = pl.local_numel(n);
    std::vector<float> all(static_cast<std::size_t>(count * n));
    staged_all_gather(ctx, tp, local[i].data(), all.data(), count);
    out[i].assign(static_cast<std::size_t>(pl.full_numel()), 0.0f);
    for (int q = 0; q < n; ++q) {
      pl.for_each_run(n, q, [&](std::int64_t from, std::int64_t to, std::int64_t c) {
        std::copy_n(all.begin() + q * count + to, c, out[i].begin() + from);
      });
    }
  }
  return out;
}

/// The placement table of `m`, read off its parameters in `visit_parameters` order: what a
/// tensor-parallel-ready layer wrote on each (layers/placement.hpp), or for a plain layer's
/// parameter the whole tensor, replicated. Names and init rules are the parameters'.
template <class Model>
std::vector<Placement> placements_of(Model& m) {
  std::vector<Placement> table;
  m.visit_parameters([&](auto& p) {
    Placement pl = p.placement;
    if (pl.name.empty()) {  // not described: whole and replicated
      pl = Placement{};
      const Shape shape = p.logical_shape();
      pl.matrix = shape.rank() == 2;
      pl.rows = pl.matrix ? shape[0] : 1;
      pl.cols = pl.matrix ? shape[1] : shape.numel();
      pl.padded_rows = pl.rows;
    }
    pl.name = p.name;
    pl.init =
        InitRule{p.init.kind == ::fourway::InitRule::Kind::normal,
                 p.init.kind == ::fourway::InitRule::Kind::normal ? p.init.std : p.init.value};
    table.push_back(std::move(pl));
  });
  return table;
}

/// What the strategies ask of a model split over a tensor-parallel group by a placement table
/// (train/sharded_strategy.hpp's `model_parallel_model`, checkpoints, the numerics check),
/// answered from the table: a base of models::Gpt over a tp group and of any such model of the
/// user's own (examples/llama/). `table` lists the parameters the model holds, in
/// `visit_parameters` order.
template <communicator Comm>
class SlicedModel {
 public:
  [[nodiscard]] int tp_size() const { return n_; }
  [[nodiscard]] int tp_rank() const { return rank_; }
  /// How every parameter is split, in `visit_parameters` order.
  [[nodiscard]] const std::vector<Placement>& placements() const { return table_; }
  /// Whether this rank adds parameter `i`'s gradient to the global norm: every slice of a split
  /// parameter, a replicated one on tp rank 0 only (it is counted once, not N times).
  [[nodiscard]] bool counts_in_norm(int i) const {
    return table_[static_cast<std::size_t>(i)].counts_in_norm(rank_);
  }
  /// Where parameter `i`'s slice lies in the unsplit tensor (checkpoints, train/state_runs.hpp).
  [[nodiscard]] StateView state_view(int i) const {
    return table_[static_cast<std::size_t>(i)].state_view(n_, rank_);
  }
  /// Slot `slot` of the step's scalars (parallel/step_scalars.hpp, backend memory) summed over
  /// the tensor-parallel group in place: Σg² of every rank's slices, without a host value.
  template <class Scalars>
  void sum_over_model_parallel(Scalars& scalars, std::int64_t slot) {
    if (n_ > 1) scalars.reduce(*tp_, slot);
  }
  /// The full tensors from every rank's `local` slices (a collective over the group; padding is
  /// dropped). `local` is the model's parameter values or a strategy's gathered ones.
  template <class B>
  std::vector<std::vector<float>> gather_over_tp(const Context<B>& ctx,
                                                 const std::vector<std::vector<float>>& local) {
    return gather_slices(ctx, *tp_, table_, local);
  }

 protected:
  SlicedModel(Comm& tp, std::vector<Placement> table)
      : tp_(&tp), n_(tp.size()), rank_(tp.rank()), table_(std::move(table)) {}
  /// A model built from tensor-parallel-ready layers: its constructor ends with
  /// `read_placements(*this)`, which reads the table off its parameters (`placements_of`).
  explicit SlicedModel(Comm& tp) : tp_(&tp), n_(tp.size()), rank_(tp.rank()) {}
  template <class Model>
  void read_placements(Model& self) {
    table_ = placements_of(self);
  }

  Comm* tp_;
  int n_;
  int rank_;
  std::vector<Placement> table_;  // the rows of what this model (or part) holds
};

}  // namespace fourway::tp
