//! One weights file written by every rank of a mesh at once, each rank writing only what it owns.
//!
//! A strategy's `checkpoint_runs(true)` (train/state_runs.hpp) names the global elements a rank
//! writes to a checkpoint: its ZeRO shard (or, for replicas, its 1/D of each parameter), placed in
//! the unsplit tensors through the model's views — a tensor-parallel slice as strided runs, a
//! pipeline rank's chunks by their global names, padding and the tied copy of `wte` left out. Over
//! the mesh every element of every tensor is named exactly once, on every mesh the library builds
//! (data, tensor, pipeline parallel and their compositions). `save_weights_sharded` writes the
//! working weights of those runs into one safetensors file with `write_safetensors_collective`
//! (checkpoint/sharded_io.hpp): the file is byte-identical to the one a single rank holding the
//! whole model writes, and no rank gathers, receives or allocates anything of the model beyond
//! what it holds. Device values reach the file through one host tensor of at most 2^16 elements,
//! counted under `workspace` by the rank's accountant, so a memory cap covers the save too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/ops.hpp"
#include "fourway/checkpoint/sharded_io.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/train/state_runs.hpp"

namespace fourway {

/// Puts the working weights of `runs` (none padding) into `sink`: element j of run i goes to
/// element first + i·stride + j of the tensor of `tensors` with the run's name, as `T`. Local
/// memory is copied to the host a span of runs at a time, through one staging tensor of at most
/// 2^16 elements counted under `workspace` in `ctx`'s accountant.
template <class T, class B>
void write_weight_runs(const Context<B>& ctx, const std::vector<StateRun<T, B>>& runs,
                       const std::vector<CollectiveTensor>& tensors, PieceSink& sink) {
  constexpr std::int64_t chunk = 1 << 16;
  std::map<std::string, std::size_t, std::less<>> index;
  for (std::size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].name, i);
  std::int64_t widest = 0;
  for (const auto& r : runs) {
    if (!r.padding)
      widest = std::max(widest, std::min(chunk, (r.rows - 1) * r.local_stride + r.count));
  }
  if (widest == 0) return;
  const Tensor<T, Host> stage(Shape{widest}, MemTag::workspace, ctx.memory());
  const auto put = [&](std::size_t t, std::int64_t element, const T* values, std::int64_t n) {
    sink.write(t, static_cast<std::uint64_t>(element) * sizeof(T),
               std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(values),
                                              static_cast<std::size_t>(n) * sizeof(T)));
  };
  for (const auto& r : runs) {
    if (r.padding) continue;
    const auto it = index.find(r.tensor);
    check<CheckpointError>(it != index.end(), "fourway: the model's parameter ", r.tensor,
                           " is not a tensor of the file being saved");
    check<CheckpointError>(tensors[it->second].shape == r.shape, "fourway: the model's ", r.tensor,
                           " has shape ", detail::shape_text(r.shape), " but the file's is ",
                           detail::shape_text(tensors[it->second].shape));
    for_each_run_piece(
        r, chunk,
        [&](std::int64_t i, std::int64_t rows, std::int64_t c, std::int64_t n, std::int64_t len) {
          Ops<B>::to_host(ctx, stage.data(), r.weights + i * r.local_stride + c, len);
          for (std::int64_t j = 0; j < rows; ++j) {
            put(it->second, r.first + (i + j) * r.stride + c, stage.data() + j * r.local_stride, n);
          }
        });
  }
}

/// Saves the working weights strategy `s` holds on this rank into the file of `tensors` (in file
/// order; every element of them must be some rank's) at `path`, byte-identical to the one-rank
/// file: a collective of every rank of the mesh (`flags` agree over all of them; `rank` 0 creates
/// and renames). Operations the strategy still has queued finish first. Returns the bytes this
/// rank wrote.
template <class Strategy>
std::uint64_t save_weights_sharded(Strategy& s, const std::vector<CollectiveTensor>& tensors,
                                   const std::map<std::string, std::string>& metadata, int rank,
                                   const FlagGather& flags, const std::filesystem::path& path) {
  if constexpr (requires { s.wait_idle(); }) s.wait_idle();
  const auto runs = s.checkpoint_runs(true);
  return write_safetensors_collective(rank, flags, path, metadata, tensors, [&](PieceSink& sink) {
    write_weight_runs(s.context(), runs, tensors, sink);
  });
}

}  // namespace fourway
