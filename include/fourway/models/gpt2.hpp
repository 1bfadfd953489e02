//! GPT-2 on every mesh: fourway's GPT (`models::Gpt<T, B, Comm>`, layers/gpt.hpp — one
//! definition, whole in a group of one rank, split over a tensor-parallel group) registered with
//! the generic runtime of train/, which names no model. This is the one place that says what the
//! strategies build for a GPT:
//! ```
//!   model_family<models::GptConfig>   the family (train/model_family.hpp): models::Gpt<T, B>
//!                                     without a TensorParallel axis (built deferred, so a rank
//!                                     materialises only what it owns under ZeRO-3),
//!                                     models::Gpt<T, B, Comm> over the tp group with one
//!   default_model_config<>            GPT-2 is the family MeshStrategy<M, P, B, Comm> and
//!                                     check_mesh<M, P> train when no Config is named
//!   TensorParallelStrategy<S, T, B, Comm>   ShardedStrategy<S> over the split GPT
//!                                     (docs/parallel-tp.md)
//!   models::part_factory<T>(ctx, cfg, seed) a PipelineStrategy's chunk factory: models::Gpt parts
//!                                     with the whole model's values; models::cut_costs(cfg)
//!                                     (layers/gpt.hpp) balances them
//!   save_gpt2_sharded(s, cfg, ...)    the Hugging Face file of a run, every rank writing what it
//!                                     owns (train/weights_save.hpp)
//! ```
//! A model of the user's own registers itself the same way (fw::decoder_family, train/decoder.hpp;
//! examples/llama/, examples/gptj/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <type_traits>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/layers/model_part.hpp"
#include "fourway/layers/tp_options.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/train/model_family.hpp"
#include "fourway/train/sharded_strategy.hpp"
#include "fourway/train/weights_save.hpp"

namespace fourway {

/// GPT-2: models::Gpt whole without a tensor-parallel axis, over the tp group with one.
template <>
struct model_family<models::GptConfig> {
  using config_type = models::GptConfig;
  template <class T, class B, class Comm, bool TensorParallel>
  using rank_model = models::Gpt<T, B, std::conditional_t<TensorParallel, Comm, Alone>>;
  template <class T, class B, class Comm>
  using one_rank_model = models::Gpt<T, B>;

  template <class M, class B, class Comm>
  static std::unique_ptr<M> make(const Context<B>& ctx, const config_type& cfg, std::uint64_t seed,
                                 Comm& tp, const tp::TpOptions& options,
                                 std::optional<ModelPart> part, bool loaded) {
    if constexpr (!std::is_same_v<typename M::comm_type, Alone>) {
      return std::make_unique<M>(ctx, cfg, tp, seed, options, part.value_or(ModelPart{}));
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
  static CutCosts cut_costs(const config_type& cfg) { return models::cut_costs(cfg); }
};

/// GPT-2 is what a mesh trains when no configuration type is named.
template <>
struct default_model_config<void> {
  using type = models::GptConfig;
};

/// A tensor-parallel GPT trained over a mesh's data-parallel group: the ShardedStrategy
/// (train/sharded_strategy.hpp) over the dp group, owning the optimizer and the step, applied to
/// `models::Gpt<T, B, Comm>`, which holds the tensor-parallel group:
/// ```
///   world of D·N ranks (fw::Mesh<TensorParallel<N>, DataParallel>, tp fastest):
///     tp group (N consecutive ranks)   splits every layer; gradients of split parameters are
///                                      already complete per rank, replicated ones identical
///     dp group (D ranks, stride N)     ShardedStrategy<Stage> reduces / shards this rank's
///                                      local parameters exactly as for an unsplit model
///   global norm: Σg² over the tiles this rank owns, counting a replicated parameter on tp
///                rank 0 only, summed over dp (stages 1-3) and over tp
/// ```
/// Stage 0 is DataParallel across the groups, 1-3 ZeRO sharding each TP rank's local parameters.
template <int Stage, class T, class B, class Comm>
using TensorParallelStrategy =
    ShardedStrategy<Stage, models::Gpt<T, B, Comm>, Precision<T>, B, Comm>;

/// `save_weights_sharded` (train/weights_save.hpp) of a GPT-2 model of `cfg`: the Hugging Face
/// file `save_gpt2` writes of the same weights on one rank (HF names, the strategy's element
/// type), every rank of the mesh writing only what it owns.
template <class Strategy>
std::uint64_t save_gpt2_sharded(Strategy& s, const models::GptConfig& cfg, int rank,
                                const FlagGather& flags, const std::filesystem::path& path) {
  return save_weights_sharded(s, gpt2_file_tensors<typename Strategy::param_type>(cfg),
                              gpt2_metadata(), rank, flags, path);
}

namespace models {

/// A pipeline's chunk factory for GPT-2 (`PipelineStrategy<P, B, Comm, Z, models::Gpt<T, B>>`):
/// each chunk the units its part names, values equal to the whole model's for `seed`. `ctx`
/// must outlive the factory.
template <class T, class B>
auto part_factory(const Context<B>& ctx, const GptConfig& cfg, std::uint64_t seed) {
  return [&ctx, cfg, seed](const ModelPart& part) {
    return std::make_unique<Gpt<T, B>>(ctx, cfg, seed, part);
  };
}

}  // namespace models

}  // namespace fourway
