// fourway-plan: before splitting anything, know what you are splitting.
//
// Prints the per-GPU memory of a mesh (weights, gradients, master weights, optimizer state,
// activations), whether it fits, the estimated step time and the traffic per step; --recommend
// searches every mesh of the cluster. Exit status: 0 fits (or a recommendation was found),
// 1 does not fit (or nothing fits), 2 bad input. See docs/plan.md.
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/plan/report.hpp"

namespace fp = fourway::plan;

namespace {

constexpr std::string_view usage =
    R"(usage: fourway-plan [model] [hardware] [strategy] [--recommend] [--json]

model (one of):
  --params N                 parameter count (7.5e9, 70B, 124M): model states only
  --gpt2 124M|350M|774M|1.5B GPT-2 shapes (Radford et al. 2019)
  --llama 7B|13B|70B         Llama 2 shapes (Touvron et al. 2023)
  --layers L --hidden H --heads A --vocab V --seq S [--kv-heads K] [--ffn F] [--family gpt2|llama]
                             an architecture (GPT-2 family by default); also overrides a preset
hardware:
  --hw a100-80g|h100|h200    datasheet preset (default h100)
  --gpus N                   GPUs in the cluster (default: one node)
  --gpus-per-node N  --gpu-mem GB (1e9 B)
  --nvlink-gbs X --ib-gbs X  link bandwidth per GPU per direction, GB/s
  --nvlink-latency-us X --ib-latency-us X
  --hbm-tbs X                GPU memory bandwidth, TB/s (times an unfused attention)
  --tflops X                 achievable TFLOP/s per GPU (default: --mfu x datasheet peak)
  --mfu F                    achievable fraction of peak (default 0.236: fourway's measured
                             MFU, fourway-train-cuda GPT-2 124M bf16 on one H200; give yours)
  --attention-mfu F          the attention core's fraction of peak (default: as --mfu)
strategy:
  --dp N --tp N --pp N       degrees (dp defaults to GPUs / (tp x pp x cp))
  --cp N                     context parallelism: each rank holds seq/N tokens of a sequence
  --cp-kind ring|ulysses     ring attention (default) or all-to-all over heads
  --zero 0|1|2|3             ZeRO stage (3 = FSDP)
  --precision fp32|bf16|fp16 (default bf16: mixed precision)
  --micro-batch B            sequences per micro-batch (default 1)
  --micro-batches M          per step and replica (default 1)
  --global-batch G           sequences per step (sets --micro-batches)
  --schedule S               pipeline schedule: gpipe, 1f1b (default), interleaved, zb-h1, zb-v
  --virtual-stages V         chunks per rank of the interleaved schedule (default 2)
  --checkpoint-activations [none|selective|full]   (bare: full)
  --sequence-parallel
  --optimizer-state-bytes N  per parameter besides the master copy (Adam: 8, so K = 12)
  --footprint published|fourway   published models (any mesh) or fourway's own runtime
                             exactly (GPT-2: dp, tp, sp, ZeRO and pp on every schedule;
                             default published)
  --bucket-mb X              fourway's gradient bucket size, MiB (default 25)
  --vocab-align A            fourway's vocabulary padding (tp: per rank; default 1; CUDA runs 128)
  --headroom F               fraction of GPU memory kept free (default 0.05)
  --overlap F                fraction of compute a data-parallel collective can hide behind (default 1)
  --tp-overlap F             fraction of tensor-parallel collectives hidden behind GEMMs (default 0)
  --pp-scatter-gather        pipeline sends 1/tp each, all-gathered in the node (Megatron)
  --attention published|fused|unfused   published (default): Korthikanti's model, the scores
                             stored; fused: FlashAttention, no scores stored; unfused: stored
                             and streamed through memory, timed at --hbm-tbs
output:
  --recommend                search every mesh that fits, rank by step time, pick one
  --top N                    rows of the ranking (default 10)
  --prefer-within F          a mesh without TP/PP wins within this of the fastest (default 0.10)
  --json                     one JSON object instead of the table
exit status: 0 fits, 1 does not fit / nothing fits, 2 bad input
)";

struct BadInput {
  std::string what;
};

