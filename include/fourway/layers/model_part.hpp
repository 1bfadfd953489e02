//! Which units of a decoder a model object holds, and what each unit costs when a pipeline cuts
//! the model: the vocabulary the pipeline runtime (parallel/pp, train/) speaks for every model.
//!
//! A decoder's units are its embedding (unit 0), its `layers` blocks (units 1 .. layers) and its
//! head (final norm, LM head, loss: unit layers + 1). A `ModelPart` is a run of blocks, with the
//! embedding when it starts the model and the head when it ends it; the model builds the units a
//! part names (models::Gpt, whole or split, and fw::Decoder). `CutCosts` is what a model reports so
//! that a pipeline's partition can balance its blocks over the stages (`pp::Partition::balanced`).
#pragma once

#include <cstdint>
#include <string_view>

#include "fourway/core/error.hpp"

namespace fourway {

/// Which units a model object holds; the default is the whole model.
struct ModelPart {
  int first_block = 0;
  int end_block = -1;     // one past the last block held; -1: through the last block
  bool embedding = true;  // unit 0: the embedding
  bool head = true;       // unit layers + 1: the final norm, LM head and loss
};

/// `p` with its end resolved (-1: through the last of the model's `layers` blocks), checked to be
/// a range of them; `what` names the part in the error. Every model cut into parts resolves its
/// part here.
inline ModelPart resolve_part(ModelPart p, int layers, std::string_view what = "model part") {
  if (p.end_block < 0) p.end_block = layers;
  check<ConfigError>(0 <= p.first_block && p.first_block <= p.end_block && p.end_block <= layers,
                     "fourway: ", what, " blocks [", p.first_block, ", ", p.end_block,
                     ") are not a range of the model's ", layers, " blocks");
  return p;
}

/// What a pipeline's partition weighs (parameter counts): `layers` equal blocks of `block`, the
/// first chunk's embedding and the last chunk's head.
struct CutCosts {
  int layers = 1;
  std::int64_t block = 1;
  std::int64_t embedding = 0;
  std::int64_t head = 0;
};

}  // namespace fourway
