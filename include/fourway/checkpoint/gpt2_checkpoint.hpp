//! Hugging Face GPT-2 weights in safetensors files: infer the model shape, load, save.
//!
//! Names (an optional `transformer.` prefix is accepted on reading, never written):
//! ```
//!   wte.weight (V, C)   wpe.weight (T, C)   ln_f.{weight,bias} (C)
//!   h.{i}.ln_1.{weight,bias} (C)            h.{i}.ln_2.{weight,bias} (C)
//!   h.{i}.attn.c_attn.weight (C, 3C)  .bias (3C)    h.{i}.attn.c_proj.weight (C, C)  .bias (C)
//!   h.{i}.mlp.c_fc.weight (C, 4C)     .bias (4C)    h.{i}.mlp.c_proj.weight (4C, C)  .bias (C)
//! ```
//! Matrices are (in, out) as HF's Conv1D stores them, which is also fourway's Linear layout, so
//! nothing is transposed. The LM head is tied to `wte`. Buffers HF keeps in some files
//! (`h.{i}.attn.bias`, `h.{i}.attn.masked_bias`) are ignored, and so is `lm_head.weight` when it
//! equals `wte.weight` bit for bit (an untied head is refused). Any other tensor is an error:
//! a file with names this mapping does not know is not a GPT-2 and must not load half-way.
//! F32, F16, BF16 (and F64) convert to the model's element type on load.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fourway/backend/ops.hpp"
#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/checkpoint/sharded_io.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/layers/parameter.hpp"

namespace fourway {

/// The GPT-2 tensor names and shapes of a model of `layers` blocks, width `dim`, vocabulary
/// `vocab` and context `ctx`, in Hugging Face order.
inline std::vector<std::pair<std::string, std::vector<std::int64_t>>> gpt2_tensor_shapes(
    int layers, std::int64_t dim, std::int64_t vocab, std::int64_t ctx) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> v;
  const std::int64_t C = dim;
  v.push_back({"wte.weight", {vocab, C}});
  v.push_back({"wpe.weight", {ctx, C}});
  for (int i = 0; i < layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    v.push_back({h + "ln_1.weight", {C}});
    v.push_back({h + "ln_1.bias", {C}});
    v.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
    v.push_back({h + "attn.c_attn.bias", {3 * C}});
    v.push_back({h + "attn.c_proj.weight", {C, C}});
    v.push_back({h + "attn.c_proj.bias", {C}});
    v.push_back({h + "ln_2.weight", {C}});
    v.push_back({h + "ln_2.bias", {C}});
    v.push_back({h + "mlp.c_fc.weight", {C, 4 * C}});
    v.push_back({h + "mlp.c_fc.bias", {4 * C}});
    v.push_back({h + "mlp.c_proj.weight", {4 * C, C}});
    v.push_back({h + "mlp.c_proj.bias", {C}});
  }
  v.push_back({"ln_f.weight", {C}});
  v.push_back({"ln_f.bias", {C}});
  return v;
}

/// What a GPT-2 safetensors file says about the model.
struct Gpt2FileInfo {
  std::string prefix;  // "" or "transformer."
  int layers = 0;
  std::int64_t dim = 0, vocab = 0, context = 0;
  std::vector<std::string> ignored;  // buffers present in the file and not loaded

  /// The model config; `heads` 0 means dim / 64 (every released GPT-2 has 64-wide heads).
  [[nodiscard]] models::GptConfig config(int heads = 0) const {
    if (heads == 0) {
      check<ConfigError>(dim % 64 == 0, "fourway: cannot infer the head count of width ", dim,
                         " (not a multiple of GPT-2's head size 64); pass --heads");
      heads = static_cast<int>(dim / 64);
    }
    check<ConfigError>(heads > 0 && dim % heads == 0, "fourway: ", heads,
                       " heads do not divide the checkpoint's width ", dim,
                       "; pass a --heads that divides ", dim);
    models::GptConfig c;
    c.layers = layers;
    c.heads = heads;
    c.dim = static_cast<int>(dim);
    c.vocab = static_cast<int>(vocab);
    c.max_seq = static_cast<int>(context);
    return c;
  }
};

