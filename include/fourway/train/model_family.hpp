//! `model_family<Config>`: what the mesh runtime (train/mesh_strategy.hpp) and the numerics
//! check (train/mesh_check.hpp) build for a model configuration of type `Config`. The type of
//! the configuration names the model: fourway's GPT is `model_family<models::GptConfig>`
//! (models/gpt2.hpp: nothing in train/ names a model);
//! a model of the user's own is trained on every mesh by specialising `fw::model_family` for its
//! configuration type (examples/llama/ does this for a Llama-style decoder).
//!
//! A family says
//! ```
//!   rank_model<T, B, Comm, TP>   the type each rank holds: TP = the mesh has a TensorParallel
//!                                axis. A pipeline chunk is the same type built for a part.
//!   one_rank_model<T, B, Comm>   the unsplit model the check's one-rank run trains
//!   make<M>(ctx, cfg, seed, tp, options, part, loaded)
//!                                this rank's model (part: the units of a pipeline chunk, or
//!                                none for the whole model); `tp` is the mesh's tensor-parallel
//!                                group (one rank without a TP axis); `loaded`: the caller sets
//!                                the values next, so a deferred build may be kept
//!   make_one_rank(ctx, cfg, seed, single)   the one-rank model (`single`: a group of one rank)
//!   cut_costs(cfg)               how a pipeline balances the blocks (`CutCosts`,
//!                                layers/model_part.hpp; parallel/pp/partition.hpp)
//! ```
//! What the runtime then asks of the model itself is what the strategies ask: `trainable_model`
//! and FSDP units (train/strategy.hpp, ShardedStrategy), `pp::pipeline_chunk` for a pipeline
//! chunk, and for a tensor-parallel model `model_parallel_model` (train/sharded_strategy.hpp)
//! plus `gather_over_tp(local)` / `local_parameters(ctx)` (the unsplit tensors for the check).
#pragma once

#include "fourway/layers/model_part.hpp"

namespace fourway {

template <class Config>
struct model_family {
  static_assert(sizeof(Config) == 0,
                "fourway: no fw::model_family<Config> for this configuration type; specialise "
                "fw::model_family<YourConfig> (see train/model_family.hpp and examples/llama/) to "
                "train your model on a Mesh");
};

namespace detail {
template <class>
inline constexpr bool no_default_model = false;
template <class>
struct as_void {
  using type = void;
};
}  // namespace detail

/// The configuration type `MeshStrategy<M, P, B, Comm>` and `check_mesh<M, P>` train when none
/// is named. train/ names no model: GPT-2 registers itself as the default (models/gpt2.hpp,
/// which the umbrella fourway/fourway.hpp includes).
template <class Tag = void>
struct default_model_config {
  static_assert(detail::no_default_model<Tag>,
                "fourway: MeshStrategy<M, P, B, Comm> and check_mesh<M, P> without a Config train "
                "GPT-2: include fourway/models/gpt2.hpp (or fourway/fourway.hpp), or name your "
                "model's Config (train/model_family.hpp)");
};
/// `default_model_config<void>::type`, looked up where the strategy is named (`Use` makes it
/// dependent), so that a header included after train/ can still register the default.
template <class Use>
using default_model_config_t =
    typename default_model_config<typename detail::as_void<Use>::type>::type;

}  // namespace fourway
