//! `MeshStrategy<MeshT, P, B, Comm>`: the Mesh type is the runtime. A GPT trained on
//! `fw::Trainer<fw::MeshStrategy<fw::Mesh<...>, P, B, Comm>>` runs the strategy the mesh's policies
//! name, chosen at compile time from the type alone:
//! ```
//!   mesh has                    model of each rank          strategy (train/)
//!   no Pipeline, no TP          models::Gpt (deferred)      ShardedStrategy<Z> over dp
//!   TensorParallel, no Pipeline tp::Gpt over tp             ShardedStrategy<Z> over dp
//!   Pipeline, no TP             models::Gpt parts           PipelineStrategy<.., Z> over pp, dp
//!   TensorParallel + Pipeline   tp::Gpt parts over tp       PipelineStrategy<.., Z, tp::Gpt> over
//!   pp, dp
//! ```
//! Z is the dp policy's ZeRO stage: 0 for `DataParallel` or no dp policy, S for `Sharded<S>`.
//! Every degree may be `fw::dynamic` (given to the Mesh at run time) and any may be 1, down to the
//! 1×1×1 mesh `Mesh<>` (ShardedStrategy<0> over a one-rank dp group). Invalid combinations are
//! the Mesh's own `fourway:` static_asserts (order, repeats) or its ConfigErrors (degrees that do
//! not make the world); a tp degree that does not divide the heads is the tp::Gpt ConfigError.
//!
//! The pipeline's options: `MeshOptions::pipeline` as given, except that a static
//! `Pipeline<S, M, Schedule>` fixes M (the options must say M or leave the default 1) and
//! `Schedule = GPipe` fixes the schedule to GPipe (OneFOneB, the default, lets the options pick any
//! 1F1B-family table: 1f1b, interleaved, zb-h1, zb-v). Groups are created in the order tp, pp, dp
//! on every rank (mesh/groups.hpp's rule) when the strategy is built.
//!
//! `full_parameters()` (a collective over the whole mesh) returns the unsplit model, tensor by
//! tensor in Hugging Face order, on every rank: what the numerics check compares with the one-rank
//! run (train/mesh_check.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/comm/communicator.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/layers/parameter.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/parallel/dp/data_parallel.hpp"
#include "fourway/parallel/tp/gpt.hpp"
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
  static constexpr bool pipeline = MeshT::template has_axis<Axis::pp>;
  static constexpr int zero_stage = [] {
    if constexpr (std::is_void_v<dp_policy>) {
      return 0;
    } else {
      return dp_policy::stage;
    }
  }();
};

/// The mesh with a TensorParallel axis when `Tp`, a Pipeline axis when `Pp`, and DataParallel
/// (Zero 0) or Sharded<Zero>, every degree `fw::dynamic`: the type a program instantiates when
/// its axes are chosen at run time (fourway-train's flags, a test's list of meshes).
template <bool Tp, bool Pp, int Zero>
struct dynamic_mesh {
  using dp = data_parallel_policy_t<Zero>;
  using type = std::conditional_t<
      Tp,
      std::conditional_t<Pp, Mesh<TensorParallel<dynamic>, Pipeline<dynamic, dynamic>, dp>,
                         Mesh<TensorParallel<dynamic>, dp>>,
      std::conditional_t<Pp, Mesh<Pipeline<dynamic, dynamic>, dp>, Mesh<dp>>>;
};
template <bool Tp, bool Pp, int Zero>
using dynamic_mesh_t = typename dynamic_mesh<Tp, Pp, Zero>::type;

/// Whether `M` is a `fw::Mesh<...>`.
template <class M>
inline constexpr bool is_mesh = false;
template <class... Ps>
inline constexpr bool is_mesh<Mesh<Ps...>> = true;

namespace detail {

template <class MeshT, class P, class B, class Comm>
struct mesh_strategy_types {
  static_assert(is_mesh<MeshT>,
                "fourway: MeshStrategy<M, P, B, Comm> needs M = fw::Mesh<policies...>, e.g. "
                "fw::Mesh<fw::TensorParallel<2>, fw::Pipeline<2, 4>, fw::Sharded<1>>");
  using T = typename P::param_type;
  using traits = mesh_traits<MeshT>;
  using model = std::conditional_t<traits::tensor_parallel, tp::Gpt<T, B, Comm>, models::Gpt<T, B>>;
  using base =
      std::conditional_t<traits::pipeline, PipelineStrategy<P, B, Comm, traits::zero_stage, model>,
                         ShardedStrategy<traits::zero_stage, model, P, B, Comm>>;
};

/// Base-from-member: the model a non-pipeline strategy trains, built before the strategy.
template <class Model>
struct OwnedModel {
  std::unique_ptr<Model> owned;
};

}  // namespace detail