namespace detail {
inline std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}
inline bool is_gpt2_buffer(std::string_view rest) {
  // h.{i}.attn.bias / h.{i}.attn.masked_bias: the causal mask HF registers as a buffer
  if (rest.substr(0, 2) != "h.") return false;
  const auto dot = rest.find('.', 2);
  if (dot == std::string_view::npos || dot == 2) return false;
  for (std::size_t i = 2; i < dot; ++i) {
    if (rest[i] < '0' || rest[i] > '9') return false;
  }
  const auto tail = rest.substr(dot + 1);
  return tail == "attn.bias" || tail == "attn.masked_bias";
}
}  // namespace detail

/// Infers layers, width, vocabulary and context from the shapes in `f` (a `SafetensorsFile` or a
/// `SafetensorsReader`) and checks that every GPT-2 tensor is present with the shape those imply.
/// Throws `CheckpointError` otherwise.
template <class File>
Gpt2FileInfo inspect_gpt2(const File& f) {
  Gpt2FileInfo info;
  const auto& src = f.source();
  if (f.find("wte.weight") == nullptr && f.find("transformer.wte.weight") != nullptr) {
    info.prefix = "transformer.";
  }
  const auto* wte = f.find(info.prefix + "wte.weight");
  const auto* wpe = f.find(info.prefix + "wpe.weight");
  check<CheckpointError>(wte != nullptr && wpe != nullptr, "fourway: ", src,
                         " is not a GPT-2 checkpoint: it has no wte.weight and wpe.weight "
                         "(with or without the transformer. prefix)");
  check<CheckpointError>(wte->shape.size() == 2 && wpe->shape.size() == 2 &&
                             wte->shape[1] == wpe->shape[1] && wte->shape[0] > 0 &&
                             wpe->shape[0] > 0 && wte->shape[1] > 0,
                         "fourway: ", src, ": wte.weight ", wte->shape_str(), " and wpe.weight ",
                         wpe->shape_str(), " must be (vocab, C) and (context, C) with one C");
  info.vocab = wte->shape[0];
  info.context = wpe->shape[0];
  info.dim = wte->shape[1];
  check<CheckpointError>(
      info.vocab <= (1 << 30) && info.context <= (1 << 30) && info.dim <= (1 << 24),
      "fourway: ", src, ": implausible GPT-2 sizes vocab ", info.vocab, ", context ", info.context,
      ", width ", info.dim);
  while (f.find(info.prefix + "h." + std::to_string(info.layers) + ".ln_1.weight") != nullptr) {
    ++info.layers;
  }
  check<CheckpointError>(info.layers > 0, "fourway: ", src, " has no block h.0 (no ", info.prefix,
                         "h.0.ln_1.weight)");

  std::set<std::string> expected;
  for (const auto& [name, shape] :
       gpt2_tensor_shapes(info.layers, info.dim, info.vocab, info.context)) {
    const auto* e = f.find(info.prefix + name);
    check<CheckpointError>(e != nullptr, "fourway: ", src, ": GPT-2 tensor ", info.prefix, name,
                           " is missing (the file has ", info.layers, " blocks of width ", info.dim,
                           ")");
    check<CheckpointError>(e->shape == shape, "fourway: ", src, ": tensor ", e->name, " has shape ",
                           e->shape_str(), ", GPT-2 of width ", info.dim, " needs ",
                           detail::shape_text(shape));
    expected.insert(e->name);
  }
  std::vector<std::string> unknown;
  for (const auto& e : f.entries()) {
    if (expected.contains(e.name)) continue;
    std::string_view rest = e.name;
    if (!info.prefix.empty() && rest.substr(0, info.prefix.size()) == info.prefix) {
      rest.remove_prefix(info.prefix.size());
    }
    if (detail::is_gpt2_buffer(rest)) {
      info.ignored.push_back(e.name);
    } else if (e.name == "lm_head.weight") {
      check<CheckpointError>(f.same_bytes(e, *wte), "fourway: ", src,
                             ": lm_head.weight differs from wte.weight; "
                             "fourway's GPT-2 ties the head to wte and cannot load an untied head");
      info.ignored.push_back(e.name);
    } else {
      unknown.push_back(e.name);
    }
  }
  if (!unknown.empty()) {
    std::string list;
    for (std::size_t i = 0; i < unknown.size() && i < 5; ++i) list += (i ? ", " : "") + unknown[i];
    if (unknown.size() > 5) list += detail::cat(", ... (", unknown.size(), " in all)");
    throw CheckpointError(detail::cat("fourway: ", src, " has tensors that are not part of a ",
                                      info.layers, "-block GPT-2: ", list));
  }
  return info;
}

