//! `tp::TpOptions`: the run-time choices of a tensor-parallel split that a mesh passes to the
//! model it builds (train/mesh_strategy.hpp `MeshOptions::tensor`, any model family's
//! `make_rank_model`): sequence parallelism and the vocabulary padding.
#pragma once

namespace fourway::tp {

/// Run-time choices of the split.
struct TpOptions {
  bool sequence_parallel = false;
  /// Vocabulary padded to a multiple of tp·alignment; 0 picks 128 on device backends (Megatron-
  /// LM's default, whole tiles for the GEMM) and 1 on the host.
  int vocab_alignment = 0;
};

/// The alignment `TpOptions::vocab_alignment` stands for on backend `B`.
template <class B>
int resolve_alignment(int alignment) {
  return alignment > 0 ? alignment : (B::on_device ? 128 : 1);
}

}  // namespace fourway::tp
