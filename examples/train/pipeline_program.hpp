// fourway-train --pp S [--tp N] [--cp C] [--dp D]: the pipeline path of the program
// (train_program.hpp includes it), on fw::MeshStrategy over fw::Mesh<[TensorParallel,]
// ContextParallel, Pipeline, DataParallel | Sharded<Z>>: S stages, each split over N
// tensor-parallel ranks and C context-parallel ranks (each holding seq/C tokens of every
// sequence; --cp alone runs a pipeline of one stage), in D replicas (N·C·S·D ranks of
// --backend local or mpi), a schedule table checked before the first step, each rank building
// (and with --init-from loading) only its own layers and slices, --save writing one ordinary
// GPT-2 file in which every rank writes only the elements it owns, and --trace writing the ranks'
// actions as Chrome trace events. docs/pipeline.md, docs/mesh.md.
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

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/checkpoint/tp_checkpoint.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/parallel/tp/placement.hpp"
#include "fourway/schedule/generators.hpp"
#include "fourway/schedule/simulate.hpp"
#include "fourway/tools/progress.hpp"
#include "fourway/train/log.hpp"
#include "fourway/train/mesh_strategy.hpp"
#include "fourway/train/pipeline_strategy.hpp"
#include "fourway/train/token_data.hpp"
#include "fourway/train/trainer.hpp"

namespace fourway_train {

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

/// One pipeline rank's last step as `predict_idle` reads it: for every action of its table row,
/// when it started and ended (seconds on the steady clock shared by the ranks of one machine;
/// every action of a p2p group carries the group's span), and when the step began on the rank.
struct RankTimes {
  std::vector<double> start, end;
  double origin = 0.0;

