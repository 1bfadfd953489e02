// The fourway-train program, once for every backend: flags, model, data, Trainer, logs and errors.
// train.cpp instantiates it on the host (fourway-train), train_cuda.cu on CUDA
// (fourway-train-cuda); each passes a Target that says
//   using backend = fw::Host or fw::Cuda;              where the tensors live
//   static constexpr const char* program;               the name in --help and in errors
//   static void check_device();                         throws DeviceError when there is no GPU
//   static fw::Context<backend> context(MemoryAccountant&, int device);
//   static std::size_t default_memory_cap(int device);  per-rank cap without --memory-cap-gb
//                                                       (0: none; CUDA: the device's free bytes)
//   template <class Fn> static void launch_processes(const Options&, Fn fn);
//       --backend mpi|nccl: calls fn.template operator()<W>() with the world kind it runs, or
//       throws ConfigError saying why this build cannot.
// Everything else, --backend local included, is this one code path.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/checkpoint/sharded_io.hpp"
#include "fourway/comm/counting.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/comm/staged.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/loss_scaler.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/tools/cli.hpp"
#include "fourway/tools/progress.hpp"
#include "fourway/train/corpus.hpp"
#include "fourway/train/holdings.hpp"
#include "fourway/train/log.hpp"
#include "fourway/train/resume.hpp"
#include "fourway/train/sharded_strategy.hpp"
#include "fourway/train/strategy.hpp"
#include "fourway/train/token_data.hpp"
#include "fourway/train/trainer.hpp"

namespace fw = fourway;

namespace fourway_train {

using Clock = std::chrono::steady_clock;
/// Wall seconds since `t0`.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
  std::string init_from;
  int layers = 4;
  int dim = 256;
  int heads = 0;  // 0: 8 for a random model, width/64 for a checkpoint
  int vocab = static_cast<int>(fw::corpus_vocab);
  int seq = 64;
  std::uint64_t seed = 1337;
  std::string data;
  int batch = 8;
  int steps = 50;
  float lr = 3e-4f;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;
  int warmup = 0;                  // linear warm-up steps
  float min_lr = -1.0f;            // < 0: no decay; else cosine from --lr to it at the last step
  std::string precision = "fp32";  // run_program sets the target's default before parsing
  bool tf32 = false;               // fourway-train-cuda: TF32 tensor cores for fp32 GEMMs
  std::string attention = "blockwise";  // fourway-train-cuda, 16-bit: "fused" tensor-core kernels
  bool checkpoint_activations = false;
  int classifier_chunk = 0;  // LM-head rows of logits at a time (0: all, kept for backward)
  std::string log_json;
  std::string save;
  // checkpoints and resuming (docs/train.md)
  std::string save_dir;
  int save_every = 0;
  int keep = 0;
  bool save_async = false;
  std::string resume;
  bool quiet = false;
  int profile_step = 0;  // fourway-train-cuda: the one step a profiler started off records
  bool memory_report = false;
  double memory_cap_gb = 0.0;      // per rank, 1 GB = 1e9 B; 0: the target's default
  std::string block_cache = "on";  // the accountant's block cache (docs/memory.md)
  // data parallelism (docs/parallel.md)
  int ranks = 0;  // 0: 1 for --backend local, every mpirun process for --backend mpi
  std::string backend = "local";
  double comm_timeout = 300.0;  // seconds: the deadline of every communicator wait
  int dp = 0;
  int zero = 0;
  float bucket_mb = 25.0f;
  bool no_overlap = false;
  // tensor parallelism (docs/parallel-tp.md, train_tp.hpp)
  int tp = 1;
  bool sequence_parallel = false;
  int vocab_align = 0;
  // pipeline parallelism and micro-batches (docs/pipeline.md)
  int pp = 1;
  int micro_batches = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 0;  // 0: 2 for interleaved and zb-v, else 1
  std::string trace;
  // the numerics check (check_program.hpp, docs/mesh.md)
  bool check = false;
  [[nodiscard]] bool parallel() const {
    return ranks > 1 || backend != "local" || zero != 0 || tp != 1 || sequence_parallel;
  }
  /// Ranks as threads of this process: LocalWorld, lenient (`local`) or held to NCCL's contract
  /// (`strict`, docs/comm.md).
  [[nodiscard]] bool local_world() const { return backend == "local" || backend == "strict"; }
  /// What every launch of the program gives its communicators: the --comm-timeout deadline, and
  /// the strict world for --backend strict.
  [[nodiscard]] fw::CommOptions comm_options() const {
    fw::CommOptions c;
    c.deadline = std::chrono::milliseconds(static_cast<std::int64_t>(comm_timeout * 1000.0));
    c.strict = backend == "strict";
    return c;
  }
};