namespace detail {
/// The shape parameter `p` has in a file: its logical shape (a padded vocabulary's real rows).
template <class P>
std::vector<std::int64_t> file_shape(const P& p) {
  const Shape s = p.logical_shape();
  std::vector<std::int64_t> out;
  for (int i = 0; i < s.rank(); ++i) out.push_back(s[i]);
  return out;
}

/// The entry of parameter `p` in `f` (name with `prefix`), checked to have p's file shape.
template <class File, class P>
const SafetensorsEntry& gpt2_entry(const File& f, const std::string& prefix, const P& p) {
  const auto* e = f.find(prefix + p.name);
  check<CheckpointError>(e != nullptr, "fourway: ", f.source(), " has no tensor ", prefix, p.name,
                         " that the model needs");
  check<CheckpointError>(e->shape == file_shape(p), "fourway: ", f.source(), ": tensor ", e->name,
                         " has shape ", e->shape_str(), " but the model's ", p.name, " is ",
                         p.logical_shape().str());
  return *e;
}

/// Refuses a load that set `loaded` parameters from a file holding `info`'s GPT-2, unless they
/// are all of its tensors (or, for a `part` of the model, fewer).
inline void check_gpt2_count(const Gpt2FileInfo& info, std::size_t loaded,
                             const std::string& source, bool part) {
  const std::size_t expected =
      gpt2_tensor_shapes(info.layers, info.dim, info.vocab, info.context).size();
  check<CheckpointError>(loaded == expected || (part && loaded < expected),
                         "fourway: the model has ", loaded, " parameters, the GPT-2 in ", source,
                         " has ", expected);
}
}  // namespace detail

/// `read(p, first, count, out)`: elements [first, first + count) of parameter `p` from the GPT-2
/// file behind `f` (checked by `inspect_gpt2`: `info`), converted to p's element type, into the
/// host buffer `out`; elements of padding rows are zero. What a strategy's `load_weights` asks
/// for, range by range.
inline auto gpt2_element_reader(const SafetensorsReader& f, const Gpt2FileInfo& info) {
  return
      [&f, prefix = info.prefix](const auto& p, std::int64_t first, std::int64_t count, auto* out) {
        using T = std::remove_cvref_t<decltype(*out)>;
        const std::int64_t real = std::clamp<std::int64_t>(p.logical_numel() - first, 0, count);
        if (real > 0) f.read_elements(detail::gpt2_entry(f, prefix, p), first, real, out);
        std::fill(out + real, out + count, convert<T>(0.0f));
      };
}

/// The metadata Hugging Face writes in a GPT-2 file.
inline std::map<std::string, std::string> gpt2_metadata() { return {{"format", "pt"}}; }

/// Copies every parameter of `model` (HF names via `visit_parameters`) from `f`, converting to
/// the model's element type. The model must have the shape `inspect_gpt2(f)` reports.
template <class Model, class B>
void load_gpt2(const Context<B>& ctx, const SafetensorsFile& f, Model& model) {
  const Gpt2FileInfo info = inspect_gpt2(f);
  std::size_t loaded = 0;
  model.visit_parameters([&](auto& p) {
    using T = typename std::remove_cvref_t<decltype(p.weight)>::value_type;
    std::vector<T> host(static_cast<std::size_t>(p.logical_numel()));
    f.read_into(detail::gpt2_entry(f, info.prefix, p), std::span<T>(host));
    Ops<B>::from_host(ctx, p.weight.data(), host.data(), p.logical_numel());
    ++loaded;
  });
  detail::check_gpt2_count(info, loaded, f.source(), false);
}

