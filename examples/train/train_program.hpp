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
//       --backend mpi|nccl: calls fn.template operator()<W>() with the world kind it runs (the
//       flags were validated against `traits` first: validate.hpp refuses what it cannot run).
//   static constexpr TargetTraits traits;               what this build runs (options.hpp)
// Everything else, --backend local included, is this one code path. The flags, their checks and
// what each path honours are options.hpp and validate.hpp; `--dry-run` stops after them.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
#include "fourway/models/gpt2.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/optim/loss_scaler.hpp"
#include "fourway/optim/precision.hpp"
#include "fourway/plan/architecture.hpp"
#include "fourway/plan/step_time.hpp"
#include "fourway/tools/cli.hpp"
#include "fourway/tools/progress.hpp"
#include "fourway/train/corpus.hpp"
#include "fourway/train/holdings.hpp"
#include "fourway/train/log.hpp"
#include "fourway/train/resume.hpp"
#include "fourway/train/sharded_strategy.hpp"
#include "fourway/train/strategy.hpp"
#include "fourway/train/token_data.hpp"
#include "fourway/train/tokenizer.hpp"
#include "fourway/train/trainer.hpp"
#include "fourway/train/weights_save.hpp"
#include "options.hpp"
#include "validate.hpp"

namespace fourway_train {

using Clock = std::chrono::steady_clock;
/// Wall seconds since `t0`.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
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
    if constexpr (Target::traits.has_profiler_window) {
      if (open_) Target::profile(true);
    }
  }
  ProfileWindow(const ProfileWindow&) = delete;
  ProfileWindow& operator=(const ProfileWindow&) = delete;
  ~ProfileWindow() { close(); }
  void close() {
    if constexpr (Target::traits.has_profiler_window) {
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

/// --memory-report: every rank's per-tag table, peaks of the whole run, printed by the lead (a
/// collective over the world).
template <class B, class W>
void print_memory_report(const Options& o, fw::World<W>& w, const fw::Context<B>& ctx, bool lead) {
  if (!o.memory_report) return;
  const std::vector<fw::MemorySnapshot> mems = gather_memory(w, ctx);
  if (lead) {
    for (const auto& m : mems) std::printf("%s", m.table().c_str());
  }
}

/// --attention fused / cudnn (fourway-train-cuda): the lead rank says which attention the layers
/// run, the fused kernels, cuDNN's graph or the blockwise path and why (Target::attention_note).
template <class Target, class B>
void print_attention(const fw::Context<B>& ctx, const Options& o, const fw::models::GptConfig& cfg,
                     bool lead) {
  if constexpr (Target::traits.has_fused_attention) {
    if (lead && (o.attention == "fused" || o.attention == "cudnn")) {
      std::printf("attention: %s\n", Target::attention_note(ctx, o, cfg).c_str());
    }
  } else {
    (void)ctx, (void)o, (void)cfg, (void)lead;
  }
}

/// --micro-batches: gradient accumulation over M micro-batches per step; --cuda-graph on a
/// one-rank run (`on_device`: auto captures where the step allows it).
inline fw::TrainerOptions trainer_options(const Options& o, bool on_device = false) {
  fw::TrainerOptions t;
  t.micro_batches = o.micro_batches;
  if (run_path(o) == Path::single) {
    t.capture = o.cuda_graph == "on"                  ? fw::StepCapture::on
                : o.cuda_graph == "auto" && on_device ? fw::StepCapture::when_possible
                                                      : fw::StepCapture::off;
  }
  return t;
}

/// The step capture's outcome, once the run is over: how often the step was captured and
/// replayed, or why it was not (nothing when it was never asked for).
template <class Trainer>
void print_capture(const Trainer& trainer, int steps) {
  if (trainer.capture() != fw::StepCapture::off) {
    std::printf("cuda graph: %ld capture%s, %ld of %d steps replayed\n", trainer.captures(),
                trainer.captures() == 1 ? "" : "s", trainer.replays(), steps);
  } else if (!trainer.capture_note().empty()) {
    std::printf("cuda graph: %s\n", trainer.capture_note().c_str());
  }
}

/// What a step's line reports beside its loss: the tokens and model FLOPs of one step, the peak
/// FLOP/s of the devices the run computes on (0: unknown, no MFU), and the device memory in use.
struct StepMeter {
  double tokens_per_step = 0;
  double model_flops_per_step = 0;  // the planner's formula (plan/step_time.hpp), no recomputation
  double peak_flops = 0;            // FLOP/s of all the devices together
  double (*device_memory)() = nullptr;  // bytes in use on this rank's GPU; null: none
};

/// The meter of a run of `cfg` on `ranks` ranks (on `Target::devices(o, ranks)` devices): model
/// FLOPs per token as the planner counts them (6 per parameter of the blocks and the LM head,
/// 12·L·T·C for attention; recomputation is not model FLOPs), times B·T; the peak from
/// --peak-tflops, else the target's figure for its device (`Target::peak_tflops`, 0 when it does
/// not know one).
template <class Target>
StepMeter step_meter(const Options& o, const fw::models::GptConfig& cfg, int ranks) {
  StepMeter m;
  m.tokens_per_step = static_cast<double>(o.batch) * o.seq;
  const auto arch = fw::plan::gpt2_shape(cfg.layers, cfg.dim, cfg.heads, cfg.vocab, o.seq);
  m.model_flops_per_step = fw::plan::flops_per_token(arch) * m.tokens_per_step;
  const double per_device = o.peak_tflops > 0 ? o.peak_tflops : Target::peak_tflops(o);
  m.peak_flops = per_device * 1e12 * Target::devices(o, ranks);
  m.device_memory = Target::device_memory_in_use;
  return m;
}

/// One step's line of the progress display and the JSON log.
inline fw::StepRecord step_record(int step, float loss, const fw::StepReport& rep, double ms,
                                  const StepMeter& meter, float lr) {
  fw::StepRecord r;
  r.step = step;
  r.loss = loss;
  r.grad_norm = rep.grad_norm;
  r.step_ms = ms;
  r.tokens_per_s = meter.tokens_per_step / (ms / 1000.0);
  r.lr = lr;
  r.skipped = rep.skipped;
  r.model_flops = meter.model_flops_per_step;
  if (meter.peak_flops > 0) r.mfu = meter.model_flops_per_step / (ms / 1000.0) / meter.peak_flops;
  if (meter.device_memory != nullptr) r.device_memory_bytes = meter.device_memory();
  return r;
}

/// Whether step `step` of a run ending at `last` is one of every `every` steps (0: none) or the
/// last: when --eval-every and --sample-every act.
inline bool due_after(int step, int last, int every) {
  return step == last || (every > 0 && step % every == 0);
}
/// "every N steps and after the last" or "after the last step", as the start-up lines say it.
inline std::string cadence_text(int every) {
  return every > 0 ? fw::detail::cat("every ", every, " steps and after the last")
                   : std::string("after the last step");
}

/// --val-data: the first K batches of the validation file, read once so that every evaluation
/// sees the same tokens, evaluated every --eval-every steps and after the last step on the mesh
/// as it stands (`Trainer::evaluate`: forward only, the ranks' losses summed like the training
/// loss's, so every mesh reports the one-rank figure). Every rank makes the same calls.
class Validation {
 public:
  Validation(const Options& o, std::int64_t vocab, bool lead) : every_(o.eval_every) {
    if (o.val_data.empty()) return;
    const fw::TokenData data = fw::TokenData::read(o.val_data);
    fw::TokenLoader loader(data, o.batch, o.seq, vocab);
    const std::int64_t have = loader.batches_per_epoch();
    const std::int64_t k = o.eval_batches > 0 ? o.eval_batches : std::min<std::int64_t>(20, have);
    fw::check<fw::ConfigError>(k <= have, "fourway: --eval-batches ", k, " but --val-data ",
                               o.val_data, " holds ", have, " batches of ", o.batch, " x ", o.seq,
                               " tokens; lower --eval-batches or give a longer file");
    for (std::int64_t i = 0; i < k; ++i) batches_.push_back(loader.next());
    if (lead) {
      std::printf("validation %s: %zu tokens, the first %lld batches of %d x %d, %s\n",
                  data.source().c_str(), data.size(), static_cast<long long>(k), o.batch, o.seq,
                  cadence_text(every_).c_str());
    }
  }
  [[nodiscard]] bool on() const { return !batches_.empty(); }
  /// After step `step` of a run that ends at `last`, sets `r.val_loss` when an evaluation is due.
  template <class TrainerT>
  void after_step(TrainerT& trainer, int step, int last, fw::StepRecord& r) {
    if (!on() || !due_after(step, last, every_)) return;
    r.val_loss = evaluate(trainer);
  }
  /// The run's line about validation (by `lead`), after evaluating the weights as they are when
  /// no step ran (--steps 0, or a checkpoint already at --steps).
  template <class TrainerT>
  void finish(TrainerT& trainer, bool lead) {
    if (!on()) return;
    if (losses_.empty()) (void)evaluate(trainer);
    if (!lead) return;
    if (losses_.size() == 1) {
      std::printf("val loss %.4f over %zu batches\n", losses_.front(), batches_.size());
    } else {
      std::printf("val loss %.4f -> %.4f over %zu evaluations of %zu batches\n", losses_.front(),
                  losses_.back(), losses_.size(), batches_.size());
    }
  }

 private:
  template <class TrainerT>
  double evaluate(TrainerT& trainer) {
    double sum = 0.0;
    for (const auto& b : batches_)
      sum += trainer.evaluate(fw::Batch{b.inputs, b.targets, b.B, b.T});
    losses_.push_back(sum / static_cast<double>(batches_.size()));
    return losses_.back();
  }

  int every_ = 0;
  std::vector<fw::SequenceBatch> batches_;
  std::vector<double> losses_;
};

/// --sample-tokens: text generated from the model as the mesh holds it (`Trainer::generate`, a
/// KV cache, one token per step) after the last step and every --sample-every steps, from
/// --prompt, decoded by the tokenizer (--tokenizer; else Hugging Face's files beside
/// --init-from; else byte ids when the vocabulary is at most 256). Every rank generates (ZeRO-3
/// gathers unit by unit); the lead prints.
class Sampler {
 public:
  Sampler(const Options& o, const fw::models::GptConfig& cfg, bool lead) : every_(o.sample_every) {
    if (o.sample_tokens == 0) return;
    opts_.tokens = o.sample_tokens;
    opts_.temperature = o.temperature;
    opts_.top_k = o.top_k;
    opts_.seed = o.sample_seed;
    std::filesystem::path dir = o.tokenizer;
    if (o.tokenizer.empty() && !o.init_from.empty()) {
      const auto beside = std::filesystem::absolute(o.init_from).parent_path();
      std::error_code ec;
      if (std::filesystem::exists(beside / "tokenizer.json", ec) ||
          (std::filesystem::exists(beside / "vocab.json", ec) &&
           std::filesystem::exists(beside / "merges.txt", ec)))
        dir = beside;
    }
    if (o.tokenizer == "bytes" || (dir.empty() && cfg.vocab <= 256)) {
      fw::check<fw::ConfigError>(cfg.vocab <= 256, "fourway: --tokenizer bytes decodes ids below ",
                                 "256 and the model's vocabulary is ", cfg.vocab,
                                 "; give the model's tokenizer (--tokenizer DIR)");
      source_ = "byte ids";
      for (const unsigned char c : o.prompt) prompt_.push_back(c);
      if (prompt_.empty()) prompt_.push_back('\n');
    } else {
      fw::check<fw::ConfigError>(!dir.empty(), "fourway: --sample-tokens decodes the samples to ",
                                 "text and no tokenizer was found for a vocabulary of ", cfg.vocab,
                                 ": give --tokenizer DIR (Hugging Face's tokenizer.json, or "
                                 "vocab.json + merges.txt)");
      tokenizer_ = fw::Tokenizer::load(dir);
      source_ = tokenizer_->source();
      fw::check<fw::ConfigError>(tokenizer_->vocab_size() <= cfg.vocab, "fourway: the tokenizer ",
                                 source_, " has ", tokenizer_->vocab_size(),
                                 " ids and the model's vocabulary is ", cfg.vocab,
                                 "; give the tokenizer the model was trained with");
      prompt_ = tokenizer_->encode(o.prompt);
      if (prompt_.empty()) {
        const std::int32_t eot = tokenizer_->special_id("<|endoftext|>");
        fw::check<fw::ConfigError>(eot >= 0, "fourway: an empty --prompt starts from ",
                                   "<|endoftext|>, which ", source_,
                                   " does not have; give --prompt");
        prompt_.push_back(eot);
      }
    }
    const auto n = static_cast<std::int64_t>(prompt_.size());
    fw::check<fw::ConfigError>(n + o.sample_tokens <= cfg.max_seq, "fourway: the prompt is ", n,
                               " tokens and --sample-tokens ", o.sample_tokens, ": ",
                               n + o.sample_tokens, " exceed the model's context of ", cfg.max_seq,
                               " tokens; shorten --prompt or lower --sample-tokens");
    if (lead) {
      std::printf("samples: %d tokens %s, %s, prompt of %lld tokens, decoded with %s\n",
                  o.sample_tokens, cadence_text(every_).c_str(),
                  o.temperature == 0.0f ? "greedy"
                                        : fw::detail::cat("temperature ", o.temperature, ", top-k ",
                                                          o.top_k, ", seed ", o.sample_seed)
                                              .c_str(),
                  static_cast<long long>(n), source_.c_str());
    }
  }
  /// After step `step` of a run that ends at `last`: a sample into `r.sample` when one is due.
  template <class TrainerT>
  void after_step(TrainerT& trainer, int step, int last, fw::StepRecord& r, bool lead) {
    if (opts_.tokens == 0 || !due_after(step, last, every_)) return;
    r.sample = sample(trainer, step, lead);
  }
  /// When no step ran, one sample of the weights as loaded.
  template <class TrainerT>
  void finish(TrainerT& trainer, bool lead) {
    if (opts_.tokens > 0 && !sampled_) (void)sample(trainer, 0, lead);
  }

 private:
  template <class TrainerT>
  std::string sample(TrainerT& trainer, int step, bool lead) {
    std::vector<std::int32_t> ids;
    if constexpr (requires { trainer.generate(prompt_, opts_); }) {
      ids = trainer.generate(prompt_, opts_);
    } else {
      throw fw::ConfigError("fourway: this mesh does not generate samples (validate.hpp)");
    }
    sampled_ = true;
    std::string text;
    if (tokenizer_) {
      text = tokenizer_->decode(ids);
    } else {
      for (const std::int32_t id : ids) text += static_cast<char>(id);
    }
    if (lead) {
      std::printf("sample after step %d: %s\n", step, fw::detail::json_string(text).c_str());
    }
    return text;
  }

  int every_ = 0;
  fw::SampleOptions opts_{.tokens = 0};
  std::optional<fw::Tokenizer> tokenizer_;
  std::string source_;
  std::vector<std::int32_t> prompt_;
  bool sampled_ = false;
};

/// The JSON log of --log-json, opened (truncated) by the rank that writes it.
inline std::ofstream open_log(const std::string& path) {
  std::ofstream log(path, std::ios::trunc);
  fw::check<fw::ConfigError>(log.good(), "fourway: cannot create the log file ", path);
  return log;
}

/// The run's last line about training: the first and last loss, or that no step ran (--steps 0,
/// or a checkpoint already at --steps), never a loss of steps that did not happen.
inline void print_losses(const Options& o, double first, double last, int run) {
  if (run > 0) {
    std::printf("loss %.4f -> %.4f over %d steps\n", first, last, run);
  } else if (o.steps == 0) {
    std::printf("no step run (--steps 0)\n");
  } else {
    std::printf("no step run: %s is at step %d = --steps\n", o.resume.c_str(), o.steps);
  }
}

/// --save: Hugging Face's config.json beside the weights (n_layer, n_embd, n_head, vocab_size,
/// n_positions, ...), so `GPT2LMHeadModel.from_pretrained` rebuilds this shape and `--init-from`
/// reads the head count back. The lead rank writes it.
template <class T>
void save_config(const Options& o, const fw::models::GptConfig& cfg, bool lead) {
  if (o.save.empty() || !lead) return;
  const auto path = fw::write_gpt2_config(o.save, cfg, fw::torch_dtype_name<T>());
  std::printf("  %s: n_layer %d, n_embd %d, n_head %d, vocab_size %d, n_positions %d\n",
              path.string().c_str(), cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq);
}

/// --save on a mesh: every rank writes the elements it owns into one Hugging Face file, nothing
/// gathered (train/weights_save.hpp), then config.json. A collective of the whole mesh; the lead
/// says how the file's bytes were shared out (every rank's count, over `flags`).
template <class T, class Strategy>
void save_weights(Strategy& s, const fw::models::GptConfig& cfg, int rank,
                  const fw::FlagGather& flags, const Options& o) {
  if (o.save.empty()) return;
  const auto t0 = Clock::now();
  const std::uint64_t wrote = fw::save_gpt2_sharded(s, cfg, rank, flags, o.save);
  const double secs = seconds_since(t0);
  const std::vector<std::int64_t> all = flags(static_cast<std::int64_t>(wrote));
  if (rank == 0) {
    std::printf("saved %s in %.3f s on %zu ranks, each writing what it owns (B per rank:",
                o.save.c_str(), secs, all.size());
    for (const std::int64_t b : all) std::printf(" %lld", static_cast<long long>(b));
    std::printf(")\n");
  }
  save_config<T>(o, cfg, rank == 0);
}

template <class Target, class T>
int train(const Options& o) {
  using B = typename Target::backend;
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
              o.precision.c_str(), recomputation_text(o));

  // ---- optimizer ------------------------------------------------------------------------------
  using P = fw::Precision<T>;
  fw::Trainer<fw::SingleRank<Model, P, B>> trainer(trainer_options(o, Target::traits.on_device),
                                                   ctx, model, make_adamw(o));
  const fw::FlagGather alone = [](std::int64_t mine) { return std::vector<std::int64_t>{mine}; };
  const int resumed = resume_run(trainer, alone, o, loader, true);
  fw::AsyncStateSave pending;  // --save-async

  fw::JsonLog log;
  if (!o.log_json.empty()) log = fw::JsonLog(o.log_json);
  fw::tools::Progress progress(o.steps);
  if (o.quiet) progress = fw::tools::Progress(o.steps, false, nullptr);

  const StepMeter meter = step_meter<Target>(o, cfg, 1);
  Validation val(o, cfg.vocab, true);
  Sampler sampler(o, cfg, true);
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

    fw::StepRecord r = step_record(step, loss, rep, ms, meter, lr);
    val.after_step(trainer, step, o.steps, r);
    sampler.after_step(trainer, step, o.steps, r, true);
    log.write(r, {&memory});
    if (!o.quiet) progress.update(r);
    if (step == resumed + 1) first_loss = loss;
    last_loss = loss;
    save_if_due(trainer, pending, 0, 1, alone, o, loader, step, true);
    finish_saves(pending, alone, o, false, true);
  }
  finish_saves(pending, alone, o, true, true);
  print_loop_time(o, loop_start, o.steps - resumed);
  print_capture(trainer, o.steps - resumed);
  progress.finish();
  print_losses(o, first_loss, last_loss, o.steps - resumed);
  val.finish(trainer, true);
  sampler.finish(trainer, true);
  if (!o.save.empty()) {
    fw::save_gpt2(ctx, model, o.save);
    std::printf("saved %s\n", o.save.c_str());
    save_config<T>(o, cfg, true);
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

/// Whether the target isolates every rank (`Target::skip_collectives`): the fault of the negative
/// control in tests/parallel/mpi_train_matches_local.cmake, built into a test program
/// (tests/parallel/train_skip_collectives.cpp) and never into fourway-train: each rank is alone
/// in its data-parallel group and trains on its share of each batch, making no collective with
/// its peers.
template <class Target>
constexpr bool skip_collectives() {
  if constexpr (requires { Target::skip_collectives; }) {
    return Target::skip_collectives;
  } else {
    return false;
  }
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
                               " ranks; without --tp or --pp --dp must equal the number of ranks "
                               "(or be 0)");
    fw::Context<B> ctx = Target::context(w.memory(), rank_device(w), o);
    bind_world(w, ctx);
    apply_memory_options<Target>(o, w.memory(), rank_device(w));
    constexpr bool isolated = skip_collectives<Target>();
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
                  recomputation_text(o));
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
    const StepMeter meter = step_meter<Target>(o, cfg, n);
    Validation val(o, cfg.vocab, lead);
    Sampler sampler(o, cfg, lead);
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
      fw::StepRecord r = step_record(step, loss, trainer.last_report(), ms, meter, lr);
      val.after_step(trainer, step, o.steps, r);
      sampler.after_step(trainer, step, o.steps, r, lead);
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
      print_losses(o, first_loss, last_loss, o.steps - resumed);
    }
    val.finish(trainer, lead);
    sampler.finish(trainer, lead);
    save_weights<T>(trainer.strategy(), cfg, w.rank(), flags, o);
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
  if (o.local_world()) {
    train_stage<Target, T, fw::LocalWorld>(o);  // validate: --ranks is set, --dp agrees with it
    return 0;
  }
  // mpi or nccl: one process per rank, started by a launcher; the target says which it runs
  Target::launch_processes(o, [&]<class W>() { train_stage<Target, T, W>(o); });
  return 0;
}

}  // namespace fourway_train

