//! Where a rank's local parameter lies in the global (unsplit) tensor of the same name, for
//! checkpoints that one mesh writes and another reads (train/state_runs.hpp).
//!
//! A `StateView` is a list of blocks, each `rows` runs of `count` elements: local run i starts at
//! local element local + i·local_stride, global run i at global element global + i·global_stride
//! of the flattened global tensor. An unsplit parameter is one block of one run (`state_view_of`'s
//! default; without the padding rows of a padded vocabulary); a tensor-parallel slice is a column
//! block per part, a row block or the real rows of a vocabulary slice (layers/embedding.hpp). Local
//! elements outside every block are padding.
#pragma once

#include <cstdint>

#include "fourway/layers/parameter.hpp"
#include "fourway/layers/placement.hpp"

namespace fourway {

/// The view of parameter `p` (index i) of `model`: the model's `state_view(i)` when it has one,
/// else the whole parameter (written unless the model's `counts_in_norm(i)` says otherwise).
template <class Model, class T, class B>
StateView state_view_of(const Model& model, int i, const Parameter<T, B>& p) {
  if constexpr (requires { model.state_view(i); }) {
    return model.state_view(i);
  } else {
    StateView v;  // padding rows (Parameter::padding_rows) come last and are not in the tensor
    const Shape logical = p.logical_shape();
    for (int d = 0; d < logical.rank(); ++d) v.shape.push_back(logical[d]);
    v.blocks.push_back({0, 0, 0, 0, p.logical_numel(), 1});
    if constexpr (requires { model.counts_in_norm(i); }) v.writes = model.counts_in_norm(i);
    return v;
  }
}

}  // namespace fourway
