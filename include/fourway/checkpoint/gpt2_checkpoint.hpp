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
//!
//! The head count is not in the tensors. Hugging Face keeps it, with the rest of the shape, in the
//! `config.json` beside the weights (`n_layer`, `n_embd`, `n_head`, `vocab_size`, `n_positions`):
//! `read_gpt2_config` reads it, `check_gpt2_config` refuses one that contradicts the tensors or
//! describes a GPT-2 other than fourway's (tanh GELU, LayerNorm eps 1e-5, the head tied to `wte`,
//! `n_inner` = 4·n_embd, unscaled-by-layer attention), and `write_gpt2_config` writes one with
//! HF's keys beside a saved file, so `GPT2LMHeadModel.from_pretrained` loads any shape.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
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

/// The GPT-2 fields of a Hugging Face `config.json` (0: the file does not give it).
struct Gpt2JsonConfig {
  std::filesystem::path path;
  int n_layer = 0, n_embd = 0, n_head = 0, vocab_size = 0, n_positions = 0;
};

namespace detail {
/// `key`'s value in the JSON object `o`, or null when absent.
inline const StJson::Value* json_find(const StJson::Value& o, std::string_view key) {
  for (std::size_t i = 0; i < o.keys.size(); ++i) {
    if (o.keys[i] == key) return &o.values[i];
  }
  return nullptr;
}
/// A positive integer field of config.json, 0 when absent; anything else is refused by name.
inline int json_positive(const StJson::Value& o, std::string_view key,
                         const std::filesystem::path& path) {
  const StJson::Value* v = json_find(o, key);
  if (v == nullptr || v->kind == StJson::Kind::null) return 0;
  const auto n = v->kind == StJson::Kind::number ? parse_u64(v->str) : std::nullopt;
  check<CheckpointError>(n && *n > 0 && *n <= (1u << 30), "fourway: ", path.string(), ": \"", key,
                         "\" must be a positive integer, got ", v->str);
  return static_cast<int>(*n);
}
/// The text of a string field, "" when absent.
inline std::string json_text(const StJson::Value& o, std::string_view key) {
  const StJson::Value* v = json_find(o, key);
  return v != nullptr && v->kind == StJson::Kind::string ? v->str : std::string();
}
}  // namespace detail

/// `config.json` beside `weights` (Hugging Face's layout: `save_pretrained` writes the two side by
/// side), parsed; nullopt when there is none. A file that is not JSON, or whose fields describe
/// a GPT-2 that fourway's does not compute (another activation, LayerNorm eps, an untied head,
/// another MLP width, attention scaled by layer), is a `CheckpointError` naming the field.
inline std::optional<Gpt2JsonConfig> read_gpt2_config(const std::filesystem::path& weights) {
  Gpt2JsonConfig c;
  c.path = std::filesystem::absolute(weights).parent_path() / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(c.path, ec)) return std::nullopt;
  std::ifstream in(c.path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  check<CheckpointError>(in.good() || in.eof(), "fourway: cannot read ", c.path.string());
  const std::string doc = text.str();
  check<CheckpointError>(doc.size() <= (1u << 20), "fourway: ", c.path.string(), " is ", doc.size(),
                         " bytes; a GPT-2 config.json is a few hundred");
  detail::StJson::Value o;
  try {
    o = detail::StJson(doc, c.path.string(), 8, 1024).parse_document();
  } catch (const CheckpointError& e) {
    throw CheckpointError(
        detail::cat("fourway: ", c.path.string(), " is not valid JSON (", e.what(), ")"));
  }
  check<CheckpointError>(o.kind == detail::StJson::Kind::object, "fourway: ", c.path.string(),
                         " is not a JSON object");
  const std::string src = c.path.string();
  c.n_layer = detail::json_positive(o, "n_layer", c.path);
  c.n_embd = detail::json_positive(o, "n_embd", c.path);
  c.n_head = detail::json_positive(o, "n_head", c.path);
  c.vocab_size = detail::json_positive(o, "vocab_size", c.path);
  c.n_positions = detail::json_positive(o, "n_positions", c.path);
  const std::string type = detail::json_text(o, "model_type");
  check<CheckpointError>(type.empty() || type == "gpt2", "fourway: ", src, " describes a \"", type,
                         "\" model; fourway reads GPT-2 (model_type \"gpt2\")");
  const std::string act = detail::json_text(o, "activation_function");
  check<CheckpointError>(act.empty() || act == "gelu_new" || act == "gelu_pytorch_tanh",
                         "fourway: ", src, ": activation_function \"", act,
                         "\" is not the tanh GELU fourway's GPT-2 computes (gelu_new)");
  if (const auto* eps = detail::json_find(o, "layer_norm_epsilon");
      eps != nullptr && eps->kind == detail::StJson::Kind::number) {
    const double e = std::strtod(eps->str.c_str(), nullptr);
    check<CheckpointError>(std::fabs(e - 1e-5) <= 1e-12, "fourway: ", src, ": layer_norm_epsilon ",
                           eps->str, " but fourway's GPT-2 normalises with eps 1e-5");
  }
  const auto flag = [&](std::string_view key) {
    const auto* v = detail::json_find(o, key);
    return v != nullptr && v->kind == detail::StJson::Kind::boolean
               ? std::optional(v->str == "true")
               : std::nullopt;
  };
  check<CheckpointError>(flag("tie_word_embeddings").value_or(true), "fourway: ", src,
                         ": tie_word_embeddings is false, but fourway's GPT-2 ties its head to "
                         "wte");
  check<CheckpointError>(!flag("scale_attn_by_inverse_layer_idx").value_or(false), "fourway: ", src,
                         ": scale_attn_by_inverse_layer_idx is true; fourway's attention "
                         "scales by 1/sqrt(head size) alone");
  check<CheckpointError>(flag("scale_attn_weights").value_or(true), "fourway: ", src,
                         ": scale_attn_weights is false; fourway's attention scales by "
                         "1/sqrt(head size)");
  const int inner = detail::json_positive(o, "n_inner", c.path);
  check<CheckpointError>(inner == 0 || c.n_embd == 0 || inner == 4 * c.n_embd, "fourway: ", src,
                         ": n_inner ", inner,
                         " but fourway's GPT-2 MLP is 4 x n_embd = ", 4 * c.n_embd, " wide");
  return c;
}