  static constexpr std::size_t fields(std::size_t width) { return 2 * width + 1; }
  /// From the executor's spans (a compute action or a whole p2p group each), `width` slots.
  RankTimes(const fw::schedule::Table& t, int rank, const std::vector<fw::pp::ExecSpan>& spans,
            std::chrono::steady_clock::time_point started, std::size_t width)
      : start(width, 0.0), end(width, 0.0) {
    origin = std::chrono::duration<double>(started.time_since_epoch()).count();
    const auto& row = t.actions[static_cast<std::size_t>(rank)];
    std::size_t k = 0;
    for (std::size_t i = 0; i < row.size() && k < spans.size(); ++k) {
      const std::size_t e =
          fw::schedule::is_compute(row[i].op) ? i + 1 : fw::schedule::detail::group_end(row, i);
      for (; i < e; ++i) {
        start[i] = origin + spans[k].start;
        end[i] = origin + spans[k].end;
      }
    }
  }
  /// From `fields(width)` doubles (a row of an all-gather of `flat()`).
  RankTimes(const double* v, std::size_t width)
      : start(v, v + width), end(v + width, v + 2 * width), origin(v[2 * width]) {}
  [[nodiscard]] std::vector<double> flat() const {
    std::vector<double> v = start;
    v.insert(v.end(), end.begin(), end.end());
    v.push_back(origin);
    return v;
  }
};

/// The idle fraction per stage of the last step: measured (1 - compute time / the makespan, each
/// rank's times from its own start), predicted by the schedule's simulation from costs measured
/// in the same step (median F, B or BW, W per chunk; the least p2p latency and group overhead
/// measured, once the waiting for the peer is taken out), and replayed (the simulation with each
/// action's own measured time).
struct IdlePrediction {
  std::vector<double> measured, predicted, replayed;  // [stage]
  std::vector<fw::schedule::Costs> chunk;             // per chunk
  fw::schedule::Costs p2p;                            // p2p (latency), p2p_group (overhead)
};

inline IdlePrediction predict_idle(const fw::schedule::Table& t,
                                   const std::vector<RankTimes>& times) {
  using fw::schedule::Op;
  const auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  std::vector<std::map<Op, std::vector<double>>> by_chunk(static_cast<std::size_t>(t.chunks()));
  std::vector<double> overhead, latency;
  std::vector<double> busy(static_cast<std::size_t>(t.ranks), 0.0);
  double makespan = 0.0;
  for (int r = 0; r < t.ranks; ++r) {
    const auto& row = t.actions[static_cast<std::size_t>(r)];
    const RankTimes& d = times[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < row.size();) {
      makespan = std::max(makespan, d.end[i] - d.origin);
      if (fw::schedule::is_compute(row[i].op)) {
        by_chunk[static_cast<std::size_t>(row[i].chunk)][row[i].op].push_back(d.end[i] -
                                                                              d.start[i]);
        busy[static_cast<std::size_t>(r)] += d.end[i] - d.start[i];
        ++i;
        continue;
      }
      // a group's time once it could finish: from the later of its start and the posts of the
      // sends it receives (the waiting ends there) to its end
      const std::size_t e = fw::schedule::detail::group_end(row, i);
      double ready = d.start[i];
      bool recv = false;
      for (std::size_t k = i; k < e; ++k) {
        if (!fw::schedule::is_recv(row[k].op)) continue;
        recv = true;
        const int j = fw::schedule::detail::find(t, row[k].peer, matching_op(row[k].op),
                                                 row[k].micro_batch, row[k].chunk);
        ready = std::max(
            ready, times[static_cast<std::size_t>(row[k].peer)].start[static_cast<std::size_t>(j)]);
      }
      (recv ? latency : overhead).push_back(std::max(0.0, d.end[i] - ready));
      i = e;
    }
  }
  // the least a group took: on a shared machine a longer one also waited for a core
  const auto least = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
  };
  IdlePrediction out;
  out.p2p.p2p_group = least(overhead);
  out.p2p.p2p = least(latency);
  for (auto& m : by_chunk) {
    fw::schedule::Costs c;
    c.forward = median(m[Op::forward]);
    c.backward = m[Op::backward].empty() ? -1.0 : median(m[Op::backward]);
    c.backward_input = median(m[Op::backward_input]);
    c.backward_weight = median(m[Op::backward_weight]);
    out.chunk.push_back(c);
  }
  const auto sim = fw::schedule::simulate(t, out.chunk, out.p2p);
  const auto replay = fw::schedule::simulate_actions(
      t,
      [&](int r, std::size_t i, const fw::schedule::Action&) {
        const RankTimes& d = times[static_cast<std::size_t>(r)];
        return d.end[i] - d.start[i];
      },
      out.p2p.p2p, out.p2p.p2p_group);
  for (int r = 0; r < t.ranks; ++r) {
    out.measured.push_back(makespan > 0 ? 1.0 - busy[static_cast<std::size_t>(r)] / makespan : 0.0);
    out.predicted.push_back(sim.bubble(r));
    out.replayed.push_back(replay.bubble(r));
  }
  return out;
}

/// The map's `layers` entry of a pipeline rank: the chunks it holds, e.g.
/// "chunk 0: blocks [0,2), embedding; chunk 3: blocks [6,8), head (a copy of wte)".
template <class Strategy>
std::string chunks_text(Strategy& st) {
  std::string out;
  const fw::pp::Partition& part = st.partition();
  for (int c = 0; c < part.chunks(); ++c) {
    if (st.chunk(c) == nullptr) continue;
    out += fw::detail::cat(out.empty() ? "" : "; ", "chunk ", c, ": blocks [", part.first(c), ",",
                           part.end(c), ")", c == 0 ? ", embedding" : "",
                           c == part.chunks() - 1 ? ", head (a copy of wte)" : "");
  }
  return out;
}

/// The pipeline's, tensor parallelism's and ZeRO's run-time options from the flags.
inline fw::MeshOptions mesh_options(const Options& o) {
  fw::MeshOptions mo;
  mo.pipeline.schedule = schedule_kind(o.schedule);
  mo.pipeline.micro_batches = o.micro_batches;
  mo.pipeline.virtual_stages = virtual_stages(o);
  mo.tensor.sequence_parallel = o.sequence_parallel;
  mo.tensor.vocab_alignment = o.vocab_align;
  mo.sharded.bucket_bytes = static_cast<std::int64_t>(static_cast<double>(o.bucket_mb) * 1048576.0);
  mo.sharded.overlap = !o.no_overlap;
  return mo;
}