inline fw::tools::ArgParser make_parser(Options& o, const char* program) {
  fw::tools::ArgParser p(
      program,
      "Trains a GPT-2 with AdamW on llm.c token files (or the built-in corpus),\n"
      "from Hugging Face safetensors weights (or a random init), and reports the\n"
      "loss, tokens/s and memory per tag at every step.");
  p.add("init-from", &o.init_from, "FILE", "GPT-2 weights (.safetensors, HF names) to start from")
      .add("layers", &o.layers, "L", "blocks of a random model")
      .add("dim", &o.dim, "C", "width of a random model")
      .add("heads", &o.heads, "H", "attention heads (0: 8, or width/64 with --init-from)")
      .add("vocab", &o.vocab, "V", "vocabulary of a random model")
      .add("seq", &o.seq, "T", "sequence length (and the context of a random model)")
      .add("seed", &o.seed, "S", "seed of the random init")
      .add("data", &o.data, "FILE", "llm.c token file (default: the built-in corpus)")
      .add("batch", &o.batch, "B", "sequences per optimizer step (global)")
      .add("steps", &o.steps, "N", "optimizer steps")
      .add("lr", &o.lr, "LR", "AdamW learning rate (constant)")
      .add("weight-decay", &o.weight_decay, "WD", "AdamW weight decay (2-D weights only)")
      .add("beta1", &o.beta1, "B1", "AdamW beta1")
      .add("beta2", &o.beta2, "B2", "AdamW beta2")
      .add("eps", &o.eps, "EPS", "AdamW epsilon")
      .add("grad-clip", &o.grad_clip, "NORM", "clip the global gradient norm (0: off)")
      .add("warmup", &o.warmup, "N", "linear learning-rate warm-up over the first N steps")
      .add("min-lr", &o.min_lr, "LR",
           "cosine decay from --lr to LR at the last step (negative: no decay)")
      .add_choice("precision", &o.precision, {"fp32", "bf16", "fp16"},
                  "working precision (bf16/fp16 keep fp32 masters; fp16 scales the loss)")
      .add_switch("tf32", &o.tf32,
                  "fourway-train-cuda, --precision fp32: TF32 tensor cores for the GEMMs")
      .add_choice("attention", &o.attention, {"blockwise", "fused"},
                  "fourway-train-cuda, bf16/fp16: the causal attention's kernels (fused: flash "
                  "kernels on the tensor cores, scores kept on chip, head sizes 16/32/64/128; "
                  "blockwise: batched cuBLAS GEMMs)")
      .add("classifier-chunk", &o.classifier_chunk, "ROWS",
           "LM-head logits ROWS token rows at a time, recomputed in backward (0: all B·T rows, "
           "kept)")
      .add_switch("checkpoint-activations", &o.checkpoint_activations,
                  "recompute each block's activations in backward")
      .add("log-json", &o.log_json, "FILE", "write one JSON object per step to FILE")
      .add("save", &o.save, "FILE", "save the final weights (.safetensors, HF names)")
      .add("save-dir", &o.save_dir, "DIR",
           "save resumable checkpoints (optimizer state, step, data position) under DIR")
      .add("save-every", &o.save_every, "N", "checkpoint every N steps (and after the last)")
      .add("keep", &o.keep, "K", "keep only the newest K checkpoints (0: all)")
      .add_switch("save-async", &o.save_async,
                  "copy the state to host memory at the save step and write it in the "
                  "background while training continues (one save in flight)")
      .add("resume", &o.resume, "DIR",
           "resume from a checkpoint (or the newest under a --save-dir), on any mesh")
      .add_switch("memory-report", &o.memory_report,
                  "print every rank's per-tag memory table (whole-run peaks) at the end")
      .add("memory-cap-gb", &o.memory_cap_gb, "GB",
           "per-rank memory cap (1e9 B): past it an allocation fails with OutOfMemory "
           "(0: none on the host, the GPU's free memory on CUDA)")
      .add_choice("block-cache", &o.block_cache, {"on", "off"},
                  "reuse freed blocks for tensors of the same size (off: every tensor asks the "
                  "backend; for comparisons)")
      .add("ranks", &o.ranks, "N",
           "ranks: LocalWorld threads (default 1), or the launcher's processes (default all)")
      .add_choice("backend", &o.backend, {"local", "strict", "mpi", "nccl"},
                  "communication: LocalWorld threads, LocalWorld held to NCCL's contract "
                  "(docs/comm.md), MPI processes (mpirun), NCCL (one process per GPU: mpirun, "
                  "torchrun or srun)")
      .add("comm-timeout", &o.comm_timeout, "SECONDS",
           "deadline of every communicator wait: a rank that never arrives becomes a typed "
           "CommTimeout after it (NCCL: the communicator is aborted)")
      .add("dp", &o.dp, "N", "data-parallel degree (0: all ranks; no other axis yet)")
      .add("zero", &o.zero, "S", "0 DataParallel, 1/2/3 Sharded<S> (ZeRO-1/2, FSDP)")
      .add("bucket-mb", &o.bucket_mb, "MB", "gradient bucket size of --zero 0-2 (0: one bucket)")
      .add_switch("no-overlap", &o.no_overlap,
                  "issue collectives after backward, no prefetch (to measure the overlap)")
      .add("tp", &o.tp, "N", "tensor-parallel degree: groups of N consecutive ranks split layers")
      .add_switch("sequence-parallel", &o.sequence_parallel,
                  "with --tp: split LayerNorm/residual regions along the sequence")
      .add("vocab-align", &o.vocab_align, "A",
           "pad the vocabulary to a multiple of A (with --tp: of tp*A); the padding is masked, "
           "files keep the real rows (0: 128 on CUDA, 1 on host)")
      .add("pp", &o.pp, "S", "pipeline stages (one rank each)")
      .add("micro-batches", &o.micro_batches, "M",
           "micro-batches per step (gradient accumulation; the pipeline's M)")
      .add_choice("schedule", &o.schedule, {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"},
                  "pipeline schedule")
      .add("virtual-stages", &o.virtual_stages, "V",
           "model chunks per rank of the interleaved schedule (0: 2)")
      .add("trace", &o.trace, "FILE", "write Chrome trace events of the pipeline to FILE")
      .add_switch("check", &o.check,
                  "run the mesh and the one-rank run on the same batches for --steps steps and "
                  "compare losses and step-1 gradients (exit 1 when outside the precision's "
                  "bounds)")
      .add_switch("quiet", &o.quiet, "print no per-step progress")
      .add("profile-step", &o.profile_step, "N",
           "fourway-train-cuda: record step N only, for a profiler started with its recording "
           "off (cudaProfilerStart/Stop around it; ncu --profile-from-start off; 0: no window)");
  return p;
}

inline void check_positive(const char* flag, long long v) {
  fw::check<fw::ConfigError>(v > 0, "fourway: --", flag, " must be positive, got ", v);
}

/// Fails before training, not after it, when an output file cannot be created.
inline void check_output_dir(const char* flag, const std::string& file) {
  if (file.empty()) return;
  const auto dir = std::filesystem::absolute(file).parent_path();
  std::error_code ec;
  fw::check<fw::ConfigError>(std::filesystem::is_directory(dir, ec), "fourway: --", flag,
                             " cannot create ", file, ": directory ", dir.string(),
                             " does not exist");
}

/// --save-dir, --save-every, --keep, --resume: the checks every path makes before training.
inline void check_checkpoint_flags(const Options& o) {
  fw::check<fw::ConfigError>(o.save_every >= 0 && o.keep >= 0, "fourway: --save-every (",
                             o.save_every, ") and --keep (", o.keep, ") must be >= 0");
  fw::check<fw::ConfigError>(!o.save_dir.empty() || (o.save_every == 0 && o.keep == 0),
                             "fourway: --save-every and --keep need --save-dir DIR");
  fw::check<fw::ConfigError>(!o.save_dir.empty() || !o.save_async,
                             "fourway: --save-async needs --save-dir DIR (it writes the "
                             "checkpoints of --save-every in the background)");
}

/// --resume: restores the trainer and the loader's position; returns the step it resumes after.
template <class TrainerT>
int resume_run(TrainerT& trainer, const fw::FlagGather& flags, const Options& o,
               fw::TokenLoader& loader, bool lead) {
  if (o.resume.empty()) return 0;
  const auto t0 = Clock::now();
  const fw::StateIndex index = fw::resume_checkpoint(trainer, flags, o.resume);
  const auto pos = index.meta.find("data_position");
  fw::check<fw::CheckpointError>(pos != index.meta.end(), "fourway: ", o.resume,
                                 " does not record a data position; it was not saved by "
                                 "fourway-train");
  loader.reset(std::stoll(pos->second));
  const auto done = static_cast<int>(trainer.iteration());
  fw::check<fw::ConfigError>(done <= o.steps, "fourway: ", o.resume, " is at step ", done,
                             " but --steps is ", o.steps, "; raise --steps to continue");
  if (lead) {
    const double s = seconds_since(t0);
    std::printf("resumed from %s at step %d (saved by %s ranks) in %.3f s\n",
                fw::resolve_checkpoint(o.resume).string().c_str(), done,
                index.meta.count("saved_by_ranks") ? index.meta.at("saved_by_ranks").c_str() : "?",
                s);
  }
  return done;
}

/// --save-async: commits the save in flight when every rank has written it (`wait`: blocks for
/// it, at the end of the run). A collective; nothing happens without a save in flight.
inline void finish_saves(fw::AsyncStateSave& pending, const fw::FlagGather& flags, const Options& o,
                         bool wait, bool lead) {
  if (!pending.in_flight()) return;
  const auto dir = wait ? pending.wait(flags) : pending.poll(flags);
  if (dir && lead && !o.quiet) {
    std::printf(
        "checkpoint %s committed (async): written in %.3f s in the background (rank 0), "
        "committed %.3f s after the copy%s\n",
        dir->string().c_str(), pending.write_seconds(), pending.seconds_since_start(),
        wait ? " (waited for)" : "");
  }
}

/// The wall time of the training loop, its checkpoints included (the cost of the saves,
/// synchronous or not, is the difference to the same run without --save-dir).
inline void print_loop_time(const Options& o, Clock::time_point start, int steps) {
  if (o.quiet) return;
  std::printf("training loop: %d steps in %.3f s%s\n", steps, seconds_since(start),
              o.save_dir.empty() ? "" : ", checkpoints included");
}

/// --save-dir: a checkpoint after `step` when --save-every says so, and after the last step.
/// With --save-async the state is copied to `pending`'s host buffer here and written in the
/// background; `finish_saves` commits it.
template <class TrainerT>
void save_if_due(TrainerT& trainer, fw::AsyncStateSave& pending, int rank, int world,
                 const fw::FlagGather& flags, const Options& o, const fw::TokenLoader& loader,
                 int step, bool lead) {
  if (o.save_dir.empty()) return;
  if (step != o.steps && (o.save_every == 0 || step % o.save_every != 0)) return;
  fw::CheckpointOptions c;
  c.root = o.save_dir;
  c.keep = o.keep;
  c.meta["data_position"] = std::to_string(loader.position());
  c.meta["data"] = o.data;
  c.meta["seed"] = std::to_string(o.seed);  // of the init; a step draws no random numbers
  if (o.save_async) {
    finish_saves(pending, flags, o, true, lead);  // one save in flight: the previous one first
    const auto t0 = Clock::now();
    fw::save_checkpoint_async(trainer, pending, rank, world, flags, c);
    if (lead && !o.quiet) {
      std::printf(
          "checkpoint step %d: %llu B copied to host in %.3f s (rank 0); writing in the "
          "background\n",
          step, static_cast<unsigned long long>(pending.snapshot_bytes()), seconds_since(t0));
    }
    return;
  }
  const auto t0 = Clock::now();
  const auto dir = fw::save_checkpoint(trainer, rank, world, flags, c);
  if (lead && !o.quiet) {
    std::printf("checkpoint %s in %.3f s\n", dir.string().c_str(), seconds_since(t0));
  }
}

/// --profile-step N: around step N, the target's profiler recording (fourway-train-cuda:
/// cudaProfilerStart / cudaProfilerStop), closed after the step or when it throws.
template <class Target>
class ProfileWindow {
 public:
  ProfileWindow(const Options& o, int step) : open_(o.profile_step == step) {
    if constexpr (Target::has_profiler_window) {
      if (open_) Target::profile(true);
    }
  }
  ProfileWindow(const ProfileWindow&) = delete;
  ProfileWindow& operator=(const ProfileWindow&) = delete;
  ~ProfileWindow() { close(); }
  void close() {
    if constexpr (Target::has_profiler_window) {
      if (open_) Target::profile(false);
    }
    open_ = false;
  }

 private:
  bool open_;
};

/// The per-rank cap in bytes: --memory-cap-gb, else the target's default (0: none).
template <class Target>
std::size_t memory_cap(const Options& o, int device) {
  fw::check<fw::ConfigError>(o.memory_cap_gb >= 0.0, "fourway: --memory-cap-gb must be >= 0, got ",
                             o.memory_cap_gb);
  if (o.memory_cap_gb > 0.0) {
    return static_cast<std::size_t>(std::llround(o.memory_cap_gb * 1e9));
  }
  return Target::default_memory_cap(device);
}

/// Applies --memory-cap-gb and --block-cache to one rank's accountant.
template <class Target>
void apply_memory_options(const Options& o, fw::MemoryAccountant& memory, int device) {
  memory.set_limit(memory_cap<Target>(o, device));
  memory.set_block_caching(o.block_cache == "on");
}

/// Binds the world communicator to the rank's stream on a GPU, so the collectives the program
/// makes on it (the words below, barriers) are ordered with the rank's kernels; NCCL refuses a
/// call on an unbound communicator.
template <class B, class W>
void bind_world(fw::World<W>& w, const fw::Context<B>& ctx) {
  if constexpr (B::on_device) w.comm().set_stream(ctx.stream());
}

/// `k` integers of every rank, on every rank (a collective over the world communicator, so the
/// data-parallel byte counters do not see it), staged through a small counted buffer of the
/// backend's memory (NCCL moves device memory only; the strict world holds the host to that).
/// The world communicator is bound to the rank's stream (`bind_world`) on a GPU.
template <class B, class W>
std::vector<std::int64_t> all_gather_words(fw::World<W>& w, const fw::Context<B>& ctx,
                                           const std::int64_t* mine, int k) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(k * w.size()));
  fw::staged_all_gather(ctx, w.comm(), mine, all.data(), k);  // backend memory, as NCCL needs
  return all;
}

