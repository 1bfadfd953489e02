//! The data-parallel policy tags as ZeRO stages: `fw::data_parallel_stage_v<Policy>` is 0 for
//! `DataParallel` and S for `Sharded<S>` (the stage `fw::ShardedStrategy`, train/
//! sharded_strategy.hpp, runs; `data_parallel_strategy_t` there is built on this mapping).
//!
//! `DataParallel` is stage 0: full replicas, gradients all-reduced (summed) in buckets as backward
//! completes them (`GradientReducer`), every bucket waited on before the optimizer.
//! `Sharded<1|2|3>` shard optimizer state, then gradients, then parameters (`UnitGatherer`);
//! docs/parallel.md.
//!
//! ```
//!   backward:  unit L+1 | unit L | ... | unit 1 | unit 0 |  optimizer
//!   buckets:        [b0 ready]──all-reduce b0──▶
//!                            [b1 ready]──all-reduce b1──▶
//!                                                 [b2]──ar b2──▶ wait all ▶ AdamW
//! ```
//! Any other policy tag is a compile error: a strategy is never silently replaced by another.
//! `data_parallel_policy_t<Stage>` maps back, so code holding a stage number asks the tag what is
//! sharded (`shards_optimizer_state`, `shards_grads`, `shards_params`, mesh/policies.hpp).
#pragma once

#include <type_traits>

#include "fourway/mesh/policies.hpp"

namespace fourway {

namespace detail {
template <class>
inline constexpr bool dependent_false = false;
}  // namespace detail

/// The ZeRO stage of a data-parallel policy tag (specialisations below).
template <class Policy>
struct data_parallel_stage {
  static_assert(detail::dependent_false<Policy>,
                "fourway: data_parallel_strategy_t<Policy, ...> needs Policy = fw::DataParallel or "
                "fw::Sharded<1|2|3>; TensorParallel and Pipeline are other axes of the Mesh");
};
template <>
struct data_parallel_stage<DataParallel> : std::integral_constant<int, 0> {};
template <int S>
struct data_parallel_stage<Sharded<S>> : std::integral_constant<int, S> {};

template <class Policy>
inline constexpr int data_parallel_stage_v = data_parallel_stage<Policy>::value;

/// The policy tag of a ZeRO stage (the inverse of `data_parallel_stage`): `DataParallel` for 0,
/// `Sharded<S>` otherwise. Strategies and parts templated on the stage number branch on this
/// tag's `shards_optimizer_state`, `shards_grads` and `shards_params`, never on the number.
template <int Stage>
struct data_parallel_policy {
  using type = Sharded<Stage>;
};
template <>
struct data_parallel_policy<0> {
  using type = DataParallel;
};
template <int Stage>
using data_parallel_policy_t = typename data_parallel_policy<Stage>::type;

}  // namespace fourway