[[noreturn]] void bad(std::string what) { throw BadInput{std::move(what)}; }

double parse_double(std::string_view flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x)) {
    bad(std::string(flag) + " expects a number, got '" + v + "'");
  }
  return x;
}

// Integers, with an optional K/M/B/T suffix or an exponent (7.5B, 7.5e9, 124M).
std::int64_t parse_count(std::string_view flag, const std::string& v) {
  if (v.empty()) bad(std::string(flag) + " expects a number, got ''");
  double scale = 1;
  std::string num = v;
  const bool digit_before =
      v.size() >= 2 &&
      (std::isdigit(static_cast<unsigned char>(v[v.size() - 2])) != 0 || v[v.size() - 2] == '.');
  if (digit_before) {
    switch (v.back()) {
      case 'K':
      case 'k': scale = 1e3; break;
      case 'M':
      case 'm': scale = 1e6; break;
      case 'B':
      case 'b':
      case 'G':
      case 'g': scale = 1e9; break;
      case 'T':
      case 't': scale = 1e12; break;
      default: break;
    }
    if (scale != 1) num.pop_back();
  }
  char* end = nullptr;
  const double parsed = std::strtod(num.c_str(), &end);
  if (num.empty() || end != num.c_str() + num.size() || !std::isfinite(parsed)) {
    bad(std::string(flag) + " expects a number, got '" + v + "'");
  }
  const double x = parsed * scale;
  if (x != std::floor(x) || std::fabs(x) > 9.0e18) {
    bad(std::string(flag) + " expects a whole number, got '" + v + "'");
  }
  return static_cast<std::int64_t>(x);
}

int parse_int(std::string_view flag, const std::string& v) {
  const std::int64_t x = parse_count(flag, v);
  if (x < -2147483647 || x > 2147483647) bad(std::string(flag) + " is out of range: " + v);
  return static_cast<int>(x);
}

struct Args {
  std::map<std::string, std::string> values;
  std::vector<std::string> order;
  [[nodiscard]] bool has(const std::string& k) const { return values.count(k) != 0; }
  [[nodiscard]] const std::string& at(const std::string& k) const { return values.at(k); }
};

// Flags that take no value; --checkpoint-activations takes one optionally.
bool is_switch(std::string_view k) {
  return k == "recommend" || k == "json" || k == "sequence-parallel" || k == "help" ||
         k == "pp-scatter-gather";
}

Args parse(int argc, char** argv) {
  static const std::vector<std::string> known = {"params",
                                                 "gpt2",
                                                 "llama",
                                                 "layers",
                                                 "hidden",
                                                 "heads",
                                                 "kv-heads",
                                                 "ffn",
                                                 "vocab",
                                                 "seq",
                                                 "family",
                                                 "hw",
                                                 "gpus",
                                                 "gpus-per-node",
                                                 "gpu-mem",
                                                 "nvlink-gbs",
                                                 "ib-gbs",
                                                 "nvlink-latency-us",
                                                 "ib-latency-us",
                                                 "hbm-tbs",
                                                 "tflops",
                                                 "mfu",
                                                 "attention-mfu",
                                                 "dp",
                                                 "tp",
                                                 "pp",
                                                 "cp",
                                                 "cp-kind",
                                                 "zero",
                                                 "precision",
                                                 "micro-batch",
                                                 "micro-batches",
                                                 "global-batch",
                                                 "schedule",
                                                 "virtual-stages",
                                                 "checkpoint-activations",
                                                 "sequence-parallel",
                                                 "optimizer-state-bytes",
                                                 "headroom",
                                                 "overlap",
                                                 "tp-overlap",
                                                 "pp-scatter-gather",
                                                 "attention",
                                                 "footprint",
                                                 "bucket-mb",
                                                 "vocab-align",
                                                 "recommend",
                                                 "top",
                                                 "prefer-within",
                                                 "json",
                                                 "help"};
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) bad("unexpected argument '" + arg + "'; flags start with --");
    arg = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    bool ok = false;
    for (const auto& k : known) ok = ok || k == arg;
    if (!ok) bad("unknown flag --" + arg + " (see --help)");
    if (a.has(arg)) bad("--" + arg + " given twice");
    if (!value) {
      const bool next_is_value = i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0;
      if (is_switch(arg)) {
        value = "1";
      } else if (arg == "checkpoint-activations") {
        value = next_is_value ? std::string(argv[++i]) : std::string("full");
      } else if (next_is_value) {
        value = argv[++i];
      } else {
        bad("--" + arg + " needs a value");
      }
    }
    a.values[arg] = *value;
    a.order.push_back(arg);
  }
  return a;
}

