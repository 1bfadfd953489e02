//! Hugging Face GPT-2 files for a tensor-parallel model: the ordinary unsplit file, read and
//! written through the placement table (parallel/tp/placement.hpp).
//!
//! Load: every rank reads from the file (positioned reads, `SafetensorsReader`) only the runs
//! of elements its table entry names. Save: the slices are gathered
//! over the tensor-parallel group (`tp::Gpt::gather_over_tp`, the vocabulary padding dropped) and
//! one rank writes the file that `load_gpt2` of the one-rank model reads.
#pragma once

#include <filesystem>
#include <span>
#include <vector>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/checkpoint/sharded_io.hpp"
#include "fourway/parallel/tp/gpt.hpp"

namespace fourway {

namespace detail {
inline std::vector<std::int64_t> hf_shape(const tp::Placement& p) {
  if (p.matrix) return {p.rows, p.cols};
  return {p.cols};
}
}  // namespace detail

/// Sets every parameter of the tensor-parallel `model` to its slice of the tensor of the same
/// name in the file behind `f` (the shapes `inspect_gpt2(f)` reports must be the model's): only
/// the runs of elements this rank holds are read, with positioned reads.
template <class T, class B, class Comm>
void load_gpt2_tp(const Context<B>& ctx, const SafetensorsReader& f, tp::Gpt<T, B, Comm>& model) {
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

/// Writes the full tensors `full` (from `model.gather_over_tp`, visit order) as a GPT-2 file in
/// the model's element type.
template <class T, class B, class Comm>
void save_gpt2_tp(const tp::Gpt<T, B, Comm>& model, const std::vector<std::vector<float>>& full,
                  const std::filesystem::path& path) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  const auto& table = model.placements();
  for (std::size_t i = 0; i < table.size(); ++i) {
    std::vector<T> host(full[i].size());
    for (std::size_t k = 0; k < host.size(); ++k) host[k] = convert<T>(full[i][k]);
    w.add<T>(table[i].name, detail::hf_shape(table[i]), std::span<const T>(host));
  }
  w.write(path);
}

}  // namespace fourway