/// Copies every parameter of `model` (which has its storage) from the file behind `f`, reading
/// each tensor with positioned reads through a bounded buffer (no whole-file buffer). With
/// `part = true` the model may hold only some of the file's tensors (a pipeline chunk reads only
/// its own); otherwise it must hold all of them.
template <class Model, class B>
void load_gpt2(const Context<B>& ctx, const SafetensorsReader& f, Model& model, bool part = false) {
  const Gpt2FileInfo info = inspect_gpt2(f);
  const auto read = gpt2_element_reader(f, info);
  std::size_t loaded = 0;
  model.visit_parameters([&](auto& p) {
    ++loaded;
    using T = typename std::remove_cvref_t<decltype(p.weight)>::value_type;
    check<CheckpointError>(!p.deferred(), "fourway: load_gpt2 into a deferred parameter ", p.name,
                           "; let the strategy load it (load_weights)");
    constexpr std::int64_t chunk = 1 << 16;
    std::vector<T> host(static_cast<std::size_t>(std::min(chunk, p.logical_numel())));
    for (std::int64_t at = 0; at < p.logical_numel(); at += chunk) {
      const std::int64_t n = std::min(chunk, p.logical_numel() - at);
      read(p, at, n, host.data());
      Ops<B>::from_host(ctx, p.weight.data() + at, host.data(), n);
    }
  });
  detail::check_gpt2_count(info, loaded, f.source(), part);
}

/// Adds every parameter of `model` to `w` under its HF name, in the model's element type
/// (F32, BF16 or F16), with metadata `format: pt` as HF writes it.
template <class Model, class B>
void add_gpt2_tensors(const Context<B>& ctx, Model& model, SafetensorsWriter& w) {
  for (const auto& [k, v] : gpt2_metadata()) w.set_metadata(k, v);
  model.visit_parameters([&](auto& p) {
    using T = typename std::remove_cvref_t<decltype(p.weight)>::value_type;
    std::vector<T> host(static_cast<std::size_t>(p.logical_numel()));
    Ops<B>::to_host(ctx, host.data(), p.weight.data(), p.logical_numel());
    w.add<T>(p.name, detail::file_shape(p), std::span<const T>(host));
  });
}

/// The tensors of `model`'s GPT-2 file (HF names, the model's element type, visit order), for
/// `write_safetensors_collective`, with HF's metadata.
template <class Model>
std::vector<CollectiveTensor> gpt2_collective_tensors(Model& model) {
  std::vector<CollectiveTensor> out;
  model.visit_parameters([&](auto& p) {
    using T = typename std::remove_cvref_t<decltype(p.weight)>::value_type;
    out.push_back(CollectiveTensor{p.name, st_dtype_of<T>(), detail::file_shape(p)});
  });
  return out;
}

/// Writes `model`'s weights as a GPT-2 safetensors file (HF names, no prefix).
template <class Model, class B>
void save_gpt2(const Context<B>& ctx, Model& model, const std::filesystem::path& path) {
  SafetensorsWriter w;
  add_gpt2_tensors(ctx, model, w);
  w.write(path);
}

/// Loads `f` into the weights a data-parallel strategy holds (`ShardedStrategy::load_weights`):
/// each rank reads only the byte ranges of the elements it owns. A collective under ZeRO-1/2.
template <class Strategy>
void load_gpt2_sharded(Strategy& strategy, const SafetensorsReader& f) {
  strategy.load_weights(gpt2_element_reader(f, inspect_gpt2(f)));
}

/// Saves the weights a data-parallel strategy holds as one GPT-2 file, byte-identical to
/// `save_gpt2` of the same weights: each rank writes only the elements it owns
/// (`write_owned_weights`, `write_safetensors_collective`); nothing is gathered. A collective of
/// the group `flags` agree over. Returns the bytes this rank wrote.
template <class Strategy>
std::uint64_t save_gpt2_sharded(Strategy& strategy, int rank, const FlagGather& flags,
                                const std::filesystem::path& path) {
  using T = typename Strategy::param_type;
  const auto tensors = gpt2_collective_tensors(strategy.model());
  return write_safetensors_collective(
      rank, flags, path, gpt2_metadata(), tensors, [&](PieceSink& sink) {
        strategy.write_owned_weights([&](int param, std::int64_t first, const T* host,
                                         std::int64_t count) {
          // padding rows (past the file's elements) are not written
          std::int64_t file_numel = 1;
          for (std::int64_t d : tensors[static_cast<std::size_t>(param)].shape) file_numel *= d;
          count = std::clamp<std::int64_t>(file_numel - first, 0, count);
          if (count == 0) return;
          sink.write(static_cast<std::size_t>(param), static_cast<std::uint64_t>(first) * sizeof(T),
                     std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(host),
                                                    static_cast<std::size_t>(count) * sizeof(T)));
        });
      });
}

}  // namespace fourway