fp::Model model_of(const Args& a) {
  fp::Model m;
  const bool has_params = a.has("params");
  const bool has_preset = a.has("gpt2") || a.has("llama");
  const char* shape_flags[] = {"layers", "hidden",   "heads", "vocab",
                               "seq",    "kv-heads", "ffn",   "family"};
  bool has_shape = false;
  for (const char* f : shape_flags) has_shape = has_shape || a.has(f);
  if (a.has("gpt2") && a.has("llama")) bad("give one of --gpt2 and --llama");
  if (has_params && (has_preset || has_shape)) {
    bad("give either --params N (model states only) or an architecture, not both");
  }
  if (has_params) {
    m.params = parse_count("--params", a.at("params"));
    if (m.params < 1) bad("--params must be >= 1, got " + a.at("params"));
    return m;
  }
  fp::Architecture arch;
  if (has_preset) {
    const std::string fam = a.has("gpt2") ? "gpt2" : "llama";
    const auto p = fp::preset(fam, a.at(fam));
    if (!p) {
      bad("unknown --" + fam + " size '" + a.at(fam) + "'; use " +
          (fam == "gpt2" ? "124M, 350M, 774M or 1.5B" : "7B, 13B or 70B"));
    }
    arch = *p;
  } else if (has_shape) {
    std::string missing;
    for (const char* f : {"layers", "hidden", "heads", "vocab", "seq"}) {
      if (!a.has(f)) missing += std::string(missing.empty() ? "" : ", ") + "--" + f;
    }
    if (!missing.empty()) bad("an architecture needs " + missing + " as well (or use a preset)");
    arch.family = fp::Family::gpt2;
  } else {
    bad("no model: give --params N, --gpt2 SIZE, --llama SIZE or "
        "--layers/--hidden/--heads/--vocab/--seq");
  }
  if (a.has("family")) {
    const std::string& f = a.at("family");
    if (f == "gpt2")
      arch.family = fp::Family::gpt2;
    else if (f == "llama")
      arch.family = fp::Family::llama;
    else
      bad("--family must be gpt2 or llama, got '" + f + "'");
  }
  const bool custom = has_shape;
  if (a.has("layers")) arch.layers = parse_count("--layers", a.at("layers"));
  if (a.has("hidden")) arch.hidden = parse_count("--hidden", a.at("hidden"));
  if (a.has("heads")) arch.heads = parse_count("--heads", a.at("heads"));
  if (a.has("vocab")) arch.vocab = parse_count("--vocab", a.at("vocab"));
  if (a.has("seq")) arch.seq = parse_count("--seq", a.at("seq"));
  arch.kv_heads = a.has("kv-heads")                 ? parse_count("--kv-heads", a.at("kv-heads"))
                  : (a.has("heads") || !has_preset) ? arch.heads
                                                    : arch.kv_heads;
  arch.ffn = a.has("ffn")                       ? parse_count("--ffn", a.at("ffn"))
             : (a.has("hidden") || !has_preset) ? 4 * arch.hidden
                                                : arch.ffn;
  if (custom) arch.name = has_preset ? "preset with overrides" : "custom";
  fp::validate(arch);
  m.arch = arch;
  return m;
}