template <class Target, class T, class W, int Zero, bool Tp = false>
void train_pipeline_ranks(const Options& o) {
  using B = typename Target::backend;
  using Comm = typename W::comm_type;
  using MeshT = fw::dynamic_mesh_t<Tp, true, Zero, true>;  // --cp 1: as without the axis
  using S = fw::MeshStrategy<MeshT, fw::Precision<T>, B, Comm>;
  std::mutex mu;
  std::vector<TraceEvent> trace;  // every rank's (LocalWorld) or this process's (MPI)
  const auto rank_main = [&](fw::World<W>& w) {
    const bool lead = w.rank() == 0;
    const int n = w.size();
    const int tp_degree = Tp ? o.tp : 1;
    const int inner = tp_degree * o.cp * o.pp;
    fw::check<fw::ConfigError>(n % inner == 0 && (o.dp == 0 || o.dp * inner == n), "fourway: --tp ",
                               tp_degree, " x --cp ", o.cp, " x --pp ", o.pp, " x --dp ", o.dp,
                               " does not make the ", n,
                               " ranks; give --ranks = --tp x --cp x --pp x --dp");
    fw::Context<B> ctx = Target::context(w.memory(), rank_device(w), o);
    bind_world(w, ctx);
    apply_memory_options<Target>(o, w.memory(), rank_device(w));
    // N tp ranks x C cp ranks x S stages x D replicas (rank = tp + N * (cp + C * (stage + S *
    // replica)))
    const MeshT mesh(n, {.tp = tp_degree, .cp = o.cp, .pp = o.pp});
    fw::MeshGroups<Comm> groups(mesh, w.comm());
    Comm& tpg = groups.tp();
    Comm& pp = groups.pp();
    Comm& dp = groups.dp();
    const auto coord = mesh.coord_of(w.rank());
    if constexpr (B::on_device) {
      tpg.set_stream(ctx.stream());
      pp.set_stream(ctx.stream());
      dp.set_stream(ctx.stream());
      if (o.cp > 1) {  // the ring's group and the replicas' (gradients over cp x dp)
        groups.cp().set_stream(ctx.stream());
        groups.group({fw::Axis::cp, fw::Axis::dp}).set_stream(ctx.stream());
      }
    }
    std::optional<fw::SafetensorsReader> ckpt;
    const fw::models::GptConfig cfg = model_config(o, ckpt, lead);
    print_attention<Target>(ctx, o, cfg, lead);
    const int replicas = n / inner;
    fw::check<fw::ConfigError>(
        o.batch % (replicas * o.micro_batches) == 0, "fourway: the global batch of B=", o.batch,
        " sequences does not ", "split into ", replicas, " replicas x ", o.micro_batches,
        " micro-batches; use a --batch that is a multiple of ", replicas * o.micro_batches);
    fw::check<fw::ConfigError>(
        !o.sequence_parallel ||
            (static_cast<long long>(o.batch / replicas / o.micro_batches) * o.seq / o.cp) %
                    tp_degree ==
                0,
        "fourway: --sequence-parallel splits the ",
        o.batch / replicas / o.micro_batches * o.seq / o.cp,
        " rows of a micro-batch (batch/dp/micro-batches x seq/cp) over tp=", tp_degree,
        " ranks; choose --batch, --micro-batches and --seq so that tp divides them");
    const fw::MeshOptions mo = mesh_options(o);
    typename S::loader load;
    if constexpr (Tp) {  // each chunk reads the runs of its own slices, positioned
      if (ckpt)
        load = [&](const fw::Context<B>& c, auto& chunk) { fw::load_gpt2_tp(c, *ckpt, chunk); };
    }
    fw::TrainerOptions to;
    to.micro_batches = o.micro_batches;
    fw::Trainer<S> trainer(to, ctx, mesh, groups, cfg, o.seed, mo, make_adamw(o), load);
    auto& st = trainer.strategy();
    st.time_phases(!o.trace.empty());
    if constexpr (!Tp) {
      if (ckpt) {  // positioned reads of this rank's tensors (under ZeRO: of the elements it
                   // owns)
        st.load_weights(fw::gpt2_element_reader(*ckpt, fw::inspect_gpt2(*ckpt)));
      }
    }
    ckpt.reset();
    const fw::TokenData data = o.data.empty() ? fw::builtin_corpus() : fw::TokenData::read(o.data);
    fw::TokenLoader loader(data, o.batch, o.seq, cfg.vocab);
    if (lead) {
      std::printf("data %s: %zu tokens; model: %d layers, %s, %s\n", data.source().c_str(),
                  data.size(), cfg.layers, o.precision.c_str(), recomputation_text(o));
      std::printf(
          "pipeline: %s over %d stages x %d replicas%s%s (%s), %d micro-batches of %d "
          "sequences per replica, chunks %s\n",
          std::string(st.table().name).c_str(), o.pp, replicas,
          Tp ? fw::detail::cat(", each stage TensorParallel tp=", tp_degree,
                               o.sequence_parallel ? " (sequence parallel)" : "")
                   .c_str()
             : "",
          o.cp > 1 ? fw::detail::cat(", ContextParallel cp=", o.cp, " (", o.seq / o.cp,
                                     " tokens of every sequence per rank)")
                         .c_str()
                   : "",
          o.backend.c_str(), o.micro_batches, o.batch / replicas / o.micro_batches,
          st.partition().describe().c_str());
      std::printf("%s", fw::schedule::to_string(st.table()).c_str());
    }
    fw::RankHoldings held;  // the map: who holds what
    held.rank = w.rank();
    held.position = mesh.position(w.rank());
    held.layers = chunks_text(st);
    if constexpr (Tp) {
      std::vector<fw::tp::Placement> slices;  // of every chunk this rank holds
      for (int c = 0; c < st.table().chunks(); ++c)
        if (auto* chunk = st.chunk(c))
          slices.insert(slices.end(), chunk->placements().begin(), chunk->placements().end());
      held.tp_slice = fw::tp::describe_slice(slices, tp_degree, coord.tp);
    }
    if constexpr (Zero > 0) {
      held.set_sharding<typename S::dp_policy>(fw::optimizer_pieces(*st.sharded()));
      held.layout = st.sharded()->describe();
    } else {
      held.set_sharding<typename S::dp_policy>({});
    }
    held.count_bytes(w.memory());
    held.one_rank_bytes =  // the whole model's parameters, described (nothing allocated)
        static_cast<std::size_t>(
            fw::models::Gpt<T, B>::deferred(ctx, cfg, o.seed).num_parameters()) *
        fw::Precision<T>::bytes_per_param;
    print_map(
        lead, w.rank(), n, [&] { w.comm().barrier(); }, held.text());
    const fw::FlagGather flags = [&](std::int64_t mine) {
      return all_gather_words(w, ctx, &mine, 1);
    };
    const int resumed = resume_run(trainer, flags, o, loader, lead);
    fw::AsyncStateSave pending;  // --save-async
    std::ofstream log;
    if (lead && !o.log_json.empty()) log = open_log(o.log_json);
    fw::tools::Progress progress(o.steps);
    const StepMeter meter = step_meter<Target>(o, cfg, n);
    Validation val(o, cfg.vocab, lead);
    Sampler sampler(o, cfg, lead);
    double first_loss = 0.0, last_loss = 0.0;
    std::vector<TraceEvent> mine;
    const auto origin = std::chrono::steady_clock::now();
    const auto us = [&](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double, std::micro>(t - origin).count();
    };
    const auto loop_start = std::chrono::steady_clock::now();
    for (int step = resumed + 1; step <= o.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const fw::SequenceBatch b = loader.next();
      const float lr = st.optimizer().lr_at(trainer.iteration());
      ProfileWindow<Target> window(o, step);
      const float loss = trainer.step(fw::Batch{b.inputs, b.targets, b.B, b.T});
      window.close();
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
      fw::StepRecord r = step_record(step, loss, trainer.last_report(), ms, meter, lr);
      val.after_step(trainer, step, o.steps, r);
      sampler.after_step(trainer, step, o.steps, r, lead);
      save_if_due(trainer, pending, w.rank(), n, flags, o, loader, step, lead);
      finish_saves(pending, flags, o, false, lead);  // commits once every rank has written
      if (!lead) continue;
      if (log.is_open()) {
        const std::vector<const fw::MemoryAccountant*> mems = {&w.memory()};
        std::string line = fw::step_json(r, mems);
        char extra[96];
        std::snprintf(extra, sizeof extra,
                      ",\"ranks\":%d,\"tp\":%d,\"pp\":%d,\"zero\":%d,\"micro_batches\":%d", n,
                      tp_degree, o.pp, Zero, o.micro_batches);
        line.insert(line.size() - 1, extra);
        log << line << '\n';
        log.flush();
      }
      if (!o.quiet) progress.update(r);
      if (step == resumed + 1) first_loss = loss;
      last_loss = loss;
    }
    finish_saves(pending, flags, o, true, lead);  // the program does not exit before its commit
    if (lead) print_loop_time(o, loop_start, o.steps - resumed);
    {
      std::lock_guard lock(mu);
      trace.insert(trace.end(), mine.begin(), mine.end());
    }
    // the idle fraction per stage: measured in the last step vs the checker's simulation with
    // the costs measured in it (every rank's action times gathered over the pipeline group)
    const auto& table = st.table();
    std::size_t width = 0;
    for (const auto& row : table.actions) width = std::max(width, row.size());
    const std::vector<double> local =
        RankTimes(table, pp.rank(), st.spans(), st.spans_origin(), width).flat();
    std::vector<double> all(local.size() * static_cast<std::size_t>(o.pp));
    fw::staged_all_gather(ctx, pp, local.data(), all.data(),
                          static_cast<std::int64_t>(local.size()));
    if (lead) {
      progress.finish();
      print_losses(o, first_loss, last_loss, o.steps - resumed);
    }
    val.finish(trainer, lead);
    sampler.finish(trainer, lead);
    if (lead && o.steps > resumed) {  // a step ran: its idle fractions
      std::vector<RankTimes> times;
      for (int q = 0; q < o.pp; ++q)
        times.emplace_back(all.data() + static_cast<std::size_t>(q) * local.size(), width);
      const IdlePrediction idle = predict_idle(table, times);
      std::printf(
          "idle fraction per stage, last step: measured; predicted by the schedule's "
          "simulation "
          "with the measured median F/B/W per chunk, p2p latency %.3g ms and p2p group "
          "overhead "
          "%.3g ms; replayed with each action's measured time\n",
          idle.p2p.p2p * 1e3, idle.p2p.p2p_group * 1e3);
      for (std::size_t c = 0; c < idle.chunk.size(); ++c)
        std::printf(
            "  chunk %zu: F %.3g ms, B %.3g ms, W %.3g ms\n", c, idle.chunk[c].forward * 1e3,
            (idle.chunk[c].backward >= 0 ? idle.chunk[c].backward : idle.chunk[c].backward_input) *
                1e3,
            idle.chunk[c].backward_weight * 1e3);
      for (int q = 0; q < o.pp; ++q) {
        const auto u = static_cast<std::size_t>(q);
        std::printf("  stage %d: measured %.3f, predicted %.3f, replayed %.3f\n", q,
                    idle.measured[u], idle.predicted[u], idle.replayed[u]);
      }
    }
    save_weights<T>(trainer.strategy(), cfg, w.rank(), flags, o);  // each rank what it owns
    print_memory_report(o, w, ctx, lead);  // every rank's, whole-run peaks (save included)
    w.comm().barrier();
  };
  fw::launch<W>(o.ranks, rank_main, o.comm_options());
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
  // the tensor-parallel axis is a second instantiation: only a run with --tp > 1 pays for it
  const auto run = [&]<class W>(const Options& opts) {
    with_zero_stage(opts.zero, [&]<int Z>() {
      if (opts.tp > 1) {
        train_pipeline_ranks<Target, T, W, Z, true>(opts);
      } else {
        train_pipeline_ranks<Target, T, W, Z, false>(opts);
      }
    });
  };
  if (o.local_world()) {
    run.template operator()<fw::LocalWorld>(o);  // validate: --ranks = tp x pp x dp
    return 0;
  }
  Target::launch_processes(o, [&]<class W>() { run.template operator()<W>(o); });
  return 0;
}

}  // namespace fourway_train
