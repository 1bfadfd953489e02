//! `MeshStrategy<MeshT, P, B, Comm, Config>`: the Mesh type is the runtime. A model trained on
//! `fw::Trainer<fw::MeshStrategy<fw::Mesh<...>, P, B, Comm>>` runs the strategy the mesh's policies
//! name, chosen at compile time from the type alone:
//! ```
//!   mesh has                    model of each rank           strategy (train/)
//!   no Pipeline, no TP          the whole model (deferred)   ShardedStrategy<Z> over dp
//!   TensorParallel, no Pipeline its tp slices over tp        ShardedStrategy<Z> over dp
//!   Pipeline, no TP             its pipeline parts           PipelineStrategy<.., Z, M> over pp,dp
//!   TensorParallel + Pipeline   the parts' tp slices, tp     PipelineStrategy<.., Z, M> over pp,dp
//! ```
//! The rank models are the ones the `fw::model_family<Config>` names (train/model_family.hpp);
//! nothing here names a model. Without a `Config`, GPT-2 (models/gpt2.hpp: models::Gpt, and
//! models::Gpt over the tp group under tensor parallelism); a decoder of the user's own names its
//! own (examples/llama/). Z is the dp policy's ZeRO stage: 0 for `DataParallel` or no dp policy, S
//! for `Sharded<S>`. A `ContextParallel<N>` axis splits every sequence over N ranks: the strategy
//! owns a `cp::RingShard` over the cp group and binds it to the rank model
//! (`bind_sequence_shard`: positions and attention follow it), and the data-parallel work — the
//! gradient reduction, ZeRO's shards, the loss sum — runs over the cp × dp group, a context rank
//! being a replica over the sequence (docs/context-parallel.md). The Trainer gives the ranks of a
//! context group the same rows (`dp_rank()` is the dp coordinate) and each its part of them
//! (`sequence_split()`).
//! Every degree may be `fw::dynamic` (given to the Mesh at run time) and any may be 1, down to the
//! 1×1×1 mesh `Mesh<>` (ShardedStrategy<0> over a one-rank dp group). Invalid combinations are
//! the Mesh's own `fourway:` static_asserts (order, repeats) or its ConfigErrors (degrees that do
//! not make the world); a tp degree that does not divide the heads is the model's ConfigError.
//!
//! The pipeline's options: `MeshOptions::pipeline` as given, except that a static
//! `Pipeline<S, M, Schedule>` fixes M (the options must say M or leave the default 1) and
//! `Schedule = GPipe` fixes the schedule to GPipe (OneFOneB, the default, lets the options pick any
//! 1F1B-family table: 1f1b, interleaved, zb-h1, zb-v). Groups are created in the order tp, pp, dp
//! on every rank (mesh/groups.hpp's rule) when the strategy is built; a cp axis adds cp and
//! cp+dp after them.
//!
//! `full_parameters()` (a collective over the whole mesh) returns the unsplit model, tensor by
//! tensor in Hugging Face order, on every rank: what the numerics check compares with the one-rank
//! run (train/mesh_check.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/comm/communicator.hpp"
#include "fourway/comm/staged.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/model_part.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/layers/sequence_shard.hpp"
#include "fourway/layers/tp_options.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/parallel/cp/ring_shard.hpp"
#include "fourway/parallel/dp/data_parallel.hpp"
#include "fourway/train/model_family.hpp"
#include "fourway/train/pipeline_strategy.hpp"
#include "fourway/train/sharded_strategy.hpp"

