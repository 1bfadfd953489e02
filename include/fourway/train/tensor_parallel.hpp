//! Training a tensor-parallel GPT: `TensorParallelStrategy<Stage, T, B, Comm>` is the
//! ShardedStrategy (train/sharded_strategy.hpp) over the *data-parallel* group of a mesh, owning
//! the optimizer and the step, applied to `tp::Gpt` (parallel/tp/gpt.hpp), which holds the
//! tensor-parallel group:
//! ```
//!   world of D·N ranks (fw::Mesh<TensorParallel<N>, DataParallel>, tp fastest):
//!     tp group (N consecutive ranks)   splits every layer; gradients of split parameters are
//!                                      already complete per rank, replicated ones identical
//!     dp group (D ranks, stride N)     ShardedStrategy<Stage> reduces / shards this rank's
//!                                      local parameters exactly as for an unsplit model
//!   global norm: Σg² over the tiles this rank owns, counting a replicated parameter on tp
//!                rank 0 only, summed over dp (stages 1-3) and over tp
//! ```
//! Stage 0 is DataParallel across the groups, 1-3 ZeRO sharding each TP rank's local parameters.
#pragma once

#include "fourway/optim/precision.hpp"
#include "fourway/parallel/tp/gpt.hpp"
#include "fourway/train/sharded_strategy.hpp"

namespace fourway {

template <int Stage, class T, class B, class Comm>
using TensorParallelStrategy = ShardedStrategy<Stage, tp::Gpt<T, B, Comm>, Precision<T>, B, Comm>;

}  // namespace fourway
