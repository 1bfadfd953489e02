//! fourway-train's flags checked together before anything runs: `validate` refuses every flag the
//! run would ignore and every combination it cannot honour, with a `ConfigError` naming the flag
//! and what it needs, and fills in what the flags leave open (ranks, micro-batches, the
//! vocabulary alignment); `run_path` says which of the program's paths runs them, and
//! `describe` what that path will do with each flag (`--dry-run` prints it). Nothing is built:
//! with `--init-from` only the file's header and the `config.json` beside it are read.
//!
//! Which path honours which flag (anything else given is refused by `validate`):
//!   - every path: the model, data, batch, steps, optimizer, precision, memory cap and block cache;
//!   - single (one rank): no communicator, so no mesh flag and no --comm-timeout; the only path
//!     whose step is captured in a CUDA graph (--cuda-graph on is refused elsewhere);
//!   - dp and tp: the mesh (--ranks, --backend, --comm-timeout, --dp, --zero, --tp); --bucket-mb
//!     and --no-overlap only where there is more than one replica;
//!   - pipeline: the mesh with --pp, and --schedule, --virtual-stages, --trace; no buckets (the
//!     replicas reduce once after the last micro-batch);
//!   - every path but check: the outputs (--log-json, --save, --save-dir, --resume,
//!     --memory-report, --quiet, --peak-tflops) and the validation (--val-data, --eval-every,
//!     --eval-batches) and the samples (--sample-tokens and the flags that shape them);
//!   - check: the mesh and the pipeline flags but not --trace, and no output (it compares).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/core/error.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/optim/adamw.hpp"
#include "fourway/schedule/generators.hpp"
#include "fourway/train/resume.hpp"
#include "options.hpp"

