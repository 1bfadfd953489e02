// fourway-train --tp N [--sequence-parallel] [--dp D] [--zero S]: tensor parallelism inside groups
// of N consecutive ranks, DataParallel (--zero 0) or Sharded<S> across the D = ranks/N groups
// (fw::Mesh<TensorParallel, DataParallel>). Included at the end of train_program.hpp, whose
// helpers it uses; every backend of the program (local, mpi, nccl) runs it.
#pragma once

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "fourway/checkpoint/tp_checkpoint.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/parallel/tp/placement.hpp"

namespace fourway_train {

using TpMesh = fw::Mesh<fw::TensorParallel<fw::dynamic>, fw::DataParallel>;

template <class Target, class T, int Stage, class W>
void train_tp_ranks(const Options& o) {
  using B = typename Target::backend;
  using Comm = fw::Counting<typename W::comm_type>;
  using Model = fw::models::Gpt<T, B, Comm>;
  using S = fw::TensorParallelStrategy<Stage, T, B, Comm>;
  const auto rank_main = [&](fw::World<W>& w) {
    const bool lead = w.rank() == 0;
    const TpMesh mesh(w.size(), {.tp = o.tp, .dp = o.dp == 0 ? fw::dynamic : o.dp});
    fw::Context<B> ctx = Target::context(w.memory(), rank_device(w), o);
    bind_world(w, ctx);
    apply_memory_options<Target>(o, w.memory(), rank_device(w));
    Comm world(w.comm().split(0, w.rank(), "world"));
    fw::MeshGroups<Comm> groups(mesh, world);
    if constexpr (B::on_device) {  // collectives in stream order
      groups.tp().inner().set_stream(ctx.stream());
      groups.dp().inner().set_stream(ctx.stream());
    }
    const int dp = mesh.dp();
    fw::check<fw::ConfigError>(
        o.batch % (dp * o.micro_batches) == 0, "fourway: the global batch of B=", o.batch,
        " sequences does not split into ", dp, " data-parallel groups x ", o.micro_batches,
        " micro-batches; use a --batch that is a multiple of ", dp * o.micro_batches);
    const long long rows = static_cast<long long>(o.batch / dp / o.micro_batches) * o.seq;
    fw::check<fw::ConfigError>(
        !o.sequence_parallel || rows % o.tp == 0, "fourway: --sequence-parallel splits the ", rows,
        " rows of a micro-batch (batch/dp/micro-batches x seq) over tp=", o.tp,
        " ranks; choose --batch, --micro-batches and --seq so that "
        "tp divides them");
    std::optional<fw::SafetensorsReader> ckpt;
    const fw::models::GptConfig cfg = model_config(o, ckpt, lead);
    print_attention<Target>(ctx, o, cfg, lead);
    fw::tp::TpOptions to;
    to.sequence_parallel = o.sequence_parallel;
    to.vocab_alignment = o.vocab_align;
    Model model(ctx, cfg, groups.tp(), o.seed, to);
    if (ckpt) {
      fw::load_gpt2_tp(ctx, *ckpt, model);
      ckpt.reset();
    }
    const fw::TokenData data = o.data.empty() ? fw::builtin_corpus() : fw::TokenData::read(o.data);
    fw::TokenLoader loader(data, o.batch, o.seq, cfg.vocab);
    fw::ShardedOptions so;
    so.bucket_bytes = static_cast<std::int64_t>(static_cast<double>(o.bucket_mb) * 1048576.0);
    so.overlap = !o.no_overlap;
    fw::Trainer<S> trainer(trainer_options(o), ctx, model, groups.dp(), make_adamw(o), so);
    const std::string tp_name = groups.group_name(fw::Axis::tp);
    const std::string dp_name = groups.group_name(fw::Axis::dp);
    if (lead) {
      std::printf("data %s: %zu tokens; model: %s, %s\n", data.source().c_str(), data.size(),
                  o.precision.c_str(), recomputation_text(o));
      std::printf(
          "TensorParallel tp=%d%s x %s dp=%d on %d ranks (%s); vocabulary %d padded to "
          "%lld; %d micro-batch%s\n",
          mesh.tp(), o.sequence_parallel ? " (sequence parallel)" : "",
          Stage == 0 ? "DataParallel" : ("Sharded<" + std::to_string(Stage) + ">").c_str(), dp,
          w.size(), o.backend.c_str(), cfg.vocab, static_cast<long long>(model.padded_vocab()),
          o.micro_batches, o.micro_batches == 1 ? "" : "es");
    }
    fw::RankHoldings held;  // the map: who holds what
    held.rank = w.rank();
    held.position = mesh.position(w.rank());
    held.layers = whole_model_text(cfg);
    held.tp_slice = fw::tp::describe_slice(model.placements(), mesh.tp(), model.tp_rank());
    held.set_sharding<fw::data_parallel_policy_t<Stage>>(fw::optimizer_pieces(trainer.strategy()));
    held.layout = trainer.strategy().describe();
    held.count_bytes(w.memory());
    std::int64_t psi = 0;  // the unsplit model's parameters
    for (const auto& p : model.placements()) psi += p.full_numel();
    held.one_rank_bytes = static_cast<std::size_t>(psi) * fw::Precision<T>::bytes_per_param;
    print_map(
        lead, w.rank(), w.size(), [&] { world.barrier(); }, held.text());

    const fw::FlagGather flags = [&](std::int64_t mine) {
      return all_gather_words(w, ctx, &mine, 1);
    };
    const int resumed = resume_run(trainer, flags, o, loader, lead);
    fw::AsyncStateSave pending;  // --save-async

    std::ofstream log;
    if (lead && !o.log_json.empty()) {
      log.open(o.log_json, std::ios::trunc);
      fw::check<fw::ConfigError>(log.good(), "fourway: cannot create the log file ", o.log_json);
    }
    fw::tools::Progress progress(o.steps);
    const StepMeter meter = step_meter<Target>(o, cfg, w.size());
    Validation val(o, cfg.vocab, lead);
    Sampler sampler(o, cfg, lead);
    double first_loss = 0.0, last_loss = 0.0;
    const auto loop_start = std::chrono::steady_clock::now();
    for (int step = resumed + 1; step <= o.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const fw::SequenceBatch b = loader.next();
      const float lr = trainer.strategy().optimizer().lr_at(trainer.iteration());
      world.counters().reset();
      ProfileWindow<Target> window(o, step);
      const float loss = trainer.step(fw::Batch{b.inputs, b.targets, b.B, b.T});
      window.close();
      const double tp_bytes = world.counters().modelled_bytes_sent(tp_name);
      const double dp_bytes = world.counters().modelled_bytes_sent(dp_name);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      fw::StepRecord r = step_record(step, loss, trainer.last_report(), ms, meter, lr);
      val.after_step(trainer, step, o.steps, r);
      sampler.after_step(trainer, step, o.steps, r, lead);
      save_if_due(trainer, pending, w.rank(), w.size(), flags, o, loader, step, lead);
      finish_saves(pending, flags, o, false, lead);  // commits once every rank has written
      if (!lead) continue;
      if (log.is_open()) {
        const std::vector<const fw::MemoryAccountant*> mems = {&w.memory()};
        std::string line = fw::step_json(r, mems);
        char extra[160];
        std::snprintf(extra, sizeof extra,
                      ",\"ranks\":%d,\"tp\":%d,\"zero\":%d,\"tp_modelled_bytes_per_rank\":%.0f,"
                      "\"dp_modelled_bytes_per_rank\":%.0f",
                      w.size(), mesh.tp(), Stage, tp_bytes, dp_bytes);
        line.insert(line.size() - 1, extra);
        log << line << '\n';
        log.flush();
      }
      if (!o.quiet) {
        progress.update(r);
        if (!progress.interactive()) {
          std::printf("  comm %.0f B (tp) + %.0f B (dp) per rank, modelled (ring)\n", tp_bytes,
                      dp_bytes);
        }
      }
      if (step == resumed + 1) first_loss = loss;
      last_loss = loss;
    }
    finish_saves(pending, flags, o, true, lead);  // the program does not exit before its commit
    if (lead) print_loop_time(o, loop_start, o.steps - resumed);
    if (lead) {
      progress.finish();
      print_losses(o, first_loss, last_loss, o.steps - resumed);
    }
    val.finish(trainer, lead);
    sampler.finish(trainer, lead);
    save_weights<T>(trainer.strategy(), cfg, w.rank(), flags, o);  // each rank its slices
    print_memory_report(o, w, ctx, lead);  // every rank's, whole-run peaks (save included)
    world.barrier();  // no rank tears down its communicators while others still use them
  };
  fw::launch<W>(o.ranks, rank_main, o.comm_options());
}

template <class Target, class T, class W>
void train_tp_stage(const Options& o) {
  with_zero_stage(o, [&]<int Stage>() { train_tp_ranks<Target, T, Stage, W>(o); });
}

template <class Target, class T>
int train_tp_parallel(const Options& o) {
  if (o.local_world()) {
    train_tp_stage<Target, T, fw::LocalWorld>(o);  // validate: --ranks = tp x dp
    return 0;
  }
  Target::launch_processes(o, [&]<class W>() { train_tp_stage<Target, T, W>(o); });
  return 0;
}

}  // namespace fourway_train
