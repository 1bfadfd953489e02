//! DataParallel and Sharded<S> as training strategies: `fw::data_parallel_strategy_t<Policy,
//! Model, Precision, B, Comm>` is the `ShardedStrategy` (parallel/sharded.hpp) a policy tag of
//! the data-parallel axis stands for.
//!
//! `DataParallel` is stage 0: full replicas, gradients all-reduced (summed) in buckets of
//! `ShardedOptions::bucket_bytes` as backward completes them, every bucket waited on before the
//! optimizer, which then runs identically on every rank. `Sharded<1|2|3>` shard optimizer
//! state, then gradients, then parameters (docs/parallel.md has the pictures).
//!
//! ```
//!   backward:  unit L+1 | unit L | ... | unit 1 | unit 0 |  optimizer
//!   buckets:        [b0 ready]──all-reduce b0──▶
//!                            [b1 ready]──all-reduce b1──▶
//!                                                 [b2]──ar b2──▶ wait all ▶ AdamW
//! ```
//! Any other policy tag is a compile error: a strategy is never silently replaced by another.
#pragma once

#include <type_traits>

#include "fourway/mesh/policies.hpp"
#include "fourway/parallel/sharded.hpp"

namespace fourway {

namespace detail {
template <class>
inline constexpr bool dependent_false = false;
}  // namespace detail

/// Maps a data-parallel policy tag to its strategy (specialisations below).
template <class Policy, class Model, class P, class B, class Comm>
struct data_parallel_strategy {
  static_assert(detail::dependent_false<Policy>,
                "fourway: data_parallel_strategy_t<Policy, ...> needs Policy = fw::DataParallel or "
                "fw::Sharded<1|2|3>; TensorParallel and Pipeline are other axes of the Mesh");
};
template <class Model, class P, class B, class Comm>
struct data_parallel_strategy<DataParallel, Model, P, B, Comm> {
  using type = ShardedStrategy<0, Model, P, B, Comm>;
};
template <int S, class Model, class P, class B, class Comm>
struct data_parallel_strategy<Sharded<S>, Model, P, B, Comm> {
  using type = ShardedStrategy<S, Model, P, B, Comm>;
};

template <class Policy, class Model, class P, class B, class Comm>
using data_parallel_strategy_t = typename data_parallel_strategy<Policy, Model, P, B, Comm>::type;

/// Full replicas with bucketed, overlapped gradient all-reduce (ZeRO stage 0).
template <class Model, class P, class B, class Comm>
using DataParallelStrategy = ShardedStrategy<0, Model, P, B, Comm>;

}  // namespace fourway