fp::Cluster cluster_of(const Args& a) {
  fp::Cluster c;
  const std::string hw = a.has("hw") ? a.at("hw") : "h100";
  const auto preset = fp::hardware_preset(hw);
  if (!preset) bad("unknown --hw '" + hw + "'; use a100-80g, h100 or h200");
  c.hw = *preset;
  if (a.has("gpus-per-node"))
    c.hw.gpus_per_node = parse_int("--gpus-per-node", a.at("gpus-per-node"));
  if (a.has("gpu-mem")) c.hw.memory_gb = parse_double("--gpu-mem", a.at("gpu-mem"));
  if (a.has("nvlink-gbs"))
    c.hw.nvlink.bandwidth_gbs = parse_double("--nvlink-gbs", a.at("nvlink-gbs"));
  if (a.has("ib-gbs")) c.hw.infiniband.bandwidth_gbs = parse_double("--ib-gbs", a.at("ib-gbs"));
  if (a.has("nvlink-latency-us")) {
    c.hw.nvlink.latency_us = parse_double("--nvlink-latency-us", a.at("nvlink-latency-us"));
  }
  if (a.has("ib-latency-us"))
    c.hw.infiniband.latency_us = parse_double("--ib-latency-us", a.at("ib-latency-us"));
  if (a.has("hbm-tbs")) {
    c.hw.memory_tbs = parse_double("--hbm-tbs", a.at("hbm-tbs"));
    if (!(c.hw.memory_tbs > 0)) bad("--hbm-tbs must be > 0 TB/s");
  }
  if (c.hw.gpus_per_node < 1)
    bad("--gpus-per-node must be >= 1, got " + std::to_string(c.hw.gpus_per_node));
  if (!(c.hw.memory_gb > 0)) bad("--gpu-mem must be > 0 GB");
  if (!(c.hw.nvlink.bandwidth_gbs > 0) || !(c.hw.infiniband.bandwidth_gbs > 0)) {
    bad("link bandwidths must be > 0 GB/s");
  }
  if (c.hw.nvlink.latency_us < 0 || c.hw.infiniband.latency_us < 0) bad("latencies must be >= 0");
  c.gpus = a.has("gpus") ? parse_int("--gpus", a.at("gpus")) : c.hw.gpus_per_node;
  if (c.gpus < 1) {
    bad("--gpus " + std::to_string(c.gpus) + ": a plan needs at least one GPU");
  }
  return c;
}

fp::Options options_of(const Args& a) {
  fp::Options o;
  if (a.has("mfu")) o.mfu = parse_double("--mfu", a.at("mfu"));
  if (a.has("attention-mfu")) {
    o.attention_mfu = parse_double("--attention-mfu", a.at("attention-mfu"));
    if (!(o.attention_mfu > 0)) bad("--attention-mfu must be > 0");
  }
  if (a.has("tflops")) {
    o.achievable_tflops = parse_double("--tflops", a.at("tflops"));
    if (!(o.achievable_tflops > 0)) bad("--tflops must be > 0");
  }
  if (a.has("overlap")) o.overlap = parse_double("--overlap", a.at("overlap"));
  if (a.has("tp-overlap")) o.tp_overlap = parse_double("--tp-overlap", a.at("tp-overlap"));
  o.pp_scatter_gather = a.has("pp-scatter-gather");
  if (a.has("attention")) {
    const std::string& k = a.at("attention");
    if (k == "published")
      o.attention = fp::AttentionKernel::published;
    else if (k == "fused")
      o.attention = fp::AttentionKernel::fused;
    else if (k == "unfused")
      o.attention = fp::AttentionKernel::unfused;
    else
      bad("--attention must be published, fused or unfused, got '" + k + "'");
  }
  if (a.has("headroom")) o.headroom = parse_double("--headroom", a.at("headroom"));
  if (a.has("footprint")) {
    const std::string& f = a.at("footprint");
    if (f == "published")
      o.footprint = fp::Footprint::published;
    else if (f == "fourway")
      o.footprint = fp::Footprint::fourway;
    else
      bad("--footprint must be published or fourway, got '" + f + "'");
  }
  if (a.has("bucket-mb")) {
    const double mb = parse_double("--bucket-mb", a.at("bucket-mb"));
    if (mb < 0) bad("--bucket-mb must be >= 0");
    o.bucket_bytes = static_cast<std::int64_t>(mb * 1048576.0);
  }
  if (a.has("vocab-align")) {
    o.vocab_alignment = static_cast<int>(parse_count("--vocab-align", a.at("vocab-align")));
    if (o.vocab_alignment < 1) bad("--vocab-align must be >= 1");
  }
  if (a.has("optimizer-state-bytes")) {
    o.optimizer.state_bytes_per_param =
        parse_count("--optimizer-state-bytes", a.at("optimizer-state-bytes"));
    if (o.optimizer.state_bytes_per_param < 0) bad("--optimizer-state-bytes must be >= 0");
  }
  return o;
}