/// Every rank's memory counters, on every rank.
template <class B, class W>
std::vector<fw::MemorySnapshot> gather_memory(fw::World<W>& w, const fw::Context<B>& ctx) {
  constexpr int k = fw::MemorySnapshot::words;
  const auto mine = w.memory().snapshot().to_words();
  const std::vector<std::int64_t> all = all_gather_words(w, ctx, mine.data(), k);
  std::vector<fw::MemorySnapshot> out;
  for (int r = 0; r < w.size(); ++r) {
    out.push_back(fw::MemorySnapshot::from_words(all.data() + static_cast<std::size_t>(r * k)));
  }
  return out;
}

/// --attention fused (fourway-train-cuda): the lead rank says which attention the layers run,
/// the fused kernels or the blockwise path and why (Target::attention_note).
template <class Target, class B>
void print_attention(const fw::Context<B>& ctx, const Options& o, const fw::models::GptConfig& cfg,
                     bool lead) {
  if constexpr (Target::has_fused_attention) {
    if (lead && o.attention == "fused") {
      std::printf("attention: %s\n", Target::attention_note(ctx, o, cfg).c_str());
    }
  } else {
    (void)ctx, (void)o, (void)cfg, (void)lead;
  }
}

/// The model's shape, from a checkpoint (read into `ckpt`) or from the flags.
/// (The checkpoint is opened for positioned reads: only its header is read here.)
inline fw::models::GptConfig model_config(const Options& o,
                                          std::optional<fw::SafetensorsReader>& ckpt, bool print) {
  // ---- the model: from a checkpoint or random ------------------------------------------------
  fw::models::GptConfig cfg;
  if (!o.init_from.empty()) {
    ckpt = fw::SafetensorsReader::open(o.init_from);
    const auto info = fw::inspect_gpt2(*ckpt);
    cfg = info.config(o.heads);
    if (print) {
      std::printf("checkpoint %s: %d layers, width %d, %d heads, vocab %d, context %d%s\n",
                  o.init_from.c_str(), cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq,
                  info.prefix.empty() ? "" : " (names prefixed transformer.)");
    }
    for (const auto& n : info.ignored) {
      if (print) std::printf("  ignoring buffer %s\n", n.c_str());
    }
  } else {
    cfg.layers = o.layers;
    cfg.dim = o.dim;
    cfg.heads = o.heads == 0 ? 8 : o.heads;
    cfg.vocab = o.vocab;
    cfg.max_seq = o.seq;
    check_positive("layers", cfg.layers);
    check_positive("dim", cfg.dim);
    check_positive("vocab", cfg.vocab);
    fw::check<fw::ConfigError>(cfg.dim % cfg.heads == 0, "fourway: --heads ", cfg.heads,
                               " does not divide --dim ", cfg.dim,
                               "; choose heads that divide the width");
  }
  fw::check<fw::ConfigError>(o.seq <= cfg.max_seq, "fourway: --seq ", o.seq,
                             " exceeds the model's context of ", cfg.max_seq,
                             " positions; use --seq <= ", cfg.max_seq);
  cfg.checkpoint = o.checkpoint_activations;
  cfg.classifier_chunk = o.classifier_chunk;
  // the tensor-parallel model pads its vocabulary slices itself (tp::TpOptions)
  cfg.vocab_alignment = o.tp > 1 ? 1 : std::max(o.vocab_align, 1);
  return cfg;
}

