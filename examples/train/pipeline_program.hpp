// fourway-train --pp S: the pipeline path of the program (train_program.hpp includes it).
// S stages on S ranks of --backend local or mpi, a schedule table checked before the first step,
// each stage building (and with --init-from loading) only its own layers, --save gathering every
// stage's parameters on rank 0 into one ordinary GPT-2 file, and --trace writing the ranks'
// actions as Chrome trace events. docs/pipeline.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fourway/comm/local_world.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/schedule/generators.hpp"
#include "fourway/schedule/simulate.hpp"
#include "fourway/tools/progress.hpp"
#include "fourway/train/gpt2_checkpoint.hpp"
#include "fourway/train/log.hpp"
#include "fourway/train/pipeline_strategy.hpp"
#include "fourway/train/token_data.hpp"
#include "fourway/train/trainer.hpp"

namespace fourway_train {

inline fw::schedule::Kind schedule_kind(const std::string& s) {
  using K = fw::schedule::Kind;
  for (K k : {K::gpipe, K::one_f_one_b, K::interleaved, K::zb_h1, K::zb_v})
    if (fw::schedule::kind_name(k) == s) return k;
  throw fw::ConfigError(fw::detail::cat("fourway: --schedule ", s,
                                        " does not exist; use gpipe, 1f1b, interleaved, zb-h1 "
                                        "or zb-v"));
}

/// Gathers every chunk's parameters on pipeline rank 0 into one whole model and saves it there.
/// A collective over the pipeline group.
template <class T, class B, class S, class Comm>
void save_pipeline(const fw::Context<B>& ctx, S& strategy, Comm& pp,
                   const fw::models::GptConfig& cfg, std::uint64_t seed, const std::string& path) {
  using Model = fw::models::Gpt<T, B>;
  const auto& table = strategy.table();
  const int me = pp.rank();
  constexpr int tag_base = 30000;  // above the schedule tags, below MPI's guaranteed 32767
  if (me != 0) {
    for (int c = 0; c < table.chunks(); ++c) {
      if (table.rank_of(c) != me) continue;
      strategy.chunk(c)->visit_parameters(
          [&](fw::Parameter<T, B>& p) { pp.send(p.weight.data(), p.numel(), 0, tag_base + c); });
    }
    return;
  }
  Model whole(ctx, cfg, seed);
  std::map<std::string, fw::Parameter<T, B>*> by_name;
  whole.visit_parameters([&](fw::Parameter<T, B>& p) { by_name[p.name] = &p; });
  for (int c = 0; c < table.chunks(); ++c) {
    std::optional<Model> remote;
    Model* chunk = strategy.chunk(c);
    if (chunk == nullptr) {
      remote.emplace(ctx, cfg, seed, strategy.partition().part(c));
      remote->visit_parameters([&](fw::Parameter<T, B>& p) {
        pp.recv(p.weight.data(), p.numel(), table.rank_of(c), tag_base + c);
      });
      chunk = &*remote;
    }
    chunk->visit_parameters([&](fw::Parameter<T, B>& p) {
      fw::Ops<B>::copy(ctx, by_name.at(p.name)->weight.data(), p.weight.data(), p.numel());
    });
  }
  fw::save_gpt2(ctx, whole, path);
}

/// Chrome trace event format (chrome://tracing, Perfetto): one track (tid) per rank, one complete
/// event ("ph":"X", microseconds) per compute action, p2p group, collective of the step and the
/// optimizer step.
struct TraceEvent {
  int rank = 0;
  std::string name;
  std::string cat;
  double start_us = 0.0;
  double dur_us = 0.0;
};

inline void write_trace(const std::string& path, const std::vector<TraceEvent>& events) {
  std::ofstream out(path, std::ios::trunc);
  fw::check<fw::ConfigError>(out.good(), "fourway: cannot create the trace file ", path);
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  std::vector<int> ranks;
  for (const auto& e : events)
    if (std::find(ranks.begin(), ranks.end(), e.rank) == ranks.end()) ranks.push_back(e.rank);
  bool first = true;
  for (int r : ranks) {
    out << (first ? "" : ",\n") << "{\"ph\":\"M\",\"pid\":0,\"tid\":" << r
        << ",\"name\":\"thread_name\",\"args\":{\"name\":\"rank " << r << "\"}}";
    first = false;
  }
  char buf[256];
  for (const auto& e : events) {
    std::snprintf(buf, sizeof buf,
                  ",\n{\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"name\":\"%s\",\"cat\":\"%s\","
                  "\"ts\":%.3f,\"dur\":%.3f}",
                  e.rank, e.name.c_str(), e.cat.c_str(), e.start_us, e.dur_us);
    out << buf;
  }
  out << "\n]}\n";
}

/// Per-action costs measured in the last step (medians over the rank's F, B/BW, W), for the
/// checker's timed simulation.
inline fw::schedule::Costs measured_costs(const std::vector<fw::pp::ExecSpan>& spans) {
  std::map<fw::schedule::Op, std::vector<double>> d;
  for (const auto& s : spans)
    if (fw::schedule::is_compute(s.op)) d[s.op].push_back(s.end - s.start);
  const auto median = [&](fw::schedule::Op op, double dflt) {
    auto it = d.find(op);
    if (it == d.end() || it->second.empty()) return dflt;
    auto v = it->second;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  fw::schedule::Costs c;
  c.forward = median(fw::schedule::Op::forward, 0.0);
  c.backward = median(fw::schedule::Op::backward, -1.0);
  c.backward_input = median(fw::schedule::Op::backward_input, c.backward > 0 ? c.backward : 0.0);
  c.backward_weight = median(fw::schedule::Op::backward_weight, 0.0);
  return c;
}

template <class Target, class T, class W, int Zero>
void train_pipeline_ranks(const Options& o) {
  using B = typename Target::backend;
  using Comm = typename W::comm_type;
  using S = fw::PipelineStrategy<fw::Precision<T>, B, Comm, Zero>;
  std::mutex mu;
  std::vector<TraceEvent> trace;  // every rank's (LocalWorld) or this process's (MPI)
  fw::launch<W>(o.ranks, [&](fw::World<W>& w) {
    const bool lead = w.rank() == 0;
    const int n = w.size();
    fw::check<fw::ConfigError>(n % o.pp == 0 && (o.dp == 0 || o.dp * o.pp == n), "fourway: --pp ",
                               o.pp, " x --dp ", o.dp, " does not make the ", n,
                               " ranks; give --ranks = --pp x --dp");
    fw::Context<B> ctx = Target::context(w.memory(), rank_device(w));
    // S stages x D replicas as a mesh: pp the inner axis (rank = stage + S * replica)
    const fw::Mesh<fw::Pipeline<fw::dynamic, fw::dynamic>, fw::DataParallel> mesh(n, {.pp = o.pp});
    fw::MeshGroups<Comm> groups(mesh, w.comm());
    Comm& pp = groups.pp();
    Comm& dp = groups.dp();
    const bool replica0 = mesh.coord_of(w.rank()).dp == 0;
    if constexpr (B::on_device) {
      pp.set_stream(ctx.stream());
      dp.set_stream(ctx.stream());
    }
    std::optional<fw::SafetensorsReader> ckpt;
    const fw::models::GptConfig cfg = model_config(o, ckpt, lead);
    fw::PipelineOptions po;
    po.schedule = schedule_kind(o.schedule);
    po.micro_batches = o.micro_batches;
    po.virtual_stages = o.virtual_stages > 0                             ? o.virtual_stages
                        : po.schedule == fw::schedule::Kind::zb_v        ? 2
                        : po.schedule == fw::schedule::Kind::interleaved ? 2
                                                                         : 1;
    fw::TrainerOptions to;
    to.micro_batches = o.micro_batches;
    fw::Trainer<S> trainer(to, ctx, cfg, o.seed, pp, dp, po, make_adamw(o));
    auto& st = trainer.strategy();
    st.time_phases(!o.trace.empty());
    if (ckpt) {
      for (int c = 0; c < st.table().chunks(); ++c)
        if (auto* chunk = st.chunk(c)) fw::load_gpt2(ctx, *ckpt, *chunk, true);
      ckpt.reset();
    }
    if (lead && Zero > 0)
      std::printf("ZeRO-%d across the %d replicas of each stage (docs/pipeline.md): %s\n", Zero,
                  n / o.pp, st.sharded()->describe().c_str());
    const fw::TokenData data = o.data.empty() ? fw::builtin_corpus() : fw::TokenData::read(o.data);
    fw::TokenLoader loader(data, o.batch, o.seq, cfg.vocab);
    if (lead) {
      std::printf("data %s: %zu tokens; model: %d layers, %s, %s\n", data.source().c_str(),
                  data.size(), cfg.layers, o.precision.c_str(),
                  o.checkpoint_activations ? "activation checkpointing" : "no checkpointing");
      std::printf(
          "pipeline: %s over %d stages x %d replicas (%s), %d micro-batches of %d "
          "sequences per replica, chunks %s\n",
          std::string(st.table().name).c_str(), o.pp, n / o.pp, o.backend.c_str(), o.micro_batches,
          o.batch / n * o.pp / o.micro_batches, st.partition().describe().c_str());
      std::printf("%s", fw::schedule::to_string(st.table()).c_str());
    }
    std::ofstream log;
    if (lead && !o.log_json.empty()) log = open_log(o.log_json);
    fw::tools::Progress progress(o.steps);
    const double tokens_per_step = static_cast<double>(o.batch) * o.seq;
    double first_loss = 0.0, last_loss = 0.0;
    std::vector<TraceEvent> mine;
    const auto origin = std::chrono::steady_clock::now();
    const auto us = [&](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::micro>(t - origin).count();
    };
    for (int step = 1; step <= o.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const fw::SequenceBatch b = loader.next();
      const float lr = st.optimizer().lr_at(trainer.iteration());
      const float loss = trainer.step(fw::Batch{b.inputs, b.targets, b.B, b.T});
      const auto t1 = std::chrono::steady_clock::now();
      const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      if (!o.trace.empty()) {
        // the executor's spans are relative to its start, which is t0 plus the batch staging
        const auto spans = st.spans();
        const double run_start = us(t0);
        for (const auto& s : spans) {
          const bool compute = fw::schedule::is_compute(s.op);
          std::string name =
              compute ? fw::detail::cat(fw::schedule::op_name(s.op), s.micro_batch, ".", s.chunk)
                      : fw::detail::cat("p2p ", fw::schedule::op_name(s.op), s.micro_batch, ".",
                                        s.chunk);
          mine.push_back({w.rank(), name, compute ? "compute" : "p2p", run_start + s.start * 1e6,
                          (s.end - s.start) * 1e6});
        }
        for (const auto& p : st.phases()) {
          const bool comm = p.name.ends_with("all-reduce") || p.name.ends_with("reduce-scatter") ||
                            p.name == "tied embedding sum";
          mine.push_back({w.rank(), p.name, comm ? "collective" : "step", us(p.start),
                          us(p.end) - us(p.start)});
        }
      }
      const fw::StepRecord r =
          step_record(step, loss, trainer.last_report(), ms, tokens_per_step, lr);
      if (!lead) continue;
      if (log.is_open()) {
        const std::vector<const fw::MemoryAccountant*> mems = {&w.memory()};
        std::string line = fw::step_json(r, mems);
        char extra[96];
        std::snprintf(extra, sizeof extra, ",\"ranks\":%d,\"pp\":%d,\"micro_batches\":%d", n, o.pp,
                      o.micro_batches);
        line.insert(line.size() - 1, extra);
        log << line << '\n';
        log.flush();
      }
      if (!o.quiet) progress.update(r);
      if (step == 1) first_loss = loss;
      last_loss = loss;
    }
    {
      std::lock_guard lock(mu);
      trace.insert(trace.end(), mine.begin(), mine.end());
    }
    // the idle fraction per stage: measured in the last step vs the checker's simulation with
    // the measured per-action costs (gathered on rank 0 over the pipeline group)
    std::vector<double> local = {0.0, 0.0, 0.0, 0.0, 0.0};
    {
      const auto spans = st.spans();
      const auto c = measured_costs(spans);
      double busy = 0.0, end = 0.0;
      for (const auto& s : spans) {
        if (fw::schedule::is_compute(s.op)) busy += s.end - s.start;
        end = std::max(end, s.end);
      }
      local = {busy, end, c.forward, c.backward > 0 ? c.backward : c.backward_input,
               c.backward_weight};
    }
    std::vector<double> all(local.size() * static_cast<std::size_t>(o.pp));
    pp.all_gather(local.data(), all.data(), static_cast<std::int64_t>(local.size()));
    if (lead) {
      progress.finish();
      std::printf("loss %.4f -> %.4f over %d steps\n", first_loss, last_loss, o.steps);
      double makespan = 0.0;
      fw::schedule::Costs costs;
      costs.forward = costs.backward_input = costs.backward_weight = 0.0;
      for (int q = 0; q < o.pp; ++q) {
        const double* v = all.data() + static_cast<std::size_t>(q) * local.size();
        makespan = std::max(makespan, v[1]);
        costs.forward += v[2] / o.pp;
        costs.backward_input += v[3] / o.pp;
        costs.backward_weight += v[4] / o.pp;
      }
      const auto sim = fw::schedule::simulate(st.table(), costs);
      std::printf(
          "idle fraction per stage, last step (measured vs the schedule's simulation with "
          "the measured F %.3g ms, B %.3g ms, W %.3g ms):\n",
          costs.forward * 1e3, costs.backward_input * 1e3, costs.backward_weight * 1e3);
      for (int q = 0; q < o.pp; ++q) {
        const double* v = all.data() + static_cast<std::size_t>(q) * local.size();
        std::printf("  stage %d: measured %.3f, predicted %.3f\n", q, 1.0 - v[0] / makespan,
                    sim.bubble(q));
      }
      if (o.memory_report) std::printf("%s", w.memory().table().c_str());
    }
    if (!o.save.empty()) {
      // ZeRO-3: every replica gathers its stage's weights over dp for the call
      st.with_gathered_parameters([&] {
        if (replica0) save_pipeline<T>(ctx, st, pp, cfg, o.seed, o.save);
      });
      if (lead) std::printf("saved %s\n", o.save.c_str());
    }
    w.comm().barrier();
  });
  if (!o.trace.empty() && !trace.empty()) {
    // LocalWorld: every rank in one file; one process per rank (MPI): rank r > 0 writes
    // FILE.rank<r>.json beside rank 0's FILE (concatenate the traceEvents arrays to merge)
    std::string path = o.trace;
    if (const int r = trace.front().rank; !std::is_same_v<W, fw::LocalWorld> && r > 0)
      path += fw::detail::cat(".rank", r, ".json");
    write_trace(path, trace);
    std::printf("trace %s: %zu events\n", path.c_str(), trace.size());
  }
}

/// `f.template operator()<Z>()` with the ZeRO stage Z = `zero` (0-3) as a constant.
template <class F>
void with_zero_stage(int zero, F&& f) {
  switch (zero) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    default: f.template operator()<0>(); break;
  }
}

template <class Target, class T>
int train_pipeline(const Options& o) {
  check_output_dir("save", o.save);
  check_output_dir("log-json", o.log_json);
  check_output_dir("trace", o.trace);
  fw::check<fw::ConfigError>(o.zero >= 0 && o.zero <= 3, "fourway: --zero ", o.zero,
                             " does not exist; use 0, 1, 2 or 3");
  fw::check<fw::ConfigError>(o.zero == 0 || o.init_from.empty(), "fourway: --pp with --zero ",
                             o.zero,
                             " cannot --init-from yet (the stages load into unsharded "
                             "weights); start from --zero 0 or drop --init-from");
  fw::check<fw::ConfigError>(o.micro_batches >= 1, "fourway: --micro-batches must be >= 1, got ",
                             o.micro_batches);
  fw::check<fw::ConfigError>(
      o.batch % o.micro_batches == 0, "fourway: the global batch of B=", o.batch,
      " sequences does not split into ", o.micro_batches,
      " micro-batches; use a --batch that is a multiple of ", o.micro_batches);
  (void)schedule_kind(o.schedule);
  if (o.backend == "local") {
    Options local = o;
    local.ranks = o.ranks == 0 ? o.pp * std::max(o.dp, 1) : o.ranks;
    with_zero_stage(o.zero,
                    [&]<int Z>() { train_pipeline_ranks<Target, T, fw::LocalWorld, Z>(local); });
    return 0;
  }
  Target::launch_processes(o, [&]<class W>() {
    with_zero_stage(o.zero, [&]<int Z>() { train_pipeline_ranks<Target, T, W, Z>(o); });
  });
  return 0;
}

}  // namespace fourway_train