fp::ContextKind context_kind_of(const Args& a) {
  if (!a.has("cp-kind")) return fp::ContextKind::ring;
  const std::string& k = a.at("cp-kind");
  if (k == "ring") return fp::ContextKind::ring;
  if (k == "ulysses") return fp::ContextKind::ulysses;
  bad("--cp-kind must be ring or ulysses, got '" + k + "'");
}

fp::Precision precision_of(const Args& a) {
  if (!a.has("precision")) return fp::Precision::bf16;
  const std::string& p = a.at("precision");
  if (p == "fp32") return fp::Precision::fp32;
  if (p == "bf16") return fp::Precision::bf16;
  if (p == "fp16") return fp::Precision::fp16;
  bad("--precision must be fp32, bf16 or fp16, got '" + p + "'");
}

fp::Schedule schedule_of(const Args& a) {
  if (!a.has("schedule")) return fp::Schedule::one_f_one_b;
  const std::string& s = a.at("schedule");
  if (s == "1f1b") return fp::Schedule::one_f_one_b;
  if (s == "gpipe") return fp::Schedule::gpipe;
  if (s == "interleaved") return fp::Schedule::interleaved;
  if (s == "zb-h1") return fp::Schedule::zb_h1;
  if (s == "zb-v") return fp::Schedule::zb_v;
  bad("--schedule must be gpipe, 1f1b, interleaved, zb-h1 or zb-v, got '" + s + "'");
}

/// Chunks per pipeline rank of the interleaved schedule (fourway-train's --virtual-stages; 2
/// when not given); the other schedules take none.
int virtual_stages_of(const Args& a, fp::Schedule s) {
  if (!a.has("virtual-stages")) return s == fp::Schedule::interleaved ? 2 : 1;
  if (s != fp::Schedule::interleaved) bad("--virtual-stages needs --schedule interleaved");
  const int v = parse_int("--virtual-stages", a.at("virtual-stages"));
  if (v < 2) bad("--virtual-stages must be >= 2 (the interleaved schedule's chunks per rank)");
  return v;
}

std::optional<fp::Checkpointing> checkpointing_of(const Args& a) {
  if (!a.has("checkpoint-activations")) return std::nullopt;
  const std::string& r = a.at("checkpoint-activations");
  if (r == "none") return fp::Checkpointing::none;
  if (r == "selective") return fp::Checkpointing::selective;
  if (r == "full") return fp::Checkpointing::full;
  bad("--checkpoint-activations must be none, selective or full, got '" + r + "'");
}