inline fw::AdamWConfig adamw_config(const Options& o) {
  fw::AdamWConfig acfg;
  acfg.lr = o.lr;
  acfg.beta1 = o.beta1;
  acfg.beta2 = o.beta2;
  acfg.eps = o.eps;
  acfg.weight_decay = o.weight_decay;
  acfg.max_grad_norm = o.grad_clip;
  return acfg;
}

/// AdamW with a constant learning rate, or warm-up + cosine (nanoGPT's schedule) when
/// --warmup or --min-lr ask for it.
inline fw::AdamW make_adamw(const Options& o) {
  const fw::AdamWConfig cfg = adamw_config(o);
  if (o.warmup == 0 && o.min_lr < 0.0f) return fw::AdamW(cfg);
  fw::check<fw::ConfigError>(o.warmup >= 0, "fourway: --warmup must be >= 0, got ", o.warmup);
  return fw::AdamW(cfg, fw::LrSchedule::warmup_cosine(o.lr, o.warmup, o.steps,
                                                      o.min_lr < 0.0f ? o.lr : o.min_lr));
}

/// --micro-batches: gradient accumulation over M micro-batches per step.
inline fw::TrainerOptions trainer_options(const Options& o) {
  fw::TrainerOptions t;
  t.micro_batches = o.micro_batches;
  return t;
}