namespace fourway {

/// Run-time choices of each axis' work (the degrees are the Mesh's).
struct MeshOptions {
  PipelineOptions pipeline;  // a Pipeline axis: schedule, micro-batches, virtual stages, cuts
  tp::TpOptions tensor;      // a TensorParallel axis: sequence parallelism, vocabulary padding
  ShardedOptions sharded;    // no Pipeline axis: gradient buckets, overlap (dp/ZeRO)
};

/// One tensor of the unsplit model.
struct NamedTensor {
  std::string name;
  std::vector<float> values;
};

template <class MeshT>
struct mesh_traits {
  using dp_policy = typename MeshT::template policy_on<Axis::dp>;
  static constexpr bool tensor_parallel = MeshT::template has_axis<Axis::tp>;
  static constexpr bool context_parallel = MeshT::template has_axis<Axis::cp>;
  static constexpr bool pipeline = MeshT::template has_axis<Axis::pp>;
  static constexpr int zero_stage = [] {
    if constexpr (std::is_void_v<dp_policy>) {
      return 0;
    } else {
      return dp_policy::stage;
    }
  }();
};

namespace detail {
/// `Mesh<Ps..., P>` when `Add`, else `Mesh<Ps...>`.
template <bool Add, class P, class M>
struct add_policy {
  using type = M;
};
template <class P, class... Ps>
struct add_policy<true, P, Mesh<Ps...>> {
  using type = Mesh<Ps..., P>;
};
}  // namespace detail

/// The mesh with a TensorParallel axis when `Tp`, a Pipeline axis when `Pp`, a ContextParallel
/// axis when `Cp`, and DataParallel (Zero 0) or Sharded<Zero>, every degree `fw::dynamic`: the
/// type a program instantiates when its axes are chosen at run time (fourway-train's flags, a
/// test's list of meshes). The order of the policies does not change the layout (mesh/mesh.hpp).
template <bool Tp, bool Pp, int Zero, bool Cp = false>
struct dynamic_mesh {
  using type = typename detail::add_policy<
      Tp, TensorParallel<dynamic>,
      typename detail::add_policy<
          Cp, ContextParallel<dynamic>,
          typename detail::add_policy<Pp, Pipeline<dynamic, dynamic>,
                                      Mesh<data_parallel_policy_t<Zero>>>::type>::type>::type;
};
template <bool Tp, bool Pp, int Zero, bool Cp = false>
using dynamic_mesh_t = typename dynamic_mesh<Tp, Pp, Zero, Cp>::type;

/// Whether `M` is a `fw::Mesh<...>`.
template <class M>
inline constexpr bool is_mesh = false;
template <class... Ps>
inline constexpr bool is_mesh<Mesh<Ps...>> = true;

namespace detail {

template <class MeshT, class P, class B, class Comm, class Config>
struct mesh_strategy_types {
  static_assert(is_mesh<MeshT>,
                "fourway: MeshStrategy<M, P, B, Comm> needs M = fw::Mesh<policies...>, e.g. "
                "fw::Mesh<fw::TensorParallel<2>, fw::Pipeline<2, 4>, fw::Sharded<1>>");
  using T = typename P::param_type;
  using traits = mesh_traits<MeshT>;
  using family = model_family<Config>;
  using model = typename family::template rank_model<T, B, Comm, traits::tensor_parallel>;
  using base =
      std::conditional_t<traits::pipeline, PipelineStrategy<P, B, Comm, traits::zero_stage, model>,
                         ShardedStrategy<traits::zero_stage, model, P, B, Comm>>;
};

/// Base-from-member: the model a non-pipeline strategy trains, built before the strategy, and
/// the sequence shard (context parallelism) it is bound to.
template <class Model>
struct OwnedModel {
  std::unique_ptr<SequenceShard<typename Model::value_type, typename Model::backend_type>> shard;
  std::unique_ptr<Model> owned;
};

}  // namespace detail

template <class MeshT, precision_policy P, backend B, communicator Comm,
          class Config = default_model_config_t<MeshT>>
class MeshStrategy : private detail::OwnedModel<
                         typename detail::mesh_strategy_types<MeshT, P, B, Comm, Config>::model>,
                     public detail::mesh_strategy_types<MeshT, P, B, Comm, Config>::base {
  using types = detail::mesh_strategy_types<MeshT, P, B, Comm, Config>;
  using family = typename types::family;
  using owned_model = detail::OwnedModel<typename types::model>;
  using T = typename P::param_type;

 public:
  using traits = mesh_traits<MeshT>;
  using base_type = typename types::base;
  /// Each rank's model: the whole model, its tp slices, or the type of its pipeline chunks.
  using rank_model_type = typename types::model;

  /// Sets a freshly built rank model (the whole model, its tp slices, or one pipeline chunk) to
  /// its starting values before the strategy copies them, e.g. `load_gpt2_tp` from a file.
  using loader = std::function<void(const Context<B>&, rank_model_type&)>;

  /// Builds this rank's part of `cfg` (values of the family's one-rank model for `seed`, or what
  /// `load` sets) as the mesh says. `groups` belongs to this rank and must outlive the strategy.
  MeshStrategy(const Context<B>& ctx, const MeshT& mesh, MeshGroups<Comm>& groups,
               const Config& cfg, std::uint64_t seed, MeshOptions options = {},
               AdamW optimizer = AdamW{}, const loader& load = {}) requires(!traits::pipeline)
      : owned_model{make_shard(ready(groups)), make_model(ctx, cfg, seed, groups, options, load)},
        base_type(ctx, *this->owned, replicas(groups), optimizer, options.sharded),
        mesh_(mesh),
        groups_(&groups),
        cfg_(cfg),
        seed_(seed) {
    bind_shard(*this->owned, this->shard.get());
  }

  MeshStrategy(const Context<B>& ctx, const MeshT& mesh, MeshGroups<Comm>& groups,
               const Config& cfg, std::uint64_t seed, MeshOptions options = {},
               AdamW optimizer = AdamW{}, const loader& load = {}) requires(traits::pipeline)
      : owned_model{make_shard(ready(groups)), nullptr},
        base_type(ctx, family::cut_costs(cfg),
                  chunk_factory(ctx, cfg, seed, groups, options.tensor, load, this->shard.get()),
                  groups.pp(), replicas(groups), pipeline_options(options.pipeline), optimizer),
        mesh_(mesh),
        groups_(&groups),
        cfg_(cfg),
        seed_(seed) {
    this->split_sequences(sequence_split());
  }

  [[nodiscard]] const MeshT& mesh() const { return mesh_; }
  /// The model's configuration and initial seed.
  [[nodiscard]] const Config& config() const { return cfg_; }
  [[nodiscard]] std::uint64_t seed() const { return seed_; }
  [[nodiscard]] MeshGroups<Comm>& groups() { return *groups_; }
  [[nodiscard]] base_type& base() { return *this; }
  /// A checkpoint of the run is written by every rank of the mesh (train/resume.hpp).
  [[nodiscard]] int checkpoint_ranks() const { return mesh_.size(); }
  /// The data-parallel coordinate and degree: which rows of the global batch this rank takes
  /// (the ranks of a context group take the same rows; the base's group may be cp × dp).
  [[nodiscard]] int dp_rank() const { return groups_->coord().dp; }
  [[nodiscard]] int dp_size() const { return mesh_.dp(); }
  /// Context parallelism: the ranks every sequence is split over and this rank's part.
  [[nodiscard]] SequenceSplit sequence_split() const { return {mesh_.cp(), groups_->coord().cp}; }

  /// The unsplit model's tensors in the model's order (Hugging Face order for GPT), on every
  /// rank; a tensor listed twice (GPT's LM head copy of `wte`) once. A collective over the whole
  /// mesh.
  std::vector<NamedTensor> full_parameters() {
    const Context<B>& ctx = this->context();
    if constexpr (!traits::pipeline) {
      auto values = this->gather_full_parameters();
      if constexpr (requires { this->owned->gather_over_tp(ctx, values); })
        values = this->owned->gather_over_tp(ctx, values);
      return named(*this->owned, std::move(values));
    } else {
      // every chunk's unsplit tensors on the ranks that hold it, then broadcast over pp
      const auto& table = this->table();
      std::vector<std::vector<NamedTensor>> mine(static_cast<std::size_t>(table.chunks()));
      this->with_gathered_parameters([&] {
        for (int c = 0; c < table.chunks(); ++c) {
          rank_model_type* chunk = this->chunk(c);
          if (chunk == nullptr) continue;
          std::vector<std::vector<float>> v;
          if constexpr (requires { chunk->gather_over_tp(ctx, v); }) {
            v = chunk->gather_over_tp(ctx, chunk->local_parameters(ctx));
          } else {
            chunk->visit_parameters(
                [&](Parameter<T, B>& p) { v.push_back(parameter_values(ctx, p)); });
          }
          mine[static_cast<std::size_t>(c)] = named(*chunk, std::move(v));
        }
      });
      std::vector<NamedTensor> out;
      Comm& pp = groups_->pp();
      for (int c = 0; c < table.chunks(); ++c) {
        auto part = broadcast_tensors(ctx, pp, table.rank_of(c), mine[static_cast<std::size_t>(c)]);
        for (auto& nt : part) {
          const bool known = std::any_of(out.begin(), out.end(),
                                         [&](const NamedTensor& o) { return o.name == nt.name; });
          if (!known) out.push_back(std::move(nt));
        }
      }
      return out;
    }
  }

 private:
  /// `values[i]` named after the model's i-th parameter.
  template <class Model>
  static std::vector<NamedTensor> named(Model& m, std::vector<std::vector<float>> values) {
    std::vector<NamedTensor> out;
    std::size_t i = 0;
    m.visit_parameters([&](Parameter<T, B>& p) {
      out.push_back({p.name, std::move(values[i++])});
    });
    return out;
  }

  /// `tensors` of rank `root` on every rank of `comm`: the count, the names' and values' sizes,
  /// the names' characters and the values, in four broadcasts staged through backend memory.
  static std::vector<NamedTensor> broadcast_tensors(const Context<B>& ctx, Comm& comm, int root,
                                                    std::vector<NamedTensor> tensors) {
    if (comm.size() == 1) return tensors;
    std::int64_t n = static_cast<std::int64_t>(tensors.size());
    staged_broadcast(ctx, comm, &n, 1, root);
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(2 * n));
    std::vector<std::int32_t> chars;
    std::vector<float> values;
    if (comm.rank() == root) {
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        sizes[2 * i] = static_cast<std::int64_t>(tensors[i].name.size());
        sizes[2 * i + 1] = static_cast<std::int64_t>(tensors[i].values.size());
        for (char ch : tensors[i].name) chars.push_back(static_cast<unsigned char>(ch));
        values.insert(values.end(), tensors[i].values.begin(), tensors[i].values.end());
      }
    }
    staged_broadcast(ctx, comm, sizes.data(), 2 * n, root);
    std::int64_t name_chars = 0, numel = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      name_chars += sizes[static_cast<std::size_t>(2 * i)];
      numel += sizes[static_cast<std::size_t>(2 * i + 1)];
    }
    chars.resize(static_cast<std::size_t>(name_chars));
    values.resize(static_cast<std::size_t>(numel));
    staged_broadcast(ctx, comm, chars.data(), name_chars, root);
    staged_broadcast(ctx, comm, values.data(), numel, root);
    if (comm.rank() == root) return tensors;
    std::vector<NamedTensor> out(static_cast<std::size_t>(n));
    std::size_t c = 0, v = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto len = static_cast<std::size_t>(sizes[2 * i]);
      const auto cnt = static_cast<std::size_t>(sizes[2 * i + 1]);
      for (std::size_t k = 0; k < len; ++k) out[i].name.push_back(static_cast<char>(chars[c + k]));
      out[i].values.assign(values.begin() + static_cast<std::ptrdiff_t>(v),
                           values.begin() + static_cast<std::ptrdiff_t>(v + cnt));
      c += len;
      v += cnt;
    }
    return out;
  }

  static MeshGroups<Comm>& ready(MeshGroups<Comm>& groups) {
    (void)groups.tp();  // every rank creates its groups in one order (mesh/groups.hpp)
    (void)groups.pp();
    (void)groups.dp();
    if (context_split(groups)) {
      (void)groups.cp();
      (void)groups.group({Axis::cp, Axis::dp});
    }
    return groups;
  }
  /// A ContextParallel axis of degree above 1 (of 1, the mesh runs as without it: no ring, no
  /// cp + dp group beside dp).
  static bool context_split(MeshGroups<Comm>& groups) {
    return traits::context_parallel && groups.degree(Axis::cp) > 1;
  }
  /// The ranks that hold the same parameters and reduce their gradients: dp, or cp × dp.
  static Comm& replicas(MeshGroups<Comm>& groups) {
    return context_split(groups) ? groups.group({Axis::cp, Axis::dp}) : groups.dp();
  }
  /// The sequence shard of a context-parallel mesh (null without the axis).
  static std::unique_ptr<SequenceShard<T, B>> make_shard(MeshGroups<Comm>& groups) {
    if constexpr (traits::context_parallel) {
      if (context_split(groups)) return std::make_unique<cp::RingShard<T, B, Comm>>(groups.cp());
    }
    return nullptr;
  }

  static std::unique_ptr<rank_model_type> make_model(const Context<B>& ctx, const Config& cfg,
                                                     std::uint64_t seed, MeshGroups<Comm>& groups,
                                                     const MeshOptions& options,
                                                     const loader& load) {
    // deferred unless loaded (GPT without tp): the strategy materialises what this rank owns
    auto m = family::template make<rank_model_type>(ctx, cfg, seed, groups.tp(), options.tensor,
                                                    std::nullopt, static_cast<bool>(load));
    if (load) load(ctx, *m);
    return m;
  }

  /// The pipeline's chunk factory (a pipeline mesh only); each chunk is bound to `shard`, the
  /// sequence shard of a context-parallel mesh.
  static auto chunk_factory(const Context<B>& ctx, const Config& cfg, std::uint64_t seed,
                            MeshGroups<Comm>& groups, tp::TpOptions tensor, const loader& load,
                            SequenceShard<T, B>* shard) {
    using factory = typename base_type::chunk_factory;
    Comm* tpc = &groups.tp();
    return factory([&ctx, cfg, seed, tpc, tensor, load, shard](const ModelPart& part) {
      auto m = family::template make<rank_model_type>(ctx, cfg, seed, *tpc, tensor, part, true);
      bind_shard(*m, shard);
      if (load) load(ctx, *m);
      return m;
    });
  }
  /// Binds a rank model or chunk to the mesh's sequence shard (context parallelism only).
  static void bind_shard(rank_model_type& m, SequenceShard<T, B>* shard) {
    if constexpr (traits::context_parallel) {
      static_assert(
          requires { m.bind_sequence_shard(shard); },
          "fourway: a ContextParallel mesh needs a rank model with "
          "bind_sequence_shard(fw::SequenceShard<T, B>*) for its positions and "
          "attention (docs/context-parallel.md); GPT-2's models have it");
      m.bind_sequence_shard(shard);
    } else {
      (void)m, (void)shard;
    }
  }

  static PipelineOptions pipeline_options(PipelineOptions o) {
    using Pipe = typename MeshT::template policy_on<Axis::pp>;
    if constexpr (Pipe::micro_batches != dynamic) {
      check<ConfigError>(o.micro_batches == 1 || o.micro_batches == Pipe::micro_batches,
                         "fourway: the Mesh's Pipeline<", Pipe::stages, ", ", Pipe::micro_batches,
                         "> runs ", Pipe::micro_batches, " micro-batches but the options ask for ",
                         o.micro_batches,
                         "; leave MeshOptions::pipeline.micro_batches at 1 or make "
                         "the Pipeline's M fw::dynamic");
      o.micro_batches = Pipe::micro_batches;
    }
    if constexpr (std::is_same_v<typename Pipe::schedule, GPipe>)
      o.schedule = schedule::Kind::gpipe;
    return o;
  }

  MeshT mesh_;
  MeshGroups<Comm>* groups_;
  Config cfg_;
  std::uint64_t seed_;
};

}  // namespace fourway
