//! fourway-train's flags: `Options`, their parser (`make_parser`), the flags a user gave
//! (`given_flags`), and what each build of the program can run (`TargetTraits`: the host build
//! and the CUDA build). Light on purpose: tests/train/flag_pairs_test.cpp walks every pair of
//! flags through `validate` (validate.hpp) without compiling the program.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>

#include "fourway/comm/types.hpp"
#include "fourway/config.hpp"
#include "fourway/tools/cli.hpp"
#include "fourway/train/corpus.hpp"

namespace fw = fourway;

namespace fourway_train {

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
  // fourway-train-cuda, 16-bit: "fused" tensor-core kernels, "cudnn" (the cuDNN component)
  std::string attention = "blockwise";
  // the one-rank step in a CUDA graph: auto (fourway-train-cuda: where the step allows it;
  // fourway-train: off), on (required; fourway-train rehearses it), off
  std::string cuda_graph = "auto";
  std::string checkpoint_activations = "none";  // none, selective, full
  int classifier_chunk = 0;  // LM-head rows of logits at a time (0: all, kept for backward)
  std::string log_json;
  // validation (docs/train.md)
  std::string val_data;  // llm.c token file; empty: no validation
  int eval_every = 0;    // steps between evaluations (0: only after the last step)
  int eval_batches = 0;  // batches of --batch x --seq evaluated (0: up to 20 the file holds)
  // samples (docs/train.md)
  int sample_tokens = 0;  // new tokens per sample; 0: no samples
  int sample_every = 0;   // steps between samples (0: after the last step only)
  std::string prompt;
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: the whole vocabulary
  std::uint64_t sample_seed = 1337;
  std::string tokenizer;  // folder of HF tokenizer files, or "bytes"; empty: beside --init-from
  std::string save;
  // checkpoints and resuming (docs/train.md)
  std::string save_dir;
  int save_every = 0;
  int keep = 0;
  bool save_async = false;
  std::string resume;
  bool quiet = false;
  int profile_step = 0;      // fourway-train-cuda: the one step a profiler started off records
  double peak_tflops = 0.0;  // one device's peak, for the MFU (0: the target's figure, if any)
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
  // context parallelism (docs/context-parallel.md): each rank holds seq/cp tokens of a sequence
  int cp = 1;
  // pipeline parallelism and micro-batches (docs/pipeline.md)
  int pp = 1;
  int micro_batches = 0;  // 0: 1, or S with --pp S (the fewest micro-batches 1F1B runs)
  std::string schedule = "1f1b";
  int virtual_stages = 0;  // 0: 2 for interleaved and zb-v, else 1
  std::string trace;
  // the numerics check (check_program.hpp, docs/mesh.md)
  bool check = false;
  bool dry_run = false;  // validate the flags and print what would run; build nothing
  /// The flags on the command line (`given_flags`): what `validate` refuses where it would be
  /// ignored, whatever its value.
  std::set<std::string> given;
  [[nodiscard]] bool was_given(const std::string& flag) const { return given.contains(flag); }
  /// Ranks as threads or processes rather than the one-rank path of `train`.
  [[nodiscard]] bool parallel() const {
    return ranks > 1 || dp > 1 || backend != "local" || zero != 0 || tp != 1 || cp != 1 ||
           sequence_parallel;
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
      .add("heads", &o.heads, "H",
           "attention heads (0: 8; with --init-from the config.json beside the weights, else "
           "width/64)")
      .add("vocab", &o.vocab, "V", "vocabulary of a random model")
      .add("seq", &o.seq, "T", "sequence length (and the context of a random model)")
      .add("seed", &o.seed, "S", "seed of the random init")
      .add("data", &o.data, "FILE", "llm.c token file (default: the built-in corpus)")
      .add("batch", &o.batch, "B", "sequences per optimizer step (global)")
      .add("steps", &o.steps, "N", "optimizer steps (0: load and save, no step)")
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
      .add_choice("cuda-graph", &o.cuda_graph, {"auto", "on", "off"},
                  "a one-rank run's step (gradients zeroed, forwards, backwards, the gradient "
                  "norm) captured in a CUDA graph once and replayed (auto: fourway-train-cuda "
                  "captures where the step allows it, fourway-train does not; on: capture, an "
                  "error where it cannot be, rehearsed on the host by fourway-train; off)")
      .add_choice("attention", &o.attention, {"blockwise", "fused", "cudnn"},
                  "fourway-train-cuda, bf16/fp16: the causal attention's kernels (fused: flash "
                  "kernels on the tensor cores, scores kept on chip, head sizes 16/32/64/128; "
                  "cudnn: cuDNN's attention graph, in a build with the cuDNN component; "
                  "blockwise: batched cuBLAS GEMMs)")
      .add("classifier-chunk", &o.classifier_chunk, "ROWS",
           "LM-head logits ROWS token rows at a time, recomputed in backward (0: all B·T rows, "
           "kept)")
      .add_choice_or_bare("checkpoint-activations", &o.checkpoint_activations,
                          {"none", "selective", "full"}, "full",
                          "recompute in backward: full = each block's whole stash from its "
                          "input (alone: full); selective = the attention core and GELU only, "
                          "the linear layers' outputs kept")
      .add("log-json", &o.log_json, "FILE", "write one JSON object per step to FILE")
      .add("val-data", &o.val_data, "FILE",
           "llm.c token file to evaluate the validation loss on (forward only, every mesh)")
      .add("eval-every", &o.eval_every, "N",
           "evaluate on --val-data every N steps (0: after the last step only)")
      .add("eval-batches", &o.eval_batches, "K",
           "the first K batches of --val-data, the same every time (0: up to 20 of them)")
      .add("sample-tokens", &o.sample_tokens, "K",
           "generate K tokens after the last step (KV cache), printed and logged as text")
      .add("sample-every", &o.sample_every, "N", "also generate a sample every N steps")
      .add("prompt", &o.prompt, "TEXT",
           "the samples' prompt (default: <|endoftext|>, or a newline with byte ids)")
      .add("temperature", &o.temperature, "T", "sampling temperature (0: greedy)")
      .add("top-k", &o.top_k, "K", "sample among the K most likely tokens (0: all)")
      .add("sample-seed", &o.sample_seed, "S", "seed of the samples' draws")
      .add("tokenizer", &o.tokenizer, "DIR",
           "Hugging Face tokenizer files for --prompt and the samples (default: beside "
           "--init-from; bytes: byte ids, the built-in corpus's)")
      .add("save", &o.save, "FILE",
           "save the final weights (.safetensors, HF names) and config.json beside them")
      .add("save-dir", &o.save_dir, "DIR",
           "save resumable checkpoints (optimizer state, step, data position) under DIR")
      .add("save-every", &o.save_every, "N", "checkpoint every N steps (and after the last)")
      .add("keep", &o.keep, "K", "keep only the newest K checkpoints (0: all)")
      .add_switch("save-async", &o.save_async,
                  "copy the state to host memory at the save step and write it in the "
                  "background while training continues (one save in flight)")
      .add("resume", &o.resume, "DIR",
           "resume from a checkpoint (or the newest under a --save-dir), on any mesh")
      .add("peak-tflops", &o.peak_tflops, "TFLOPS",
           "peak TFLOP/s of one device, for the MFU in the progress line and the log: model "
           "FLOPs / (step time x peak x devices) (0: the datasheet figure of a GPU fourway "
           "knows, in the run's precision; the host knows none)")
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
      .add("dp", &o.dp, "N",
           "data-parallel degree: replicas (0: the ranks left by --tp and --pp; alone it sets "
           "--ranks)")
      .add("zero", &o.zero, "S", "0 DataParallel, 1/2/3 Sharded<S> (ZeRO-1/2, FSDP)")
      .add("bucket-mb", &o.bucket_mb, "MB",
           "gradient bucket size of --zero 0-2 over dp > 1 replicas (0: one bucket; not with --pp)")
      .add_switch("no-overlap", &o.no_overlap,
                  "issue collectives after backward, no prefetch (to measure the overlap; dp > 1 "
                  "replicas, not with --pp)")
      .add("tp", &o.tp, "N", "tensor-parallel degree: groups of N consecutive ranks split layers")
      .add_switch("sequence-parallel", &o.sequence_parallel,
                  "with --tp: split LayerNorm/residual regions along the sequence")
      .add("vocab-align", &o.vocab_align, "A",
           "pad the vocabulary to a multiple of A (with --tp: of tp*A); the padding is masked, "
           "files keep the real rows (0: 128 on CUDA, 1 on host)")
      .add("cp", &o.cp, "N",
           "context-parallel degree: every sequence split over N ranks (each holds seq/N tokens, "
           "attention passes keys and values around a ring; host backend)")
      .add("pp", &o.pp, "S", "pipeline stages (one rank each)")
      .add("micro-batches", &o.micro_batches, "M",
           "micro-batches per step (gradient accumulation; the pipeline's M; 0: 1, or S with "
           "--pp S)")
      .add_choice("schedule", &o.schedule, {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"},
                  "pipeline schedule (with --pp)")
      .add("virtual-stages", &o.virtual_stages, "V",
           "model chunks per rank of the interleaved schedule (with --pp; 0: 2)")
      .add("trace", &o.trace, "FILE",
           "write Chrome trace events of the pipeline to FILE (with --pp)")
      .add_switch("check", &o.check,
                  "run the mesh and the one-rank run on the same batches for --steps steps and "
                  "compare losses and step-1 gradients (exit 1 when outside the precision's "
                  "bounds)")
      .add_switch("quiet", &o.quiet, "print no per-step progress")
      .add_switch("dry-run", &o.dry_run,
                  "check every flag (and the --init-from header and config.json) and print what "
                  "would run; build, read and write nothing else")
      .add("profile-step", &o.profile_step, "N",
           "fourway-train-cuda: record step N only, for a profiler started with its recording "
           "off (cudaProfilerStart/Stop around it; ncu --profile-from-start off; 0: no window)");
  return p;
}

/// The flags on the command line `p` parsed, by name without `--` (read from its help, so every
/// flag it knows is asked).
inline std::set<std::string> given_flags(const fw::tools::ArgParser& p) {
  std::set<std::string> out;
  std::istringstream help(p.help());
  for (std::string line; std::getline(help, line);) {
    if (line.rfind("  --", 0) != 0) continue;
    const std::string name = line.substr(4, line.find(' ', 4) - 4);
    if (p.given(name)) out.insert(name);
  }
  return out;
}

/// What a build of the program can run; `validate` refuses the rest by name.
struct TargetTraits {
  const char* program;
  const char* default_precision;
  bool on_device;            // tensors on a GPU (--vocab-align defaults to 128 there)
  bool has_check;            // --check (the host build: check_program.hpp)
  bool has_tf32;             // --tf32
  bool has_fused_attention;  // --attention fused
  bool has_cudnn_attention;  // --attention cudnn (built with fourway::cudnn)
  bool has_profiler_window;  // --profile-step
  bool has_mpi;              // --backend mpi
  bool has_nccl;             // --backend nccl
};

/// fourway-train: host tensors; LocalWorld threads, or MPI processes when built with MPI.
inline constexpr TargetTraits host_traits{
    "fourway-train", "fp32", false, true, false, false, false, false, FOURWAY_HAS_MPI != 0, false};
/// fourway-train-cuda: GPU tensors, bf16 by default; LocalWorld on one GPU, or one process per
/// GPU over NCCL when built with it.
inline constexpr TargetTraits cuda_traits{
    "fourway-train-cuda", "bf16", true, false, true, true, FOURWAY_HAS_CUDNN != 0, true, false,
    FOURWAY_HAS_NCCL != 0};

}  // namespace fourway_train