namespace fourway_train {

/// What --checkpoint-activations asked for, as the programs print it.
inline const char* recomputation_text(const Options& o) {
  if (o.checkpoint_activations == "full") return "activation checkpointing";
  if (o.checkpoint_activations == "selective") return "selective recomputation";
  return "no checkpointing";
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

/// --save-dir, --save-every, --keep, --save-async: they work only together.
inline void check_checkpoint_flags(const Options& o) {
  fw::check<fw::ConfigError>(o.save_every >= 0 && o.keep >= 0, "fourway: --save-every (",
                             o.save_every, ") and --keep (", o.keep, ") must be >= 0");
  fw::check<fw::ConfigError>(!o.save_dir.empty() || (o.save_every == 0 && o.keep == 0),
                             "fourway: --save-every and --keep need --save-dir DIR");
  fw::check<fw::ConfigError>(!o.save_dir.empty() || !o.save_async,
                             "fourway: --save-async needs --save-dir DIR (it writes the "
                             "checkpoints of --save-every in the background)");
}

inline fw::schedule::Kind schedule_kind(const std::string& s) {
  using K = fw::schedule::Kind;
  for (K k : {K::gpipe, K::one_f_one_b, K::interleaved, K::zb_h1, K::zb_v})
    if (fw::schedule::kind_name(k) == s) return k;
  throw fw::ConfigError(fw::detail::cat("fourway: --schedule ", s,
                                        " does not exist; use gpipe, 1f1b, interleaved, zb-h1 "
                                        "or zb-v"));
}

/// --virtual-stages, or what the schedule runs without it (interleaved and zb-v: 2 chunks).
inline int virtual_stages(const Options& o) {
  if (o.virtual_stages > 0) return o.virtual_stages;
  const auto k = schedule_kind(o.schedule);
  return k == fw::schedule::Kind::interleaved || k == fw::schedule::Kind::zb_v ? 2 : 1;
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

/// A flag that sets the shape of a random model, given with --init-from, must say what the
/// checkpoint says: it is then a check, not a second opinion.
inline void check_shape_flag(const Options& o, const char* flag, long long given, long long file,
                             const char* what) {
  fw::check<fw::ConfigError>(!o.was_given(flag) || given == file, "fourway: --", flag, " ", given,
                             " but ", o.init_from, " has ", what, " ", file,
                             "; the checkpoint gives the model's shape (drop --", flag, ")");
}

/// The model's shape, from a checkpoint (opened into `ckpt`: only its header is read) and the
/// `config.json` beside it, or from the flags. With `print` the lead says where each number came
/// from. Refuses a flag that contradicts the checkpoint or its config.json, and a config.json
/// that contradicts the tensors.
inline fw::models::GptConfig model_config(const Options& o,
                                          std::optional<fw::SafetensorsReader>& ckpt, bool print) {
  fw::models::GptConfig cfg;
  if (!o.init_from.empty()) {
    ckpt = fw::SafetensorsReader::open(o.init_from);
    const auto info = fw::inspect_gpt2(*ckpt);
    const auto json = fw::read_gpt2_config(o.init_from);
    if (json) fw::check_gpt2_config(info, *json, o.init_from);
    check_shape_flag(o, "layers", o.layers, info.layers, "blocks:");
    check_shape_flag(o, "dim", o.dim, info.dim, "width");
    check_shape_flag(o, "vocab", o.vocab, info.vocab, "vocabulary");
    const int json_heads = json ? json->n_head : 0;
    fw::check<fw::ConfigError>(
        o.heads == 0 || json_heads == 0 || o.heads == json_heads, "fourway: --heads ", o.heads,
        " but ", json ? json->path.string() : std::string(), " says n_head ", json_heads,
        "; drop --heads (config.json gives it) or correct ", "config.json");
    cfg = info.config(o.heads != 0 ? o.heads : json_heads);
    if (print) {
      std::printf("checkpoint %s: %d layers, width %d, %d heads, vocab %d, context %d%s\n",
                  o.init_from.c_str(), cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.max_seq,
                  info.prefix.empty() ? "" : " (names prefixed transformer.)");
      if (json && o.heads == 0) {
        std::printf("  heads from %s (n_head %d)\n", json->path.string().c_str(), json_heads);
      } else if (!json && o.heads == 0) {
        std::printf(
            "  heads: %d = width %d / 64, GPT-2's head size: no config.json beside the "
            "weights; give --heads for another head count\n",
            cfg.heads, cfg.dim);
      }
      for (const auto& n : info.ignored) std::printf("  ignoring buffer %s\n", n.c_str());
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
  cfg.checkpoint = o.checkpoint_activations == "full";
  cfg.selective = o.checkpoint_activations == "selective";
  cfg.classifier_chunk = o.classifier_chunk;
  // the tensor-parallel model pads its vocabulary slices itself (tp::TpOptions)
  cfg.vocab_alignment = o.tp > 1 ? 1 : std::max(o.vocab_align, 1);
  return cfg;
}

/// The paths of the program (train_program.hpp, train_tp.hpp, pipeline_program.hpp,
/// check_program.hpp).
enum class Path : std::uint8_t { single, data_parallel, tensor_parallel, pipeline, check };

inline Path run_path(const Options& o) {
  if (o.check) return Path::check;
  if (o.pp > 1 || o.cp > 1) return Path::pipeline;  // the mesh path (a cp mesh: 1 stage or more)
  if (o.tp > 1 || o.sequence_parallel) return Path::tensor_parallel;
  if (o.parallel()) return Path::data_parallel;
  return Path::single;
}

/// The data-parallel replicas of a validated run (0: the launcher decides, --backend mpi|nccl
/// without --ranks).
inline int replicas(const Options& o) {
  return o.ranks == 0 ? 0 : o.ranks / (std::max(o.tp, 1) * std::max(o.cp, 1) * std::max(o.pp, 1));
}

namespace detail {

/// A flag `path` would ignore, refused: `flag` needs `what`.
inline void refuse_unless(bool ok, const Options& o, const char* flag, const std::string& why) {
  fw::check<fw::ConfigError>(!o.was_given(flag) || ok, "fourway: --", flag, " ", why);
}

/// --backend: what this build runs.
inline void check_backend(const Options& o, const TargetTraits& t) {
  // --check's backend first (its only check of it): its refusal says what works, whatever this
  // build links
  fw::check<fw::ConfigError>(!o.check || o.local_world(),
                             "fourway: --check runs the mesh on LocalWorld threads (--backend "
                             "local or strict, the same algorithms); drop --backend ",
                             o.backend);
  if (o.backend == "nccl") {
    fw::check<fw::ConfigError>(t.on_device,
                               "fourway: --backend nccl needs the CUDA build, fourway-train-cuda "
                               "(GPU tensors, one process per GPU under mpirun, torchrun or srun); "
                               "this host build runs --backend local, strict or mpi");
    fw::check<fw::ConfigError>(t.has_nccl, "fourway: --backend nccl, but ", t.program,
                               " was built without NCCL; install it (libnccl-dev) and reconfigure, "
                               "or use --backend local");
  }
  if (o.backend == "mpi") {
    fw::check<fw::ConfigError>(!t.on_device,
                               "fourway: --backend mpi moves host memory and fourway-train-cuda "
                               "keeps its tensors on the GPU; use --backend nccl (one process per "
                               "GPU, started by mpirun, torchrun or srun), --backend local (all "
                               "ranks on one GPU), or the host fourway-train for --backend mpi");
    fw::check<fw::ConfigError>(t.has_mpi, "fourway: --backend mpi, but ", t.program,
                               " was built without MPI; install Open MPI and reconfigure");
  }
}

/// --val-data, --eval-every, --eval-batches: the last two need the first.
inline void check_validation_flags(const Options& o) {
  fw::check<fw::ConfigError>(o.eval_every >= 0, "fourway: --eval-every must be >= 0 (0: after ",
                             "the last step only), got ", o.eval_every);
  fw::check<fw::ConfigError>(o.eval_batches >= 0, "fourway: --eval-batches must be >= 0 (0: up ",
                             "to 20), got ", o.eval_batches);
  for (const char* flag : {"eval-every", "eval-batches"}) {
    fw::check<fw::ConfigError>(!o.was_given(flag) || !o.val_data.empty(), "fourway: --", flag,
                               " evaluates on a validation file; give --val-data FILE (an llm.c "
                               "token file, e.g. from fourway-data encode)");
  }
  std::error_code ec;
  fw::check<fw::ConfigError>(o.val_data.empty() || std::filesystem::is_regular_file(o.val_data, ec),
                             "fourway: --val-data ", o.val_data, ": no such regular file");
}

/// --sample-tokens and the flags that shape the samples (which need it).
inline void check_sample_flags(const Options& o) {
  fw::check<fw::ConfigError>(o.sample_tokens >= 0, "fourway: --sample-tokens must be >= 0 (0: no ",
                             "samples), got ", o.sample_tokens);
  fw::check<fw::ConfigError>(o.sample_every >= 0, "fourway: --sample-every must be >= 0, got ",
                             o.sample_every);
  fw::check<fw::ConfigError>(o.top_k >= 0, "fourway: --top-k must be >= 0 (0: all), got ", o.top_k);
  fw::check<fw::ConfigError>(o.temperature >= 0.0f && std::isfinite(o.temperature),
                             "fourway: --temperature must be >= 0 (0: greedy), got ",
                             o.temperature);
  for (const char* flag :
       {"sample-every", "prompt", "temperature", "top-k", "sample-seed", "tokenizer"}) {
    fw::check<fw::ConfigError>(!o.was_given(flag) || o.sample_tokens > 0, "fourway: --", flag,
                               " shapes the samples; give --sample-tokens K (the tokens of each "
                               "sample)");
  }
  if (o.sample_tokens == 0) return;
  std::error_code ec;
  fw::check<fw::ConfigError>(
      o.tokenizer.empty() || o.tokenizer == "bytes" || std::filesystem::exists(o.tokenizer, ec),
      "fourway: --tokenizer ", o.tokenizer,
      ": no such file or folder (give Hugging Face's tokenizer files, or "
      "bytes)");
}

/// Values one flag at a time.
inline void check_values(Options& o, const TargetTraits& t) {
  fw::check<fw::ConfigError>(o.vocab_align >= 0, "fourway: --vocab-align must be >= 0 (0: 128 ",
                             "on CUDA, 1 on the host), got ", o.vocab_align);
  if (o.vocab_align == 0) o.vocab_align = t.on_device ? 128 : 1;
  fw::check<fw::ConfigError>(!o.tf32 || t.has_tf32, "fourway: --tf32 selects TF32 tensor ",
                             "cores for fourway-train-cuda's fp32 GEMMs; ", t.program,
                             " computes fp32 GEMMs in fp32 (drop --tf32)");
  fw::check<fw::ConfigError>(!o.tf32 || o.precision == "fp32", "fourway: --tf32 changes fp32 ",
                             "GEMMs only, and --precision is ", o.precision,
                             "; drop --tf32 or use --precision fp32");
  fw::check<fw::ConfigError>(o.attention != "fused" || t.has_fused_attention,
                             "fourway: --attention fused selects fourway-train-cuda's tensor-core ",
                             "kernels; ", t.program,
                             " runs the host flash attention (drop --attention)");
  fw::check<fw::ConfigError>(o.attention != "cudnn" || t.has_cudnn_attention,
                             "fourway: --attention cudnn needs a ", t.program, " built with the ",
                             "cuDNN component (fourway::cudnn: cuDNN 9 and the cudnn-frontend ",
                             "headers; configure's 'cuDNN attention' line says why it is off); ",
                             "drop --attention or use --attention fused");
  fw::check<fw::ConfigError>(
      (o.attention != "fused" && o.attention != "cudnn") || o.precision != "fp32",
      "fourway: --attention ", o.attention, " runs in bf16 or fp16, and ",
      "--precision is fp32; drop --attention ", o.attention, " or use --precision bf16");
  fw::check<fw::ConfigError>(o.classifier_chunk >= 0, "fourway: --classifier-chunk must be >= 0 ",
                             "(0: the whole logits at once), got ", o.classifier_chunk);
  check_checkpoint_flags(o);
  fw::check<fw::ConfigError>(o.cuda_graph != "on" || run_path(o) == Path::single,
                             "fourway: --cuda-graph on captures a one-rank step; a mesh's steps ",
                             "(--ranks, --tp, --pp, --cp, --check) run collectives between their ",
                             "kernels and are not captured: use --cuda-graph auto or off");
  fw::check<fw::ConfigError>(o.cuda_graph != "on" || o.block_cache != "off",
                             "fourway: --cuda-graph on needs the block cache (a captured step ",
                             "may not allocate, and --block-cache off allocates every tensor); ",
                             "drop --block-cache off or use --cuda-graph auto or off");
  fw::check<fw::ConfigError>(o.profile_step >= 0 && o.profile_step <= o.steps,
                             "fourway: --profile-step must be in [0, --steps] = [0, ", o.steps,
                             "], got ", o.profile_step);
  fw::check<fw::ConfigError>(o.profile_step == 0 || t.has_profiler_window,
                             "fourway: --profile-step opens a CUDA profiler window; ", t.program,
                             " has none (drop --profile-step)");
  check_positive("batch", o.batch);
  check_positive("seq", o.seq);
  fw::check<fw::ConfigError>(o.comm_timeout > 0.0 && o.comm_timeout <= 1e6,
                             "fourway: --comm-timeout must be in (0, 1e6] seconds, got ",
                             o.comm_timeout);
  fw::check<fw::ConfigError>(o.steps >= 0, "fourway: --steps must be >= 0, got ", o.steps);
  fw::check<fw::ConfigError>(o.heads >= 0, "fourway: --heads must be positive, got ", o.heads);
  fw::check<fw::ConfigError>(o.zero >= 0 && o.zero <= 3, "fourway: --zero ", o.zero,
                             " does not exist; use 0 (DataParallel), 1, 2 or 3");
  fw::check<fw::ConfigError>(o.bucket_mb >= 0.0f, "fourway: --bucket-mb must be >= 0, got ",
                             o.bucket_mb);
  fw::check<fw::ConfigError>(o.ranks >= 0, "fourway: --ranks must be >= 0, got ", o.ranks);
  fw::check<fw::ConfigError>(o.dp >= 0, "fourway: --dp must be >= 0 (0: every rank left), got ",
                             o.dp);
  check_positive("tp", o.tp);
  check_positive("cp", o.cp);
  check_positive("pp", o.pp);
  fw::check<fw::ConfigError>(o.micro_batches >= 0, "fourway: --micro-batches must be >= 1, got ",
                             o.micro_batches);
  fw::check<fw::ConfigError>(o.virtual_stages >= 0,
                             "fourway: --virtual-stages must be >= 0 (0: 2), got ",
                             o.virtual_stages);
  fw::check<fw::ConfigError>(o.memory_cap_gb >= 0.0, "fourway: --memory-cap-gb must be >= 0, got ",
                             o.memory_cap_gb);
  fw::check<fw::ConfigError>(o.peak_tflops >= 0.0 && o.peak_tflops < 1e6,
                             "fourway: --peak-tflops must be >= 0 (TFLOP/s of one device), got ",
                             o.peak_tflops);
  (void)schedule_kind(o.schedule);
  (void)make_adamw(o);  // learning rate, betas, warm-up and decay against --steps
  check_backend(o, t);
  check_output_dir("save", o.save);
  check_output_dir("log-json", o.log_json);
  check_validation_flags(o);
  check_sample_flags(o);
  check_output_dir("trace", o.trace);
  std::error_code ec;
  fw::check<fw::ConfigError>(o.data.empty() || std::filesystem::is_regular_file(o.data, ec),
                             "fourway: --data ", o.data, ": no such regular file");
  if (!o.resume.empty()) (void)fw::resolve_checkpoint(o.resume);  // a committed checkpoint
}

/// The ranks of a LocalWorld run (threads of this process) the flags ask for, checked against
/// --dp; under --backend mpi|nccl --ranks may stay 0 (every process the launcher started).
inline void resolve_ranks(Options& o) {
  const int tp = o.tp, pp = o.pp, inner = o.tp * o.cp * o.pp;
  if (!o.parallel() && pp == 1 && !o.check) {
    o.ranks = 1;
    return;
  }
  if (o.local_world() && o.ranks == 0) o.ranks = inner * std::max(o.dp, 1);
  if (o.ranks == 0) return;  // the launcher's processes
  fw::check<fw::ConfigError>(
      inner > 1 || o.dp == 0 || o.dp == o.ranks, "fourway: --dp ", o.dp, " but there are ", o.ranks,
      " ranks; without --tp, --cp or --pp --dp must ", "equal --ranks (or be 0)");
  fw::check<fw::ConfigError>(
      o.ranks % inner == 0 && (o.dp == 0 || o.dp * inner == o.ranks), "fourway: --tp ", tp,
      o.cp > 1 ? fw::detail::cat(" x --cp ", o.cp) : "", " x --pp ", pp, " x --dp ", o.dp,
      " does not make the ", o.ranks, " ranks of --ranks ", o.ranks, "; give --ranks = --tp x ",
      o.cp > 1 ? "--cp x " : "", "--pp x --dp (or --dp 0 for what is left)");
}

/// Combinations: every flag the chosen path would ignore is refused, naming it and what it
/// needs.
inline void check_combinations(const Options& o, const TargetTraits& t,
                               const fw::models::GptConfig& cfg) {
  const Path path = run_path(o);
  const bool pipeline = o.pp > 1;
  refuse_unless(pipeline, o, "schedule",
                "orders the micro-batches of a pipeline; it needs --pp S > 1 (drop --schedule)");
  refuse_unless(pipeline, o, "virtual-stages",
                "cuts each pipeline rank's layers into chunks; it needs --pp S > 1 (drop "
                "--virtual-stages)");
  refuse_unless(pipeline, o, "trace",
                "records the pipeline's actions; it needs --pp S > 1 (drop --trace)");
  refuse_unless(o.tp > 1 || !o.sequence_parallel, o, "sequence-parallel",
                "splits LayerNorm and residual regions over tensor-parallel ranks; it needs "
                "--tp N > 1");
  for (const char* flag : {"bucket-mb", "no-overlap"}) {
    refuse_unless(!pipeline && o.cp == 1, o, flag,
                  "shapes the data-parallel path's overlapped gradient reduction; a pipeline "
                  "reduces its gradients over the replicas once, after its last micro-batch, "
                  "unbucketed (drop it with --pp)");
    const int d = replicas(o);
    refuse_unless(d != 1, o, flag,
                  "shapes the gradient reduction over data-parallel replicas, and this run has "
                  "one; give --ranks or --dp for more (or drop it)");
  }
  refuse_unless(path != Path::single, o, "comm-timeout",
                "bounds the waits of communicators, and a one-rank run has none; give --ranks, "
                "--tp, --pp or --backend strict (or drop --comm-timeout)");
  refuse_unless(o.init_from.empty(), o, "seed",
                "seeds the random init, and --init-from loads every weight (drop --seed)");
  fw::check<fw::ConfigError>(o.classifier_chunk == 0 || o.tp == 1, "fourway: --classifier-chunk ",
                             "applies to the tied head of --tp 1; the vocabulary-parallel head of ",
                             "--tp ", o.tp, " keeps its slice of the logits (drop ",
                             "--classifier-chunk)");
  if (o.cp > 1) {
    fw::check<fw::ConfigError>(
        o.seq % (2 * o.cp) == 0, "fourway: --cp ", o.cp, " cuts every sequence into 2 x ", o.cp,
        " = ", 2 * o.cp, " chunks (rank r holds chunks r and ", 2 * o.cp - 1, " - r), but --seq ",
        o.seq, " does not divide by ", 2 * o.cp, "; use a --seq divisible by ", 2 * o.cp);
    refuse_unless(false, o, "sample-tokens",
                  "generates from the model, and decoding keeps whole sequences: a --cp mesh "
                  "cannot (save the model and sample without --cp)");
  }
  fw::check<fw::ConfigError>(cfg.heads % o.tp == 0, "fourway: --tp ", o.tp, ": tensor parallelism ",
                             "over tp=", o.tp, " ranks needs heads=", cfg.heads, " divisible by ",
                             o.tp);
  if (o.steps == 0) {
    refuse_unless(false, o, "save-dir",
                  "writes checkpoints after training steps, and --steps 0 runs none (use --save "
                  "FILE for the weights)");
    refuse_unless(false, o, "trace", "records training steps, and --steps 0 runs none");
  }
  if (path == Path::check) {
    fw::check<fw::ConfigError>(t.has_check,
                               "fourway: --check runs in the host build, fourway-train");
    fw::check<fw::ConfigError>(o.steps >= 1, "fourway: --check needs --steps >= 1");
    for (const char* flag :
         {"log-json", "save", "save-dir", "resume", "memory-report", "quiet", "trace",
          "peak-tflops", "val-data", "eval-every", "eval-batches", "sample-tokens"}) {
      refuse_unless(false, o, flag,
                    "is not part of --check, which compares the mesh with the one-rank run and "
                    "prints the comparison (run without --check to train)");
    }
  }
  // sizes: the batch splits into replicas x micro-batches, sequence parallelism's rows into tp
  const int d = std::max(replicas(o), 1);
  const long long split = static_cast<long long>(d) * o.micro_batches;
  fw::check<fw::ConfigError>(
      o.batch % split == 0, "fourway: --batch ", o.batch, ": the global batch of B=", o.batch,
      " sequences does not split into ", d, d == 1 ? " replica" : " data-parallel ranks", " x ",
      o.micro_batches, o.micro_batches == 1 ? " micro-batch" : " micro-batches",
      "; use a --batch that is a multiple of ", split);
  const long long rows = o.batch / split * o.seq / std::max(o.cp, 1);
  fw::check<fw::ConfigError>(
      !o.sequence_parallel || rows % o.tp == 0, "fourway: --sequence-parallel splits the ", rows,
      " rows of a micro-batch (batch/dp/micro-batches x seq/cp) over tp=", o.tp,
      " ranks; choose --batch, --micro-batches and --seq so that "
      "tp divides them");
  if (pipeline) {
    const fw::schedule::Request q{schedule_kind(o.schedule), o.pp, o.micro_batches,
                                  virtual_stages(o), 1};
    const auto problem = fw::schedule::validate(q);
    fw::check<fw::ConfigError>(
        problem == fw::schedule::RequestProblem::none, "fourway: --schedule ", o.schedule, " --pp ",
        o.pp, " --micro-batches ", o.micro_batches, ": ", fw::schedule::explain(q, problem));
    fw::check<fw::ConfigError>(cfg.layers >= o.pp * virtual_stages(o), "fourway: --pp ", o.pp,
                               " x ", virtual_stages(o), " chunks per rank needs at least ",
                               o.pp * virtual_stages(o), " layers; the model has ", cfg.layers);
  }
}

}  // namespace detail

/// Checks every flag and every combination the run would not honour before anything is built,
/// and fills in what the flags leave open: --vocab-align (128 on a GPU, 1 on the host),
/// --micro-batches (1, or S with --pp S), --ranks of a LocalWorld run (tp x pp x dp), and
/// --virtual-stages. Returns the model's shape (from --init-from's header and config.json, or
/// the flags). Throws ConfigError (CheckpointError for a bad file) naming the flag.
inline fw::models::GptConfig validate(Options& o, const TargetTraits& t) {
  detail::check_values(o, t);
  if (o.micro_batches == 0) o.micro_batches = o.pp > 1 ? o.pp : 1;
  if (o.pp > 1) o.virtual_stages = virtual_stages(o);
  detail::resolve_ranks(o);
  std::optional<fw::SafetensorsReader> ckpt;
  const fw::models::GptConfig cfg = model_config(o, ckpt, false);
  detail::check_combinations(o, t, cfg);
  return cfg;
}

namespace detail {
inline std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace detail

/// What a validated run will do, one line per part, only the parts its path honours (the
/// --dry-run output; tests/train/flag_pairs_test.cpp reads every flag's effect in it).
inline std::string describe(const Options& o, const TargetTraits& t,
                            const fw::models::GptConfig& cfg) {
  using detail::num;
  using fw::detail::cat;
  const Path path = run_path(o);
  std::string out =
      cat("dry run: the flags agree; nothing was built",
          o.init_from.empty() ? "" : cat(" (read: the header of ", o.init_from, ")"), "\n");
  const int d = replicas(o);
  const std::string ranks = o.ranks == 0 ? "every process the launcher starts"
                                         : cat(o.ranks, o.ranks == 1 ? " rank" : " ranks");
  const std::string dp =
      o.zero == 0 ? std::string("DataParallel") : cat("ZeRO-", o.zero, " (Sharded<", o.zero, ">)");
  // context parallelism: the ranks each sequence is split over and the tokens each holds
  const std::string cp =
      o.cp > 1 ? cat(" x cp=", o.cp, " (", o.seq / o.cp, " tokens of each sequence per rank)") : "";
  switch (path) {
    case Path::single: out += "run: one rank (no communicator)\n"; break;
    case Path::data_parallel: out += cat("run: ", dp, " dp=", d, " on ", ranks, "\n"); break;
    case Path::tensor_parallel:
      out += cat("run: TensorParallel tp=", o.tp, " x ", dp, " dp=", d, " on ", ranks, "\n");
      break;
    case Path::pipeline:
      out += cat("run: pipeline tp=", o.tp, cp, " x pp=", o.pp, " x ", dp, " dp=", d, " on ", ranks,
                 "\n");
      break;
    case Path::check:
      out += cat("check: tp=", o.tp, cp, " pp=", o.pp, " ", dp, " dp=", d, " on ", ranks,
                 " against the one-rank run over ", o.steps,
                 " steps (exit 1 outside the precision's bounds)\n");
      break;
  }
  if (path != Path::single) {
    out += cat("communication: backend ", o.backend, ", timeout ", num(o.comm_timeout), " s",
               o.tp > 1 && o.sequence_parallel ? ", sequence parallel" : "");
    if (o.pp == 1 && o.cp == 1 && d != 1) {
      out += cat(", bucket ", num(o.bucket_mb), " MiB, overlap ", o.no_overlap ? "off" : "on");
    }
    out += "\n";
  }
  if (o.pp > 1) {
    out += cat("pipeline: schedule ", o.schedule, ", ", o.micro_batches, " micro-batches, ",
               o.virtual_stages, o.virtual_stages == 1 ? " chunk per rank" : " chunks per rank",
               o.trace.empty() ? "" : cat(", trace ", o.trace), "\n");
  }
  out += cat("model: ", cfg.layers, " layers, width ", cfg.dim, ", ", cfg.heads, " heads, vocab ",
             cfg.vocab, " (aligned to ", o.vocab_align, o.tp > 1 ? " per tp rank" : "",
             "), context ", cfg.max_seq, ", ",
             o.init_from.empty() ? cat("random init, seed ", o.seed) : cat("from ", o.init_from),
             "\n");
  out += cat("data: ", o.data.empty() ? std::string("the built-in corpus") : o.data, "\n");
  out += cat("batch: ", o.batch, " sequences x ", o.seq, " tokens, ", o.micro_batches,
             o.micro_batches == 1 ? " micro-batch" : " micro-batches", "\n");
  out += cat("steps: ", o.steps, "; AdamW lr ", num(o.lr), ", weight decay ", num(o.weight_decay),
             ", beta1 ", num(o.beta1), ", beta2 ", num(o.beta2), ", eps ", num(o.eps), ", clip ",
             num(o.grad_clip), ", warmup ", o.warmup, ", min lr ",
             o.min_lr < 0.0f ? std::string("off") : num(o.min_lr), "\n");
  const bool graph =
      path == Path::single && (o.cuda_graph == "on" || (o.cuda_graph == "auto" && t.on_device));
  out += cat("precision: ", o.precision, o.tf32 ? ", tf32" : "", ", attention ", o.attention,
             ", recomputation ", o.checkpoint_activations, ", classifier chunk ",
             o.classifier_chunk, ", cuda graph ",
             !graph                 ? "off"
             : o.cuda_graph == "on" ? "on"
                                    : "where the step allows it",
             "\n");
  out +=
      cat("memory: ",
          o.memory_cap_gb > 0 ? cat("cap ", num(o.memory_cap_gb), " GB per rank")
                              : std::string(t.on_device ? "cap: the GPU's free memory" : "no cap"),
          ", block cache ", o.block_cache,
          o.memory_report ? ", memory report of every rank at the end" : "", "\n");
  if (path != Path::check) {
    std::string outputs;
    const auto add = [&](const std::string& s) { outputs += (outputs.empty() ? "" : "; ") + s; };
    if (!o.log_json.empty()) add(cat("log ", o.log_json));
    if (!o.val_data.empty()) {
      add(cat("validation on ", o.val_data,
              o.eval_every > 0 ? cat(", evaluated every ", o.eval_every, " steps and") : "",
              " after the last step, ",
              o.eval_batches > 0 ? cat(o.eval_batches, " validation batches")
                                 : std::string("up to 20 validation batches")));
    }
    if (!o.save.empty()) add(cat("save ", o.save, " and config.json beside it"));
    if (!o.save_dir.empty()) {
      add(cat("checkpoints under ", o.save_dir,
              o.save_every > 0 ? cat(" every ", o.save_every, " steps and") : "",
              " after the last step", o.keep > 0 ? cat(", keep ", o.keep) : "",
              o.save_async ? ", written in the background" : ""));
    }
    if (o.sample_tokens > 0) {
      add(cat("samples of ", o.sample_tokens, " tokens",
              o.sample_every > 0 ? cat(" every ", o.sample_every, " steps and") : "",
              " after the last step, ",
              o.temperature == 0.0f
                  ? std::string("greedy")
                  : cat("temperature ", num(o.temperature),
                        o.top_k > 0 ? cat(", top-k ", o.top_k) : "", ", seed ", o.sample_seed),
              ", prompt \"", o.prompt, "\"",
              o.tokenizer.empty() ? "" : cat(", tokenizer ", o.tokenizer)));
    }
    if (!o.resume.empty()) add(cat("resume from ", o.resume));
    if (o.quiet) add("quiet");
    if (o.profile_step > 0) add(cat("profile step ", o.profile_step));
    if (o.peak_tflops > 0) add(cat("MFU against ", num(o.peak_tflops), " TFLOP/s per device"));
    out += cat("outputs: ", outputs.empty() ? std::string("none") : outputs, "\n");
  }
  return out;
}

}  // namespace fourway_train