/// One step's line of the progress display and the JSON log.
inline fw::StepRecord step_record(int step, float loss, const fw::StepReport& rep, double ms,
                                  double tokens_per_step, float lr) {
  fw::StepRecord r;
  r.step = step;
  r.loss = loss;
  r.grad_norm = rep.grad_norm;
  r.step_ms = ms;
  r.tokens_per_s = tokens_per_step / (ms / 1000.0);
  r.lr = lr;
  r.skipped = rep.skipped;
  return r;
}

/// The JSON log of --log-json, opened (truncated) by the rank that writes it.
inline std::ofstream open_log(const std::string& path) {
  std::ofstream log(path, std::ios::trunc);
  fw::check<fw::ConfigError>(log.good(), "fourway: cannot create the log file ", path);
  return log;
}

template <class Target, class T>
int train(const Options& o) {
  using B = typename Target::backend;
  check_output_dir("save", o.save);
  check_output_dir("log-json", o.log_json);
  fw::MemoryAccountant memory(0);
  fw::Context<B> ctx = Target::context(memory, 0, o);
  apply_memory_options<Target>(o, memory, 0);

  std::optional<fw::SafetensorsReader> ckpt;
  fw::models::GptConfig cfg = model_config(o, ckpt, true);
  print_attention<Target>(ctx, o, cfg, true);
  // the data is checked against the batch and vocabulary before the model is allocated
  const fw::TokenData data = o.data.empty() ? fw::builtin_corpus() : fw::TokenData::read(o.data);
  fw::TokenLoader loader(data, o.batch, o.seq, cfg.vocab);
  using Model = fw::models::Gpt<T, B>;
  // deferred: the strategy allocates and initialises (no second copy of the model at start-up)
  Model model = ckpt ? Model(ctx, cfg, o.seed) : Model::deferred(ctx, cfg, o.seed);
  if (ckpt) {
    fw::load_gpt2(ctx, *ckpt, model);
    std::printf("  read %llu B of %s (%llu B)\n",
                static_cast<unsigned long long>(ckpt->bytes_read()), o.init_from.c_str(),
                static_cast<unsigned long long>(std::filesystem::file_size(o.init_from)));
    ckpt.reset();
  }

  std::printf("data %s: %zu tokens, %lld batches of %d x %d before it wraps\n",
              data.source().c_str(), data.size(),
              static_cast<long long>(loader.batches_per_epoch()), o.batch, o.seq);
  std::printf("model: %lld parameters, %s, %s\n", static_cast<long long>(model.num_parameters()),
              o.precision.c_str(),
              o.checkpoint_activations ? "activation checkpointing" : "no checkpointing");

  // ---- optimizer ------------------------------------------------------------------------------
  using P = fw::Precision<T>;
  fw::Trainer<fw::SingleRank<Model, P, B>> trainer(trainer_options(o), ctx, model, make_adamw(o));
  const fw::FlagGather alone = [](std::int64_t mine) { return std::vector<std::int64_t>{mine}; };
  const int resumed = resume_run(trainer, alone, o, loader, true);
  fw::AsyncStateSave pending;  // --save-async

  fw::JsonLog log;
  if (!o.log_json.empty()) log = fw::JsonLog(o.log_json);
  fw::tools::Progress progress(o.steps);
  if (o.quiet) progress = fw::tools::Progress(o.steps, false, nullptr);

  const double tokens_per_step = static_cast<double>(o.batch) * o.seq;
  double first_loss = 0.0, last_loss = 0.0;

  const auto loop_start = Clock::now();
  for (int step = resumed + 1; step <= o.steps; ++step) {
    const auto t0 = Clock::now();
    const fw::SequenceBatch b = loader.next();
    const float lr = trainer.strategy().optimizer().lr_at(trainer.iteration());
    ProfileWindow<Target> window(o, step);
    const float loss = trainer.step(fw::Batch{b.inputs, b.targets, b.B, b.T});
    window.close();
    const fw::StepReport& rep = trainer.last_report();
    const double ms = 1e3 * seconds_since(t0);

    const fw::StepRecord r = step_record(step, loss, rep, ms, tokens_per_step, lr);
    log.write(r, {&memory});
    if (!o.quiet) progress.update(r);
    if (step == resumed + 1) first_loss = loss;
    last_loss = loss;
    save_if_due(trainer, pending, 0, 1, alone, o, loader, step, true);
    finish_saves(pending, alone, o, false, true);
  }
  finish_saves(pending, alone, o, true, true);
  print_loop_time(o, loop_start, o.steps - resumed);
  progress.finish();
  std::printf("loss %.4f -> %.4f over %d steps\n", first_loss, last_loss, o.steps - resumed);
  if (!o.save.empty()) {
    fw::save_gpt2(ctx, model, o.save);
    std::printf("saved %s\n", o.save.c_str());
  }
  if (o.memory_report) std::printf("%s", memory.table().c_str());  // peaks of the whole run
  return 0;
}

// ---- data parallelism: --ranks --backend --dp --zero --bucket-mb --------------------------------

/// The GPU a rank computes on: the one NcclWorld chose from the node-local rank; device 0 for
/// LocalWorld (all ranks on one GPU, one stream each) and for the host.
template <class W>
int rank_device(fw::World<W>& w) {
  if constexpr (requires { w.comm().device(); }) {
    return w.comm().device();
  } else {
    return 0;
  }
}