/// Refuses a `config.json` whose shape contradicts the tensors of the file beside it (`info`),
/// naming the field, both values and both files.
inline void check_gpt2_config(const Gpt2FileInfo& info, const Gpt2JsonConfig& c,
                              const std::string& weights) {
  const auto same = [&](const char* key, std::int64_t json, std::int64_t tensors,
                        const char* what) {
    check<CheckpointError>(json == 0 || json == tensors, "fourway: ", c.path.string(), " says ",
                           key, " ", json, " but ", weights, " has ", what, " ", tensors,
                           "; the two describe different models");
  };
  same("n_layer", c.n_layer, info.layers, "blocks:");
  same("n_embd", c.n_embd, info.dim, "width");
  same("vocab_size", c.vocab_size, info.vocab, "vocabulary");
  same("n_positions", c.n_positions, info.context, "context");
  check<CheckpointError>(c.n_head == 0 || info.dim % c.n_head == 0, "fourway: ", c.path.string(),
                         " says n_head ", c.n_head, ", which does not divide the width ", info.dim);
}

/// `config.json` of a GPT-2 of shape `cfg` with Hugging Face's keys (`GPT2Config`): what
/// `GPT2LMHeadModel.from_pretrained` needs to rebuild fourway's model — tanh GELU, eps 1e-5, the
/// tied head, no dropout (fourway has none), `bos`/`eos` the last token as GPT-2's
/// <|endoftext|> — and `torch_dtype`, the saved tensors' ("float32", "bfloat16", "float16").
inline std::string gpt2_config_json(const models::GptConfig& cfg, std::string_view torch_dtype) {
  std::ostringstream j;
  j << "{\n"
    << "  \"activation_function\": \"gelu_new\",\n"
    << "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
    << "  \"attn_pdrop\": 0.0,\n"
    << "  \"bos_token_id\": " << cfg.vocab - 1 << ",\n"
    << "  \"embd_pdrop\": 0.0,\n"
    << "  \"eos_token_id\": " << cfg.vocab - 1 << ",\n"
    << "  \"initializer_range\": 0.02,\n"
    << "  \"layer_norm_epsilon\": 1e-05,\n"
    << "  \"model_type\": \"gpt2\",\n"
    << "  \"n_ctx\": " << cfg.max_seq << ",\n"
    << "  \"n_embd\": " << cfg.dim << ",\n"
    << "  \"n_head\": " << cfg.heads << ",\n"
    << "  \"n_inner\": null,\n"
    << "  \"n_layer\": " << cfg.layers << ",\n"
    << "  \"n_positions\": " << cfg.max_seq << ",\n"
    << "  \"reorder_and_upcast_attn\": false,\n"
    << "  \"resid_pdrop\": 0.0,\n"
    << "  \"scale_attn_by_inverse_layer_idx\": false,\n"
    << "  \"scale_attn_weights\": true,\n"
    << "  \"tie_word_embeddings\": true,\n"
    << "  \"torch_dtype\": \"" << torch_dtype << "\",\n"
    << "  \"use_cache\": true,\n"
    << "  \"vocab_size\": " << cfg.vocab << "\n"
    << "}\n";
  return j.str();
}

/// Hugging Face's name of the element type `T` of saved tensors (`torch_dtype`).
template <class T>
constexpr std::string_view torch_dtype_name() {
  if constexpr (std::is_same_v<T, bf16>) {
    return "bfloat16";
  } else if constexpr (std::is_same_v<T, fp16>) {
    return "float16";
  } else {
    return "float32";
  }
}

/// Writes `gpt2_config_json(cfg, torch_dtype)` as `config.json` beside `weights` (one per folder:
/// a second model saved into the same folder replaces it). Returns its path.
inline std::filesystem::path write_gpt2_config(const std::filesystem::path& weights,
                                               const models::GptConfig& cfg,
                                               std::string_view torch_dtype) {
  const auto path = std::filesystem::absolute(weights).parent_path() / "config.json";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << gpt2_config_json(cfg, torch_dtype);
  out.close();
  check<CheckpointError>(out.good(), "fourway: cannot write ", path.string());
  return path;
}

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

/// The tensors of a GPT-2 file of `T` for `cfg` (HF names and shapes, in the order `save_gpt2`
/// writes them), for `write_safetensors_collective` with `gpt2_metadata()`.
template <class T>
std::vector<CollectiveTensor> gpt2_file_tensors(const models::GptConfig& cfg) {
  std::vector<CollectiveTensor> out;
  for (auto& [name, shape] : gpt2_tensor_shapes(cfg.layers, cfg.dim, cfg.vocab, cfg.max_seq)) {
    out.push_back(CollectiveTensor{name, st_dtype_of<T>(), shape});
  }
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

}  // namespace fourway
