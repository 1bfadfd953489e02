//! `model_family<Config>`: what the mesh runtime (train/mesh_strategy.hpp) and the numerics
//! check (train/mesh_check.hpp) build for a model configuration of type `Config`. The type of
//! the configuration names the model: fourway's GPT is `model_family<models::GptConfig>` (below);
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
//!   cut_costs(cfg)               how a pipeline balances the blocks (parallel/pp/partition.hpp)
//! ```
//! What the runtime then asks of the model itself is what the strategies ask: `trainable_model`
//! and FSDP units (train/strategy.hpp, ShardedStrategy), `pp::pipeline_chunk` for a pipeline
//! chunk, and for a tensor-parallel model `model_parallel_model` (train/sharded_strategy.hpp)
//! plus `gather_over_tp(local)` / `local_parameters(ctx)` (the unsplit tensors for the check).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>

#include "fourway/layers/gpt.hpp"
#include "fourway/parallel/pp/partition.hpp"
#include "fourway/parallel/tp/gpt.hpp"

namespace fourway {

template <class Config>
struct model_family {
  static_assert(sizeof(Config) == 0,
                "fourway: no fw::model_family<Config> for this configuration type; specialise "
                "fw::model_family<YourConfig> (see train/model_family.hpp and examples/llama/) to "
                "train your model on a Mesh");
};

/// GPT-2: models::Gpt without a tensor-parallel axis (built deferred, so a rank materialises only
/// what it owns under ZeRO-3), tp::Gpt with one.
template <>
struct model_family<models::GptConfig> {
  using config_type = models::GptConfig;
  template <class T, class B, class Comm, bool TensorParallel>
  using rank_model = std::conditional_t<TensorParallel, tp::Gpt<T, B, Comm>, models::Gpt<T, B>>;
  template <class T, class B, class Comm>
  using one_rank_model = models::Gpt<T, B>;

  template <class M, class B, class Comm>
  static std::unique_ptr<M> make(const Context<B>& ctx, const config_type& cfg, std::uint64_t seed,
                                 Comm& tp, const tp::TpOptions& options,
                                 std::optional<models::GptPart> part, bool loaded) {
    using T = typename M::value_type;
    if constexpr (std::is_same_v<M, tp::Gpt<T, B, Comm>>) {
      return std::make_unique<M>(ctx, cfg, tp, seed, options, part.value_or(models::GptPart{}));
    } else {
      (void)tp;
      (void)options;
      if (part) return std::make_unique<M>(ctx, cfg, seed, *part);
      return loaded ? std::make_unique<M>(ctx, cfg, seed)
                    : std::make_unique<M>(M::deferred(ctx, cfg, seed));
    }
  }
  template <class T, class B, class Comm>
  static std::unique_ptr<models::Gpt<T, B>> make_one_rank(const Context<B>& ctx,
                                                          const config_type& cfg,
                                                          std::uint64_t seed, Comm& /*single*/) {
    return std::make_unique<models::Gpt<T, B>>(ctx, cfg, seed);
  }
  static pp::CutCosts cut_costs(const config_type& cfg) { return pp::Partition::gpt_costs(cfg); }
};

}  // namespace fourway