int run(const Args& a) {
  const bool as_json = a.has("json");
  const fp::Model model = model_of(a);
  const fp::Cluster cluster = cluster_of(a);
  const fp::Options options = options_of(a);
  const std::int64_t mb =
      a.has("micro-batch") ? parse_count("--micro-batch", a.at("micro-batch")) : 1;
  if (mb < 1) bad("--micro-batch must be >= 1, got " + a.at("micro-batch"));
  if (!model.arch && a.has("checkpoint-activations") && a.at("checkpoint-activations") != "none") {
    bad("--checkpoint-activations needs an architecture: --params models states only");
  }

  if (a.has("recommend")) {
    fp::SearchSpace sp;
    sp.micro_batch = mb;
    sp.precision = precision_of(a);
    sp.schedule = schedule_of(a);
    sp.virtual_stages = virtual_stages_of(a, sp.schedule);
    sp.checkpointing = checkpointing_of(a);
    if (a.has("dp")) sp.dp = parse_int("--dp", a.at("dp"));
    if (a.has("tp")) sp.tp = parse_int("--tp", a.at("tp"));
    if (a.has("pp")) sp.pp = parse_int("--pp", a.at("pp"));
    if (a.has("cp")) sp.cp = parse_int("--cp", a.at("cp"));
    sp.cp_kind = context_kind_of(a);
    if (a.has("zero")) {
      sp.zero = parse_int("--zero", a.at("zero"));
      fp::check_zero_stage(*sp.zero);
    }
    if (a.has("sequence-parallel")) sp.sequence_parallel = true;
    if (a.has("prefer-within"))
      sp.prefer_within = parse_double("--prefer-within", a.at("prefer-within"));
    const std::int64_t m =
        a.has("micro-batches") ? parse_count("--micro-batches", a.at("micro-batches")) : 1;
    if (m < 1) bad("--micro-batches must be >= 1");
    sp.global_batch = a.has("global-batch") ? parse_count("--global-batch", a.at("global-batch"))
                                            : static_cast<std::int64_t>(cluster.gpus) * mb * m;
    if (sp.global_batch < 1) bad("--global-batch must be >= 1");
    const std::size_t top =
        a.has("top") ? static_cast<std::size_t>(parse_int("--top", a.at("top"))) : 10;
    const fp::Recommendation r = fp::recommend(model, cluster, sp, options);
    if (as_json) {
      std::cout << fp::recommendation_json(r, top) << "\n";
    } else if (r.chosen) {
      std::cout << fp::recommendation_text(r, top);
    }
    if (!r.chosen) {
      std::cerr << "fourway-plan: " << r.missing << "\n";
      return 1;
    }
    return 0;
  }

  fp::Strategy s;
  s.tp = a.has("tp") ? parse_int("--tp", a.at("tp")) : 1;
  s.pp = a.has("pp") ? parse_int("--pp", a.at("pp")) : 1;
  s.cp = a.has("cp") ? parse_int("--cp", a.at("cp")) : 1;
  s.cp_kind = context_kind_of(a);
  if (s.tp < 1 || s.pp < 1 || s.cp < 1) bad("--tp, --pp and --cp must be >= 1");
  if (a.has("dp")) {
    s.dp = parse_int("--dp", a.at("dp"));
  } else {
    const int model_parallel = s.tp * s.pp * s.cp;
    if (cluster.gpus % model_parallel != 0) {
      bad("tp x pp" + std::string(s.cp > 1 ? " x cp" : "") + " = " + std::to_string(s.tp) + " x " +
          std::to_string(s.pp) + (s.cp > 1 ? " x " + std::to_string(s.cp) : "") + " = " +
          std::to_string(model_parallel) + " does not divide the " + std::to_string(cluster.gpus) +
          " GPUs; choose degrees whose product divides --gpus");
    }
    s.dp = cluster.gpus / model_parallel;
  }
  s.zero = a.has("zero") ? parse_int("--zero", a.at("zero")) : 0;
  s.micro_batch = mb;
  s.precision = precision_of(a);
  s.schedule = schedule_of(a);
  s.virtual_stages = virtual_stages_of(a, s.schedule);
  s.checkpointing = checkpointing_of(a).value_or(fp::Checkpointing::none);
  s.sequence_parallel = a.has("sequence-parallel");
  if (a.has("global-batch")) {
    if (a.has("micro-batches")) bad("give --global-batch or --micro-batches, not both");
    const std::int64_t g = parse_count("--global-batch", a.at("global-batch"));
    if (g < 1 || s.dp < 1 || g % (static_cast<std::int64_t>(s.dp) * mb) != 0) {
      bad("--global-batch " + a.at("global-batch") + " is not a multiple of dp x micro-batch = " +
          std::to_string(s.dp) + " x " + std::to_string(mb));
    }
    s.micro_batches = g / (s.dp * mb);
  } else {
    s.micro_batches =
        a.has("micro-batches") ? parse_count("--micro-batches", a.at("micro-batches")) : 1;
  }
  const fp::Plan p = fp::make_plan(model, cluster, s, options);
  std::cout << (as_json ? fp::json(p) + "\n" : fp::table(p));
  return p.fits ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.has("help")) {
      std::cout << usage;
      return 0;
    }
    return run(a);
  } catch (const BadInput& e) {
    std::cerr << "fourway-plan: error: " << e.what << "\n";
    return 2;
  } catch (const fourway::ConfigError& e) {
    std::string w = e.what();
    if (w.rfind("fourway: ", 0) == 0) w = w.substr(9);
    std::cerr << "fourway-plan: error: " << w << "\n";
    return 2;
  }
}