#include "pipeline_program.hpp"  // NOLINT(misc-header-include-cycle): --pp, after the helpers

namespace fourway_train {

/// Parses and validates the flags (validate.hpp), prints what would run under --dry-run, and
/// otherwise calls `run(o)`; every error becomes one line on stderr (exit status 2 for flags
/// that do not parse, 1 otherwise).
template <class Target, class Run>
int run_with(int argc, char** argv, Run&& run) {
  constexpr const TargetTraits& t = Target::traits;
  Options o;
  o.precision = t.default_precision;
  auto parser = make_parser(o, t.program);
  try {
    if (!parser.parse(argc, argv)) {
      std::fputs(parser.help().c_str(), stdout);
      return 0;
    }
  } catch (const fw::Error& e) {
    std::fprintf(stderr, "%s: %s\n", t.program, e.what());
    return 2;
  }
  try {
    o.given = given_flags(parser);
    const fw::models::GptConfig cfg = validate(o, t);
    if (o.dry_run) {
      std::fputs(describe(o, t, cfg).c_str(), stdout);
      return 0;
    }
    Target::check_device();
    return run(o);
  } catch (const fw::Error& e) {
    std::fprintf(stderr, "\n%s: %s\n", t.program, e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "\n%s: out of host memory; lower --batch, --seq or the model size\n",
                 t.program);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n%s: error: %s\n", t.program, e.what());
  }
  return 1;
}

/// Runs validated flags on the path `run_path` names, in the working precision.
template <class Target>
int dispatch(const Options& o) {
  const auto in_precision = [&](auto&& f) {
    if (o.precision == "bf16") return f.template operator()<fw::bf16>();
    if (o.precision == "fp16") return f.template operator()<fw::fp16>();
    return f.template operator()<float>();
  };
  switch (run_path(o)) {
    case Path::check:
      if constexpr (Target::traits.has_check) {
        return in_precision([&]<class T>() { return run_check<Target, T>(o); });
      } else {
        throw fw::ConfigError("fourway: --check runs in the host build, fourway-train");
      }
    case Path::pipeline:
      return in_precision([&]<class T>() { return train_pipeline<Target, T>(o); });
    case Path::data_parallel:
    case Path::tensor_parallel:
      return in_precision([&]<class T>() { return train_parallel<Target, T>(o); });
    case Path::single: break;
  }
  return in_precision([&]<class T>() { return train<Target, T>(o); });
}

/// The whole program: parses and checks the flags, trains, and turns every error into one line
/// on stderr.
template <class Target>
int run_program(int argc, char** argv) {
  return run_with<Target>(argc, argv, [](const Options& o) { return dispatch<Target>(o); });
}

}  // namespace fourway_train

#include "train_tp.hpp"  // the --tp path, after everything it uses