/// The negative control of tests/parallel/mpi_train_matches_local.cmake, never for training:
/// with FOURWAY_TRAIN_SKIP_COLLECTIVES=1 in the environment every rank is alone in its group and
/// trains on its share of each batch, making no collective with its peers.
inline bool skip_collectives() {
  const char* v = std::getenv("FOURWAY_TRAIN_SKIP_COLLECTIVES");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

/// Rank r's share (B/n rows) of the global batch `b`, what the Trainer would give it.
inline fw::Batch batch_share(const fw::SequenceBatch& b, int r, int n) {
  const std::int64_t rows = b.B / n;
  const auto at = static_cast<std::size_t>(r * rows * b.T);
  const auto len = static_cast<std::size_t>(rows * b.T);
  return fw::Batch{std::span<const std::int32_t>(b.inputs).subspan(at, len),
                   std::span<const std::int32_t>(b.targets).subspan(at, len), rows, b.T};
}

/// The map's `layers` entry of a rank that holds the whole model.
inline std::string whole_model_text(const fw::models::GptConfig& cfg) {
  return fw::detail::cat("all ", cfg.layers, cfg.layers == 1 ? " block" : " blocks",
                         ", embedding and head");
}

/// The map (train/holdings.hpp): every rank's `entry`, printed by that rank in rank order, after
/// a heading from the lead; `barrier()` is a collective over all `size` ranks.
template <class Barrier>
void print_map(bool lead, int rank, int size, Barrier&& barrier, const std::string& entry) {
  if (lead) std::printf("map: who holds what (docs/mesh.md)\n");
  for (int q = 0; q < size; ++q) {
    barrier();
    if (q != rank) continue;
    std::fputs(entry.c_str(), stdout);
    std::fflush(stdout);
  }
  barrier();
}

/// Trains on the ranks of world kind W with ShardedStrategy<Stage> (0 = DataParallel). Every rank
/// builds the model and reads the data; the Trainer gives each its share of the global batch.
template <class Target, class T, int Stage, class W>
void train_ranks(const Options& o) {
  using B = typename Target::backend;
  using Model = fw::models::Gpt<T, B>;
  using Comm = fw::Counting<typename W::comm_type>;
  using S = fw::ShardedStrategy<Stage, Model, fw::Precision<T>, B, Comm>;
  std::mutex mu;
  std::vector<const fw::MemoryAccountant*> memories;  // LocalWorld: every rank's, for the log
  const auto rank_main = [&](fw::World<W>& w) {
    const bool lead = w.rank() == 0;
    const int n = w.size();
    fw::check<fw::ConfigError>(o.dp == 0 || o.dp == n, "fourway: --dp ", o.dp, " but there are ", n,
                               " ranks; without --pp (and with no tensor axis yet) "
                               "--dp must equal the number of ranks (or be 0)");
    fw::Context<B> ctx = Target::context(w.memory(), rank_device(w), o);
    bind_world(w, ctx);
    apply_memory_options<Target>(o, w.memory(), rank_device(w));
    const bool isolated = skip_collectives();
    Comm dp(w.comm().split(isolated ? w.rank() : 0, w.rank(), "dp"));
    if constexpr (B::on_device) dp.inner().set_stream(ctx.stream());  // collectives in order
    std::optional<fw::SafetensorsReader> ckpt;
    const fw::models::GptConfig cfg = model_config(o, ckpt, lead);
    print_attention<Target>(ctx, o, cfg, lead);
    // described, not allocated: the strategy materialises (and loads) only what this rank owns
    Model model = Model::deferred(ctx, cfg, o.seed);
    const std::int64_t psi = model.num_parameters();
    const fw::TokenData data = o.data.empty() ? fw::builtin_corpus() : fw::TokenData::read(o.data);
    fw::TokenLoader loader(data, o.batch, o.seq, cfg.vocab);
    fw::ShardedOptions so;
    so.bucket_bytes = static_cast<std::int64_t>(static_cast<double>(o.bucket_mb) * 1048576.0);
    so.overlap = !o.no_overlap;
    fw::Trainer<S> trainer(trainer_options(o), ctx, model, dp, make_adamw(o), so);
    std::string loaded;
    if (ckpt) {  // positioned reads of the elements this rank owns, converted on the way
      const auto t0 = Clock::now();
      fw::load_gpt2_sharded(trainer.strategy(), *ckpt);
      w.comm().barrier();  // every rank has its weights
      const double s = seconds_since(t0);
      if (lead) std::printf("loaded %s in %.3f s on %d ranks\n", o.init_from.c_str(), s, n);
      loaded = fw::detail::cat("  read ", ckpt->bytes_read(), " B of ", o.init_from, " (",
                               std::filesystem::file_size(o.init_from), " B)\n");
      ckpt.reset();
    }
    if constexpr (std::is_same_v<W, fw::LocalWorld>) {
      std::lock_guard lock(mu);
      if (memories.empty()) memories.assign(static_cast<std::size_t>(n), nullptr);
      memories[static_cast<std::size_t>(w.rank())] = &w.memory();
    }
    if (lead) {
      std::printf("data %s: %zu tokens; model: %lld parameters, %s, %s\n", data.source().c_str(),
                  data.size(), static_cast<long long>(psi), o.precision.c_str(),
                  o.checkpoint_activations ? "activation checkpointing" : "no checkpointing");
      std::printf("%s on %d ranks (%s), bucket %.1f MiB\n",
                  Stage == 0 ? "DataParallel" : ("Sharded<" + std::to_string(Stage) + ">").c_str(),
                  n, o.backend.c_str(), static_cast<double>(o.bucket_mb));
    }
    // the map: who holds what, and the memory by tag, rank by rank
    fw::RankHoldings held;
    held.rank = w.rank();
    held.position = fw::Mesh<fw::DataParallel>(n).position(w.rank());
    held.layers = whole_model_text(cfg);
    held.set_sharding<fw::data_parallel_policy_t<Stage>>(fw::optimizer_pieces(trainer.strategy()));
    held.layout = trainer.strategy().describe();
    held.count_bytes(w.memory());
    held.one_rank_bytes = static_cast<std::size_t>(psi) * fw::Precision<T>::bytes_per_param;
    print_map(
        lead, w.rank(), n, [&] { dp.barrier(); }, held.text() + loaded + w.memory().table());

    const fw::FlagGather flags = [&](std::int64_t mine) {
      return all_gather_words(w, ctx, &mine, 1);
    };
    const int resumed = resume_run(trainer, flags, o, loader, lead);
    fw::AsyncStateSave pending;  // --save-async
    std::ofstream log;
    if (lead && !o.log_json.empty()) log = open_log(o.log_json);
    fw::tools::Progress progress(o.steps);
    const double tokens_per_step = static_cast<double>(o.batch) * o.seq;
    double first_loss = 0.0, last_loss = 0.0;
    const auto loop_start = Clock::now();
    for (int step = resumed + 1; step <= o.steps; ++step) {
      const auto t0 = Clock::now();
      const fw::SequenceBatch b = loader.next();
      const float lr = trainer.strategy().optimizer().lr_at(trainer.iteration());
      dp.counters().reset();
      if constexpr (std::is_same_v<W, fw::LocalWorld>) dp.inner().reset_traffic();
      ProfileWindow<Target> window(o, step);
      const float loss = trainer.step(isolated ? batch_share(b, w.rank(), n)
                                               : fw::Batch{b.inputs, b.targets, b.B, b.T});
      window.close();
      // modelled: ring bytes of the calls made; payload: what the calls were handed; measured
      // (LocalWorld only): the bytes its copy loops moved between ranks
      const double modelled = dp.counters().modelled_bytes_sent("dp");
      const auto payload = static_cast<unsigned long long>(dp.counters().payload_sent("dp"));
      long long measured = -1;
      if constexpr (std::is_same_v<W, fw::LocalWorld>) {
        measured = static_cast<long long>(dp.inner().traffic().total());
      }
      const double ms = 1e3 * seconds_since(t0);
      const fw::StepRecord r =
          step_record(step, loss, trainer.last_report(), ms, tokens_per_step, lr);
      save_if_due(trainer, pending, w.rank(), n, flags, o, loader, step, lead);
      finish_saves(pending, flags, o, false, lead);  // commits once every rank has written
      std::vector<fw::MemorySnapshot> mems;  // every rank's, peaks since the start of the run
      if (!o.log_json.empty()) {
        if constexpr (std::is_same_v<W, fw::LocalWorld>) {
          w.comm().barrier();  // every rank has finished the step (uncounted)
          for (const auto* m : memories) mems.push_back(m->snapshot());
        } else {
          mems = gather_memory(w, ctx);
        }
      }
      if (!lead) continue;
      if (log.is_open()) {
        std::string line = fw::step_json(r, mems);
        char extra[192];
        std::snprintf(extra, sizeof extra,
                      ",\"ranks\":%d,\"zero\":%d,\"comm_modelled_bytes_per_rank\":%.0f,"
                      "\"comm_payload_bytes_per_rank\":%llu",
                      n, Stage, modelled, payload);
        line.insert(line.size() - 1, extra);
        if (measured >= 0) {
          line.insert(line.size() - 1,
                      ",\"comm_measured_bytes_per_rank\":" + std::to_string(measured));
        }
        log << line << '\n';
        log.flush();
      }
      if (!o.quiet) {
        progress.update(r);
        if (!progress.interactive()) {
          if (measured >= 0) {
            std::printf("  comm %lld B moved per rank (measured), %.0f B modelled (ring)\n",
                        measured, modelled);
          } else {
            std::printf("  comm %llu B handed to %s per rank, %.0f B modelled (ring)\n", payload,
                        o.backend.c_str(), modelled);
          }
        }
      }
      if (step == resumed + 1) first_loss = loss;
      last_loss = loss;
    }
    finish_saves(pending, flags, o, true, lead);  // the program does not exit before its commit
    if (lead) print_loop_time(o, loop_start, o.steps - resumed);
    if (lead) {
      progress.finish();
      std::printf("loss %.4f -> %.4f over %d steps\n", first_loss, last_loss, o.steps - resumed);
    }
    if (!o.save.empty()) {  // every rank writes its own elements into one file; nothing gathered
      const auto t0 = Clock::now();
      const std::uint64_t wrote =
          fw::save_gpt2_sharded(trainer.strategy(), w.rank(), flags, o.save);
      const double s = seconds_since(t0);
      if (lead) {
        std::printf("saved %s in %.3f s on %d ranks (rank 0 wrote %llu B of it)\n", o.save.c_str(),
                    s, n, static_cast<unsigned long long>(wrote));
      }
    }
    if (o.memory_report) {  // every rank's table, peaks of the whole run (save included)
      std::vector<fw::MemorySnapshot> mems;
      if constexpr (std::is_same_v<W, fw::LocalWorld>) {
        w.comm().barrier();
        for (const auto* m : memories) mems.push_back(m->snapshot());
      } else {
        mems = gather_memory(w, ctx);
      }
      if (lead) {
        for (const auto& m : mems) std::printf("%s", m.table().c_str());
      }
    }
    dp.barrier();  // no rank leaves (and tears down its communicator) while others still log
  };
  fw::launch<W>(o.ranks, rank_main, o.comm_options());
}

/// Calls `f.template operator()<Stage>()` with --zero as a compile-time stage.
template <class F>
void with_zero_stage(const Options& o, F&& f) {
  switch (o.zero) {
    case 0: return f.template operator()<0>();
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    default:
      throw fw::ConfigError(fw::detail::cat("fourway: --zero ", o.zero,
                                            " does not exist; use 0 (DataParallel), 1, 2 or 3"));
  }
}

template <class Target, class T, class W>
void train_stage(const Options& o) {
  with_zero_stage(o, [&]<int Stage>() { train_ranks<Target, T, Stage, W>(o); });
}

template <class Target, class T>
int train_tp_parallel(const Options& o);  // train_tp.hpp
template <class Target, class T>
int run_check(const Options& o);  // check_program.hpp (instantiated in train_check.cpp)

template <class Target, class T>
int train_parallel(const Options& o) {
  if (o.tp != 1 || o.sequence_parallel) return train_tp_parallel<Target, T>(o);
  check_output_dir("save", o.save);
  check_output_dir("log-json", o.log_json);
  fw::check<fw::ConfigError>(o.zero >= 0 && o.zero <= 3, "fourway: --zero ", o.zero,
                             " does not exist; use 0 (DataParallel), 1, 2 or 3");
  fw::check<fw::ConfigError>(o.bucket_mb >= 0.0f, "fourway: --bucket-mb must be >= 0, got ",
                             o.bucket_mb);
  fw::check<fw::ConfigError>(o.ranks >= 0, "fourway: --ranks must be >= 0, got ", o.ranks);
  if (o.local_world()) {
    Options local = o;
    local.ranks = o.ranks == 0 ? 1 : o.ranks;
    fw::check<fw::ConfigError>(o.dp == 0 || o.dp == local.ranks, "fourway: --dp ", o.dp,
                               " but there are ", local.ranks,
                               " ranks; fourway-train has no "
                               "tensor or pipeline axis yet, so --dp must equal --ranks (or be 0)");
    fw::check<fw::ConfigError>(
        o.batch % local.ranks == 0, "fourway: the global batch of B=", o.batch,
        " sequences does not split into ", local.ranks,
        " data-parallel ranks; use a --batch that is a multiple of ", local.ranks);
    train_stage<Target, T, fw::LocalWorld>(local);
    return 0;
  }
  // mpi or nccl: one process per rank, started by a launcher; the target says which it runs
  Target::launch_processes(o, [&]<class W>() { train_stage<Target, T, W>(o); });
  return 0;
}

}  // namespace fourway_train

