//! Hugging Face GPT-2 files for a tensor-parallel model: the ordinary unsplit file, read and
//! written through the model's placements (layers/placement.hpp). The file layer knows slices and
//! runs, not models: any model that lists the runs of the unsplit tensors it holds
//! (`load_runs`, e.g. models::Gpt over a tp group, through `tp::load_slices`,
//! layers/sliced_model.hpp) loads here.
//!
//! Load: every rank reads from the file (positioned reads, `SafetensorsReader`) only the runs
//! of elements its table entry names. Save: every rank writes only the runs it owns, through the
//! strategy's checkpoint runs (train/weights_save.hpp), the file `load_gpt2` of the one-rank
//! model reads.
#pragma once

#include <filesystem>
#include <vector>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/checkpoint/sharded_io.hpp"
#include "fourway/layers/placement.hpp"

namespace fourway {

namespace detail {
inline std::vector<std::int64_t> hf_shape(const tp::Placement& p) {
  if (p.matrix) return {p.rows, p.cols};
  return {p.cols};
}
}  // namespace detail

/// Sets every parameter of the tensor-parallel `model` to its slice of the tensor of the same
/// name in the file behind `f` (the shapes `inspect_gpt2(f)` reports must be the model's): only
/// the runs of elements this rank holds are read, with positioned reads. `Model` is any model
/// whose parameters are slices of unsplit tensors and which lists them as runs: `load_runs(ctx,
/// fn)` calls `fn(placement, first, count, out)` for every run of unsplit elements [first, first +
/// count) it holds and copies `out` into place.
template <class B, class Model>
void load_gpt2_tp(const Context<B>& ctx, const SafetensorsReader& f, Model& model) {
  const Gpt2FileInfo info = inspect_gpt2(f);
  const tp::Placement* resolved = nullptr;  // the entry is looked up once per placement
  const SafetensorsEntry* e = nullptr;
  model.load_runs(ctx, [&](const tp::Placement& p, std::int64_t first, std::int64_t count,
                           float* out) {
    if (resolved != &p) {
      e = f.find(info.prefix + p.name);
      check<CheckpointError>(e != nullptr, "fourway: ", f.source(), " has no tensor ", info.prefix,
                             p.name, " that the model needs");
      check<CheckpointError>(e->shape == detail::hf_shape(p), "fourway: ", f.source(), ": tensor ",
                             e->name, " has shape ", e->shape_str(), " but the model's ", p.name,
                             " is ", detail::shape_text(detail::hf_shape(p)));
      resolved = &p;
    }
    f.read_elements(*e, first, count, out);
  });
}

}  // namespace fourway