template <class MeshT, precision_policy P, backend B, communicator Comm>
class MeshStrategy
    : private detail::OwnedModel<typename detail::mesh_strategy_types<MeshT, P, B, Comm>::model>,
      public detail::mesh_strategy_types<MeshT, P, B, Comm>::base {
  using types = detail::mesh_strategy_types<MeshT, P, B, Comm>;
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

  /// Builds this rank's part of `cfg` (values of models::Gpt(ctx, cfg, seed), or what `load`
  /// sets) as the mesh says. `groups` belongs to this rank and must outlive the strategy.
  MeshStrategy(const Context<B>& ctx, const MeshT& mesh, MeshGroups<Comm>& groups,
               const models::GptConfig& cfg, std::uint64_t seed, MeshOptions options = {},
               AdamW optimizer = AdamW{}, const loader& load = {}) requires(!traits::pipeline)
      : owned_model{make_model(ctx, cfg, seed, ready(groups), options, load)},
        base_type(ctx, *this->owned, groups.dp(), optimizer, options.sharded),
        mesh_(mesh),
        groups_(&groups),
        cfg_(cfg),
        seed_(seed) {}

  MeshStrategy(const Context<B>& ctx, const MeshT& mesh, MeshGroups<Comm>& groups,
               const models::GptConfig& cfg, std::uint64_t seed, MeshOptions options = {},
               AdamW optimizer = AdamW{}, const loader& load = {}) requires(traits::pipeline)
      : owned_model{(ready(groups), nullptr)},
        base_type(ctx, cfg, chunk_factory(ctx, cfg, seed, groups, options.tensor, load),
                  groups.pp(), groups.dp(), pipeline_options(options.pipeline), optimizer),
        mesh_(mesh),
        groups_(&groups),
        cfg_(cfg),
        seed_(seed) {}

  [[nodiscard]] const MeshT& mesh() const { return mesh_; }
  [[nodiscard]] MeshGroups<Comm>& groups() { return *groups_; }
  [[nodiscard]] base_type& base() { return *this; }
  /// A checkpoint of the run is written by every rank of the mesh (train/resume.hpp).
  [[nodiscard]] int checkpoint_ranks() const { return mesh_.size(); }

  /// The unsplit model's tensors in Hugging Face order, on every rank (the LM head's copy of
  /// `wte` is not listed: it equals `wte`). A collective over the whole mesh.
  std::vector<NamedTensor> full_parameters() {
    const Context<B>& ctx = this->context();
    if constexpr (!traits::pipeline) {
      auto values = this->gather_full_parameters();
      if constexpr (traits::tensor_parallel) values = this->owned->gather_over_tp(values);
      std::vector<NamedTensor> out;
      std::size_t i = 0;
      this->owned->visit_parameters([&](Parameter<T, B>& p) {
        out.push_back({p.name, std::move(values[i++])});
      });
      return out;
    } else {
      // every chunk's unsplit tensors on the ranks that hold it, then broadcast over pp
      const auto& table = this->table();
      std::vector<std::vector<std::vector<float>>> mine(static_cast<std::size_t>(table.chunks()));
      this->with_gathered_parameters([&] {
        for (int c = 0; c < table.chunks(); ++c) {
          rank_model_type* chunk = this->chunk(c);
          if (chunk == nullptr) continue;
          auto& v = mine[static_cast<std::size_t>(c)];
          if constexpr (traits::tensor_parallel) {
            v = chunk->gather_over_tp(chunk->local_parameters(ctx));
          } else {
            chunk->visit_parameters(
                [&](Parameter<T, B>& p) { v.push_back(parameter_values(ctx, p)); });
          }
        }
      });
      std::vector<NamedTensor> out;
      Comm& pp = groups_->pp();
      for (int c = 0; c < table.chunks(); ++c) {
        const DeferredInit shapes_only;  // the part's names and unsplit sizes, nothing allocated
        models::Gpt<T, B> part(ctx, cfg_, seed_, this->partition().part(c));
        std::size_t i = 0;
        part.visit_parameters([&](Parameter<T, B>& p) {
          const std::size_t k = i++;
          const bool known = !out.empty() && p.name == out.front().name;  // the head's wte
          if (known) return;
          std::vector<float> v = table.rank_of(c) == pp.rank()
                                     ? std::move(mine[static_cast<std::size_t>(c)][k])
                                     : std::vector<float>(static_cast<std::size_t>(p.numel()));
          if (pp.size() > 1) pp.broadcast(v.data(), p.numel(), table.rank_of(c));
          out.push_back({p.name, std::move(v)});
        });
      }
      return out;
    }
  }

 private:
  static MeshGroups<Comm>& ready(MeshGroups<Comm>& groups) {
    (void)groups.tp();  // every rank creates its groups in one order (mesh/groups.hpp)
    (void)groups.pp();
    (void)groups.dp();
    return groups;
  }

  static std::unique_ptr<rank_model_type> make_model(const Context<B>& ctx,
                                                     const models::GptConfig& cfg,
                                                     std::uint64_t seed, MeshGroups<Comm>& groups,
                                                     const MeshOptions& options,
                                                     const loader& load) {
    std::unique_ptr<rank_model_type> m;
    if constexpr (traits::tensor_parallel) {
      m = std::make_unique<rank_model_type>(ctx, cfg, groups.tp(), seed, options.tensor);
    } else {
      (void)groups;
      (void)options;  // deferred unless loaded: the strategy materialises what this rank owns
      m = load ? std::make_unique<rank_model_type>(ctx, cfg, seed)
               : std::make_unique<rank_model_type>(rank_model_type::deferred(ctx, cfg, seed));
    }
    if (load) load(ctx, *m);
    return m;
  }

  /// The pipeline's chunk factory (a pipeline mesh only).
  static auto chunk_factory(const Context<B>& ctx, const models::GptConfig& cfg, std::uint64_t seed,
                            MeshGroups<Comm>& groups, tp::TpOptions tensor, const loader& load) {
    using factory = typename base_type::chunk_factory;
    Comm* tpc = &groups.tp();
    return factory([&ctx, cfg, seed, tpc, tensor, load](const models::GptPart& part) {
      std::unique_ptr<rank_model_type> m;
      if constexpr (traits::tensor_parallel) {
        m = std::make_unique<rank_model_type>(ctx, cfg, *tpc, seed, tensor, part);
      } else {
        (void)tpc;
        (void)tensor;
        m = std::make_unique<rank_model_type>(ctx, cfg, seed, part);
      }
      if (load) load(ctx, *m);
      return m;
    });
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
  models::GptConfig cfg_;
  std::uint64_t seed_;
};

}  // namespace fourway