#include "pipeline_program.hpp"  // NOLINT(misc-header-include-cycle): --pp, after the helpers

namespace fourway_train {

/// The whole program: parses the flags, trains, and turns every error into one line on stderr.
template <class Target>
int run_program(int argc, char** argv) {
  Options o;
  o.precision = Target::default_precision;
  auto parser = make_parser(o, Target::program);
  try {
    if (!parser.parse(argc, argv)) {
      std::fputs(parser.help().c_str(), stdout);
      return 0;
    }
  } catch (const fw::Error& e) {
    std::fprintf(stderr, "%s: %s\n", Target::program, e.what());
    return 2;
  }
  try {
    fw::check<fw::ConfigError>(o.vocab_align >= 0, "fourway: --vocab-align must be >= 0 (0: 128 ",
                               "on CUDA, 1 on the host), got ", o.vocab_align);
    if (o.vocab_align == 0) o.vocab_align = Target::backend::on_device ? 128 : 1;
    fw::check<fw::ConfigError>(!o.tf32 || Target::has_tf32, "fourway: --tf32 selects TF32 tensor ",
                               "cores for fourway-train-cuda's fp32 GEMMs; ", Target::program,
                               " computes fp32 GEMMs in fp32 (drop --tf32)");
    fw::check<fw::ConfigError>(!o.tf32 || o.precision == "fp32", "fourway: --tf32 changes fp32 ",
                               "GEMMs only, and --precision is ", o.precision,
                               "; drop --tf32 or use --precision fp32");
    fw::check<fw::ConfigError>(
        o.attention != "fused" || Target::has_fused_attention,
        "fourway: --attention fused selects fourway-train-cuda's tensor-core ", "kernels; ",
        Target::program, " runs the host flash attention (drop --attention)");
    fw::check<fw::ConfigError>(o.attention != "fused" || o.precision != "fp32",
                               "fourway: --attention fused runs in bf16 or fp16, and --precision ",
                               "is fp32; drop --attention fused or use --precision bf16");
    fw::check<fw::ConfigError>(o.classifier_chunk >= 0, "fourway: --classifier-chunk must be >= 0 ",
                               "(0: the whole logits at once), got ", o.classifier_chunk);
    fw::check<fw::ConfigError>(
        o.classifier_chunk == 0 || o.tp == 1, "fourway: --classifier-chunk ",
        "applies to the tied head of --tp 1; the vocabulary-parallel head of ", "--tp ", o.tp,
        " keeps its slice of the logits (drop --classifier-chunk)");
    Target::check_device();
    check_checkpoint_flags(o);
    fw::check<fw::ConfigError>(o.profile_step >= 0 && o.profile_step <= o.steps,
                               "fourway: --profile-step must be in [0, --steps] = [0, ", o.steps,
                               "], got ", o.profile_step);
    fw::check<fw::ConfigError>(o.profile_step == 0 || Target::has_profiler_window,
                               "fourway: --profile-step opens a CUDA profiler window; ",
                               Target::program, " has none (drop --profile-step)");
    check_positive("batch", o.batch);
    check_positive("seq", o.seq);
    fw::check<fw::ConfigError>(o.comm_timeout > 0.0 && o.comm_timeout <= 1e6,
                               "fourway: --comm-timeout must be in (0, 1e6] seconds, got ",
                               o.comm_timeout);
    fw::check<fw::ConfigError>(o.steps >= 0, "fourway: --steps must be >= 0, got ", o.steps);
    fw::check<fw::ConfigError>(o.heads >= 0, "fourway: --heads must be positive, got ", o.heads);
    if (o.check) {
      if constexpr (requires { Target::has_check; }) {
        if (o.precision == "bf16") return run_check<Target, fw::bf16>(o);
        if (o.precision == "fp16") return run_check<Target, fw::fp16>(o);
        return run_check<Target, float>(o);
      } else {
        throw fw::ConfigError("fourway: --check runs in the host build, fourway-train");
      }
    }
    if (o.pp > 1) {
      if (o.precision == "bf16") return train_pipeline<Target, fw::bf16>(o);
      if (o.precision == "fp16") return train_pipeline<Target, fw::fp16>(o);
      return train_pipeline<Target, float>(o);
    }
    fw::check<fw::ConfigError>(o.pp == 1, "fourway: --pp must be >= 1, got ", o.pp);
    if (o.parallel()) {
      if (o.precision == "bf16") return train_parallel<Target, fw::bf16>(o);
      if (o.precision == "fp16") return train_parallel<Target, fw::fp16>(o);
      return train_parallel<Target, float>(o);
    }
    if (o.precision == "bf16") return train<Target, fw::bf16>(o);
    if (o.precision == "fp16") return train<Target, fw::fp16>(o);
    return train<Target, float>(o);
  } catch (const fw::Error& e) {
    std::fprintf(stderr, "\n%s: %s\n", Target::program, e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "\n%s: out of host memory; lower --batch, --seq or the model size\n",
                 Target::program);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n%s: error: %s\n", Target::program, e.what());
  }
  return 1;
}

}  // namespace fourway_train

#include "train_tp.hpp"  // the --tp path, after everything it uses
