//! What `fourway-plan` prints: a per-GPU breakdown table with explicit units (bytes, GB = 1e9 B,
//! GiB = 2^30 B), whether it fits, the estimated step time and the traffic per step — as text or
//! as JSON — and the ranking of `--recommend`.
//!
//! The JSON carries every number of the table in bytes and seconds (no rounding), one object per
//! pipeline stage, so a script can re-derive the table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>

#include "fourway/mesh/policies.hpp"
#include "fourway/plan/planner.hpp"

namespace fourway::plan {

namespace detail {
inline std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

inline std::string json_number(double v) {
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

inline std::string link_name(bool in_node) { return in_node ? "NVLink" : "InfiniBand"; }
}  // namespace detail

/// Where the plan's achievable TFLOP/s come from: the user's `--tflops`, the user's `--mfu`, or
/// fourway's measured MFU (the default, `measured_mfu`), named as such.
inline std::string achievable_source(const Options& o) {
  if (o.achievable_tflops > 0) return "--tflops";
  if (o.mfu == measured_mfu) {
    return detail::fixed(o.mfu * 100, 1) + "% of the datasheet peak, " + measured_mfu_source +
           "; --mfu or --tflops for yours";
  }
  return "--mfu " + detail::fixed(o.mfu, 3) + " of the datasheet peak";
}

/// The breakdown table of one plan.
inline std::string table(const Plan& p) {
  using detail::fixed;
  std::ostringstream os;
  const Strategy& s = p.strategy;
  const Hardware& hw = p.cluster.hw;
  os << "model:    " << (p.model.arch ? p.model.name() + ", " : std::string())
     << p.model.total_params() << " parameters ("
     << fixed(static_cast<double>(p.model.total_params()) / 1e9, 2) << " B)";
  if (!p.model.arch) os << " — model states only (give an architecture for activations and time)";
  os << "\n";
  os << "cluster:  " << p.cluster.gpus << " × " << hw.name << " (" << fixed(hw.memory_gb, 1)
     << " GB each, " << hw.gpus_per_node << " per node)\n";
  os << "mesh:     " << detail::describe(s) << "\n";
  if (p.model.arch) {
    os << "batch:    " << s.global_batch() << " sequences of " << p.model.arch->seq
       << " tokens per step = " << s.dp << " replicas × " << s.micro_batches << " micro-batch"
       << (s.micro_batches == 1 ? "" : "es") << " × " << s.micro_batch << " sequence"
       << (s.micro_batch == 1 ? "" : "s");
    if (s.cp > 1) {
      os << ", each sequence split " << s.cp << " ways (" << p.model.arch->seq / s.cp
         << " tokens per rank, " << context_kind_name(s.cp_kind) << " attention)";
    }
    os << "\n";
  }
  const StagePlan& w = p.worst();
  os << "\nper GPU, "
     << (s.pp > 1 ? "worst pipeline stage " + std::to_string(w.stage) + " of " +
                        std::to_string(s.pp) + " (" + std::to_string(w.layers) + " layers)"
                  : std::string("every rank alike"))
     << ", " << w.params << " parameters held\n";
  os << std::left << std::setw(44) << "" << std::right << std::setw(18) << "bytes" << std::setw(11)
     << "GB" << std::setw(11) << "GiB"
     << "\n";
  auto row = [&](const std::string& name, double bytes) {
    os << "  " << std::left << std::setw(42) << name << std::right << std::setw(18)
       << fixed(bytes, 0) << std::setw(11) << fixed(bytes / 1e9, 2) << std::setw(11)
       << fixed(bytes / 1073741824.0, 2) << "\n";
  };
  const std::string wname = std::string(precision_name(s.precision));
  row("weights (" + wname + ")", static_cast<double>(w.states.weights));
  row("gradients (" + wname + ")", static_cast<double>(w.states.grads));
  row("master weights (fp32)", static_cast<double>(w.states.master_weights));
  row("optimizer state (Adam moments)", static_cast<double>(w.states.optimizer_state));
  if (p.model.arch) {
    row("activations (" + std::to_string(w.in_flight) + " micro-batch" +
            (w.in_flight == 1 ? "" : "es") + " in flight)",
        w.activations);
    if (s.checkpointing != Checkpointing::none)
      row("recomputation working set (1 layer)", w.recompute_working);
    else if (w.recompute_working > 0)  // fourway pipelines: a block's moment above what it keeps
      row("a block's transient above the kept activations", w.recompute_working);
    if (w.backward_workspace > 0) row("backward gradient chain (workspace)", w.backward_workspace);
    if (zero_sharding(s.zero).shards_params && s.replicas() > 1) {
      row("ZeRO-3 gathered units (2 + 1 grad)", w.zero3_gathered);
    }
    if (w.zero2_buckets > 0) row("ZeRO-2 full gradient buckets of the head", w.zero2_buckets);
  }
  row("step peak", w.step_peak());
  if (s.pp > 1) {  // what each pipeline rank holds (tp and dp ranks of a stage alike)
    for (const StagePlan& sp : p.stages) {
      row("model states of pipeline rank " + std::to_string(sp.stage) + " (" +
              std::to_string(sp.layers) + " layers)",
          static_cast<double>(sp.states.total()));
    }
    row("model states per GPU (the largest)", static_cast<double>(p.states_per_gpu().total()));
  }
  row("construction / load / save peak", std::max({w.construct_peak, w.load_peak, w.save_peak}));
  row("total (whole run)", w.total());
  os << "  " << std::string(82, '-') << "\n";
  row("GPU memory", p.memory_bytes);
  row("usable (" + fixed(p.options.headroom * 100, 0) + "% kept free)", p.usable_bytes());
  os << "\nfits:     "
     << (p.fits ? "yes, " + fixed((p.usable_bytes() - w.total()) / 1e9, 2) + " GB to spare"
                : "NO, " + fixed((w.total() - p.usable_bytes()) / 1e9, 2) + " GB over")
     << "\n";
  const AxisLinks links = axis_links(s.tp, s.pp, s.dp, hw.gpus_per_node, s.cp);
  if (p.time) {
    const StepTime& t = *p.time;
    os << "step:     " << fixed(t.total_s, 3) << " s estimated = compute " << fixed(t.compute_s, 3)
       << " s (bubble " << fixed(t.bubble * 100, 1) << "%)";
    if (t.memory_s > 0)
      os << " + unfused attention's memory traffic " << fixed(t.memory_s, 3) << " s";
    os << " + tensor-parallel " << fixed(t.tensor_s, 3) << " s";
    if (p.options.tp_overlap > 0) os << " (" << fixed(p.options.tp_overlap * 100, 0) << "% hidden)";
    os << " + pipeline " << fixed(t.pipeline_s, 3) << " s";
    if (s.cp > 1) os << " + context-parallel not hidden " << fixed(t.context_s, 3) << " s";
    os << " + data-parallel not hidden " << fixed(t.data_s, 3) << " s\n";
    const double tflops = p.options.achievable_tflops > 0
                              ? p.options.achievable_tflops
                              : p.options.mfu * hw.peak_tflops(s.precision);
    os << "          " << fixed(t.tokens_per_s, 0) << " tokens/s, MFU " << fixed(t.mfu * 100, 1)
       << "% — assuming " << fixed(tflops, 0) << " TFLOP/s achievable per GPU ("
       << achievable_source(p.options) << ")\n";
  }
  os << "traffic:  per step per rank: data-parallel " << fixed(w.data_parallel.bytes() / 1e9, 3)
     << " GB (" << detail::link_name(links.dp_in_node) << ")";
  if (p.model.arch) {
    os << ", tensor-parallel " << fixed(w.tensor_parallel.bytes / 1e9, 3) << " GB ("
       << detail::link_name(links.tp_in_node) << "), pipeline " << fixed(w.pipeline.bytes / 1e9, 3)
       << " GB (" << detail::link_name(links.pp_in_node) << ")";
    if (s.cp > 1) {
      os << ", context-parallel " << fixed(w.context_parallel.bytes / 1e9, 3) << " GB ("
         << detail::link_name(links.cp_in_node) << ")";
    }
  }
  os << "\n";
  return os.str();
}

/// Every number of a plan as one JSON object.
inline std::string json(const Plan& p) {
  using detail::json_number;
  using detail::json_string;
  std::ostringstream os;
  const Strategy& s = p.strategy;
  const Hardware& hw = p.cluster.hw;
  os << "{\"model\":{\"name\":" << json_string(p.model.name())
     << ",\"params\":" << p.model.total_params();
  if (p.model.arch) {
    const Architecture& a = *p.model.arch;
    os << ",\"layers\":" << a.layers << ",\"hidden\":" << a.hidden << ",\"heads\":" << a.heads
       << ",\"kv_heads\":" << a.kv_heads << ",\"ffn\":" << a.ffn << ",\"vocab\":" << a.vocab
       << ",\"seq\":" << a.seq;
  }
  os << "},\"cluster\":{\"hw\":" << json_string(hw.name) << ",\"gpus\":" << p.cluster.gpus
     << ",\"gpus_per_node\":" << hw.gpus_per_node
     << ",\"gpu_memory_bytes\":" << json_number(p.memory_bytes)
     << ",\"nvlink_gbs\":" << json_number(hw.nvlink.bandwidth_gbs)
     << ",\"ib_gbs\":" << json_number(hw.infiniband.bandwidth_gbs) << "}";
  os << ",\"strategy\":{\"dp\":" << s.dp << ",\"tp\":" << s.tp << ",\"pp\":" << s.pp
     << ",\"zero\":" << s.zero << ",\"micro_batch\":" << s.micro_batch
     << ",\"micro_batches\":" << s.micro_batches << ",\"global_batch\":" << s.global_batch()
     << ",\"schedule\":" << json_string(schedule_name(s.schedule))
     << ",\"precision\":" << json_string(precision_name(s.precision))
     << ",\"checkpoint\":" << json_string(checkpointing_name(s.checkpointing))
     << ",\"sequence_parallel\":" << (s.sequence_parallel ? "true" : "false") << ",\"cp\":" << s.cp
     << ",\"cp_kind\":" << json_string(context_kind_name(s.cp_kind)) << "}";
  os << ",\"stages\":[";
  for (std::size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& st = p.stages[i];
    os << (i ? "," : "") << "{\"stage\":" << st.stage << ",\"layers\":" << st.layers
       << ",\"params\":" << st.params << ",\"weights\":" << st.states.weights
       << ",\"grads\":" << st.states.grads << ",\"master_weights\":" << st.states.master_weights
       << ",\"optimizer_state\":" << st.states.optimizer_state
       << ",\"micro_batches_in_flight\":" << st.in_flight
       << ",\"activations\":" << json_number(st.activations)
       << ",\"recompute_working\":" << json_number(st.recompute_working)
       << ",\"zero3_gathered\":" << json_number(st.zero3_gathered)
       << ",\"zero2_buckets\":" << json_number(st.zero2_buckets)
       << ",\"backward_workspace\":" << json_number(st.backward_workspace)
       << ",\"construct_peak\":" << json_number(st.construct_peak)
       << ",\"load_peak\":" << json_number(st.load_peak)
       << ",\"save_peak\":" << json_number(st.save_peak)
       << ",\"step_peak\":" << json_number(st.step_peak())
       << ",\"total\":" << json_number(st.total())
       << ",\"traffic_bytes\":{\"data_parallel\":" << json_number(st.data_parallel.bytes())
       << ",\"tensor_parallel\":" << json_number(st.tensor_parallel.bytes)
       << ",\"pipeline\":" << json_number(st.pipeline.bytes)
       << ",\"context_parallel\":" << json_number(st.context_parallel.bytes) << "}}";
  }
  os << "],\"worst_stage\":" << p.worst_stage
     << ",\"usable_bytes\":" << json_number(p.usable_bytes())
     << ",\"fits\":" << (p.fits ? "true" : "false");
  if (p.time) {
    const StepTime& t = *p.time;
    os << ",\"time\":{\"step_s\":" << json_number(t.total_s)
       << ",\"compute_s\":" << json_number(t.compute_s)
       << ",\"tensor_parallel_s\":" << json_number(t.tensor_s)
       << ",\"pipeline_s\":" << json_number(t.pipeline_s)
       << ",\"context_parallel_s\":" << json_number(t.context_s)
       << ",\"attention_memory_s\":" << json_number(t.memory_s)
       << ",\"data_parallel_exposed_s\":" << json_number(t.data_s)
       << ",\"bubble\":" << json_number(t.bubble)
       << ",\"tokens_per_s\":" << json_number(t.tokens_per_s) << ",\"mfu\":" << json_number(t.mfu)
       << ",\"achievable_source\":" << json_string(achievable_source(p.options))
       << ",\"attention\":" << json_string(attention_kernel_name(p.options.attention))
       << ",\"tp_overlap\":" << json_number(p.options.tp_overlap) << "}";
  } else {
    os << ",\"time\":null";
  }
  os << "}";
  return os.str();
}

/// The command line that trains a plan with fourway-train (examples/train): on GPUs,
/// `mpirun -np N fourway-train-cuda --backend nccl` and the plan's architecture, mesh, batch,
/// micro-batches, schedule, precision and recomputation. fourway-train trains GPT-2 models only:
/// for any other model (or a parameter count) the line says so.
inline std::string train_command(const Plan& p) {
  if (!p.model.arch || p.model.arch->family != Family::gpt2) {
    return "fourway-train trains GPT-2 models; " + p.model.name() +
           " is not one, so there is no fourway-train command for this plan";
  }
  const Architecture& a = *p.model.arch;
  const Strategy& s = p.strategy;
  if (s.cp > 1) {
    return fourway::detail::cat(
        "fourway-train-cuda has no context parallelism yet (cp ", s.cp,
        "): its ring attention runs on the host only, as fourway-train --cp ", s.cp,
        " (docs/context-parallel.md), so this plan is a model of a GPU mesh fourway cannot run "
        "today");
  }
  std::ostringstream os;
  os << "mpirun -np " << s.gpus() << " fourway-train-cuda --backend nccl --layers " << a.layers
     << " --dim " << a.hidden << " --heads " << a.heads << " --seq " << a.seq << " --vocab "
     << a.vocab << " --tp " << s.tp << " --pp " << s.pp << " --dp " << s.dp << " --zero " << s.zero
     << " --batch " << s.global_batch() << " --micro-batches " << s.micro_batches;
  if (s.pp > 1) os << " --schedule " << schedule_name(s.schedule);
  if (s.pp > 1 && s.schedule == Schedule::interleaved)
    os << " --virtual-stages " << s.virtual_stages;
  os << " --precision " << precision_name(s.precision);
  if (s.tp > 1 && s.sequence_parallel) os << " --sequence-parallel";
  if (s.checkpointing != Checkpointing::none)
    os << " --checkpoint-activations " << checkpointing_name(s.checkpointing);
  return os.str();
}

/// The ranking of `--recommend`: the best `top` fitting meshes, then the chosen one's table.
inline std::string recommendation_text(const Recommendation& r, std::size_t top = 10) {
  using detail::fixed;
  std::ostringstream os;
  if (!r.chosen) {
    os << "fourway-plan: " << r.missing << "\n";
    return os.str();
  }
  os << r.fitting.size() << " of " << r.searched << " meshes fit; "
     << (r.fitting.front().time ? "the fastest " : "the least traffic per step, ")
     << std::min(top, r.fitting.size()) << ":\n";
  std::size_t wide = 4;
  for (std::size_t i = 0; i < r.fitting.size() && i < top; ++i) {
    wide = std::max(wide, detail::describe(r.fitting[i].strategy).size() + 2);
  }
  const int mesh_w = static_cast<int>(wide);
  os << "  " << std::left << std::setw(4) << "#" << std::setw(mesh_w) << "mesh" << std::right
     << std::setw(11) << "GB/GPU" << std::setw(11) << "s/step"
     << "\n";
  for (std::size_t i = 0; i < r.fitting.size() && i < top; ++i) {
    const Plan& p = r.fitting[i];
    os << (i == *r.chosen ? "* " : "  ") << std::left << std::setw(4) << i + 1 << std::setw(mesh_w)
       << detail::describe(p.strategy) << std::right << std::setw(11)
       << fixed(p.worst().total() / 1e9, 2) << std::setw(11)
       << (p.time ? fixed(p.time->total_s, 3) : std::string("n/a")) << "\n";
  }
  if (*r.chosen >= top) os << "  (the recommended mesh is #" << *r.chosen + 1 << ")\n";
  os << "\n" << r.why << "\n";
  os << "train it: " << train_command(r.fitting[*r.chosen]) << "\n\n"
     << table(r.fitting[*r.chosen]);
  return os.str();
}

inline std::string recommendation_json(const Recommendation& r, std::size_t top = 10) {
  using detail::json_number;
  using detail::json_string;
  std::ostringstream os;
  os << "{\"searched\":" << r.searched << ",\"fitting\":" << r.fitting.size();
  if (!r.chosen) {
    os << ",\"recommended\":null,\"missing\":" << json_string(r.missing) << "}";
    return os.str();
  }
  os << ",\"why\":" << json_string(r.why)
     << ",\"train_command\":" << json_string(train_command(r.fitting[*r.chosen]))
     << ",\"recommended\":" << json(r.fitting[*r.chosen]) << ",\"ranking\":[";
  for (std::size_t i = 0; i < r.fitting.size() && i < top; ++i) {
    const Plan& p = r.fitting[i];
    os << (i ? "," : "") << "{\"mesh\":" << json_string(detail::describe(p.strategy))
       << ",\"bytes_per_gpu\":" << json_number(p.worst().total())
       << ",\"step_s\":" << (p.time ? json_number(p.time->total_s) : std::string("null")) << "}";
  }
  os << "]}";
  return os.str();
}

}  // namespace fourway::plan
