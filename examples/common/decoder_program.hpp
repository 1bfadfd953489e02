//! The program of a decoder of the user's own (a `fw::model_family` config, examples/llama/,
//! examples/gptj/): trains it on any mesh of LocalWorld ranks through fw::MeshStrategy and with
//! --check compares the mesh with the one-rank run (fw::check_mesh). A program supplies
//! `Program`: `Config` (with layers, dim and heads: --layers, --dim, --heads), `name`, `usage()`
//! and `model_flag(flag, cfg, integer)` for its model's own flags;
//! `decoder_program::main<Program>(argc, argv)` does the rest (docs/llama.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/fourway.hpp"

namespace decoder_program {

namespace fw = fourway;

template <class Config>
struct Options {
  int tp = 1, pp = 1, dp = 1, zero = 0, micro_batches = 1, steps = 5;
  std::string schedule = "1f1b";
  std::string precision = "fp32";
  bool check = false;
  bool checkpoint = false;
  std::int64_t batch = 8, seq = 32;
  Config model;
  float lr = 3e-3f;
  std::uint64_t seed = 1;
  std::string backend = "local";  // or "strict": LocalWorld held to NCCL's contract
  double comm_timeout = 300.0;    // seconds
};

fw::schedule::Kind schedule_kind(const std::string& name) {
  using K = fw::schedule::Kind;
  for (K k : {K::gpipe, K::one_f_one_b, K::interleaved, K::zb_h1, K::zb_v})
    if (fw::schedule::kind_name(k) == name) return k;
  throw fw::ConfigError(fw::detail::cat("fourway: --schedule ", name,
                                        " is not gpipe, 1f1b, interleaved, zb-h1 or zb-v"));
}

/// The flags every decoder program shares, and `Program::model_flag` for the model's own.
template <class Program>
Options<typename Program::Config> parse(int argc, char** argv) {
  Options<typename Program::Config> o;
  const std::string usage = Program::usage();
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      fw::check<fw::ConfigError>(i + 1 < argc, "fourway: ", a, " needs a value");
      return argv[++i];
    };
    auto integer = [&]() { return std::stoll(value()); };
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage.c_str());
      std::exit(0);
    } else if (a == "--tp") {
      o.tp = static_cast<int>(integer());
    } else if (a == "--pp") {
      o.pp = static_cast<int>(integer());
    } else if (a == "--dp") {
      o.dp = static_cast<int>(integer());
    } else if (a == "--zero") {
      o.zero = static_cast<int>(integer());
    } else if (a == "--micro-batches") {
      o.micro_batches = static_cast<int>(integer());
    } else if (a == "--schedule") {
      o.schedule = value();
    } else if (a == "--steps") {
      o.steps = static_cast<int>(integer());
    } else if (a == "--batch") {
      o.batch = integer();
    } else if (a == "--seq") {
      o.seq = integer();
    } else if (a == "--layers") {
      o.model.layers = static_cast<int>(integer());
    } else if (a == "--dim") {
      o.model.dim = integer();
    } else if (a == "--heads") {
      o.model.heads = integer();
    } else if (Program::model_flag(a, o.model, integer)) {
      // the model's own flag (--ffn, --kv-heads, ...)
    } else if (a == "--precision") {
      o.precision = value();
    } else if (a == "--checkpoint") {
      o.checkpoint = true;
    } else if (a == "--lr") {
      o.lr = std::stof(value());
    } else if (a == "--seed") {
      o.seed = static_cast<std::uint64_t>(integer());
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--backend") {
      o.backend = value();
      fw::check<fw::ConfigError>(o.backend == "local" || o.backend == "strict",
                                 "fourway: --backend ", o.backend, " is not local or strict (",
                                 Program::name, " runs LocalWorld ranks)");
    } else if (a == "--comm-timeout") {
      o.comm_timeout = std::stod(value());
      fw::check<fw::ConfigError>(o.comm_timeout > 0.0 && o.comm_timeout <= 1e6,
                                 "fourway: --comm-timeout must be in (0, 1e6] seconds, got ",
                                 o.comm_timeout);
    } else {
      throw fw::ConfigError(fw::detail::cat("fourway: unknown option ", a, "\n", usage));
    }
  }
  for (auto [name, v] : {std::pair{"tp", o.tp},
                         {"pp", o.pp},
                         {"dp", o.dp},
                         {"micro-batches", o.micro_batches},
                         {"steps", o.steps}}) {
    fw::check<fw::ConfigError>(v >= 1, "fourway: --", name, " must be >= 1, got ", v);
  }
  fw::check<fw::ConfigError>(o.zero >= 0 && o.zero <= 3, "fourway: --zero ", o.zero,
                             " does not exist; use 0, 1, 2 or 3");
  fw::check<fw::ConfigError>(o.precision == "fp32" || o.precision == "bf16",
                             "fourway: --precision ", o.precision, " is not fp32 or bf16");
  fw::check<fw::ConfigError>(o.batch % (o.dp * o.micro_batches) == 0, "fourway: --batch ", o.batch,
                             " must split into dp=", o.dp, " x micro-batches=", o.micro_batches,
                             " equal parts");
  o.model.vocab = fw::corpus_vocab;
  o.model.max_seq = o.seq;
  o.model.checkpoint = o.checkpoint;
  o.model.validate();
  (void)schedule_kind(o.schedule);
  return o;
}

template <class Config>
fw::AdamW adamw(const Options<Config>& o) {
  fw::AdamWConfig c;
  c.lr = o.lr;
  return fw::AdamW(c);
}

template <class Program, class T, bool Tp, bool Pp, int Zero>
int run(const Options<typename Program::Config>& o) {
  using B = fw::Host;
  using Comm = fw::LocalComm;
  using MeshT = fw::dynamic_mesh_t<Tp, Pp, Zero>;
  using S = fw::MeshStrategy<MeshT, fw::Precision<T>, B, Comm, typename Program::Config>;
  int status = 0;
  fw::CommOptions comm;
  comm.deadline = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000.0));
  comm.strict = o.backend == "strict";
  const auto rank_main = [&](fw::World<fw::LocalWorld>& w) {
    const bool lead = w.rank() == 0;
    fw::Context<B> ctx(w.memory());
    const MeshT mesh(w.size(),
                     {.tp = Tp ? o.tp : fw::dynamic, .pp = Pp ? o.pp : fw::dynamic, .dp = o.dp});
    fw::MeshGroups<Comm> groups(mesh, w.comm());
    const fw::TokenData data = fw::builtin_corpus();
    fw::TokenLoader loader(data, o.batch, o.seq, o.model.vocab);
    std::vector<fw::SequenceBatch> batches;
    for (int s = 0; s < o.steps; ++s) batches.push_back(loader.next());
    const auto batch_at = [&](int s) {
      const auto& b = batches[static_cast<std::size_t>(s)];
      return fw::Batch{b.inputs, b.targets, b.B, b.T};
    };
    fw::MeshOptions mo;
    mo.pipeline.schedule = schedule_kind(o.schedule);
    if (mo.pipeline.schedule == fw::schedule::Kind::interleaved) mo.pipeline.virtual_stages = 2;
    mo.pipeline.micro_batches = o.micro_batches;
    fw::TrainerOptions to;
    to.micro_batches = o.micro_batches;
    if (lead)
      std::printf("%s: %s on %d ranks (LocalWorld%s), %s, %d layers, width %lld\n", Program::name,
                  mesh.describe().c_str(), w.size(), comm.strict ? ", strict" : "",
                  o.precision.c_str(), o.model.layers, static_cast<long long>(o.model.dim));
    if (o.check) {
      fw::CheckOptions co;
      co.steps = o.steps;
      const fw::CheckReport r = fw::check_mesh<MeshT, fw::Precision<T>>(
          ctx, mesh, groups, w.comm(), o.model, o.seed, mo, adamw(o), to, batch_at, co);
      if (lead) {
        std::printf("%s", r.text().c_str());
        status = r.ok() ? 0 : 1;
      }
      return;
    }
    fw::Trainer<S> trainer(to, ctx, mesh, groups, o.model, o.seed, mo, adamw(o));
    {  // the map: where each rank sits and the model state it holds (the accountant's bytes)
      const auto c = mesh.coord_of(w.rank());
      const auto& m = w.memory();
      const double state = static_cast<double>(
          m.current(fw::MemTag::weights) + m.current(fw::MemTag::grads) +
          m.current(fw::MemTag::master_weights) + m.current(fw::MemTag::optimizer_state));
      for (int r = 0; r < w.size(); ++r) {
        w.comm().barrier();
        if (r == w.rank())
          std::printf("  rank %d (tp %d, pp %d, dp %d): model state %.3f MB\n", r, c.tp, c.pp, c.dp,
                      state / 1e6);
      }
      w.comm().barrier();
    }
    for (int s = 0; s < o.steps; ++s) {
      const float loss = trainer.step(batch_at(s));
      if (lead) std::printf("step %d: loss %.5f\n", s + 1, loss);
    }
    if (lead)
      std::printf("peak memory of rank 0: %.2f MB\n",
                  static_cast<double>(w.memory().total_peak()) / 1e6);
  };
  fw::launch<fw::LocalWorld>(o.tp * o.pp * o.dp, rank_main, comm);
  return status;
}

template <class Program, class T, int Zero>
int run_zero(const Options<typename Program::Config>& o) {
  if (o.tp > 1 && o.pp > 1) return run<Program, T, true, true, Zero>(o);
  if (o.tp > 1) return run<Program, T, true, false, Zero>(o);
  if (o.pp > 1) return run<Program, T, false, true, Zero>(o);
  return run<Program, T, false, false, Zero>(o);
}

template <class Program, class T>
int run_precision(const Options<typename Program::Config>& o) {
  switch (o.zero) {
    case 1: return run_zero<Program, T, 1>(o);
    case 2: return run_zero<Program, T, 2>(o);
    case 3: return run_zero<Program, T, 3>(o);
    default: return run_zero<Program, T, 0>(o);
  }
}

/// The program's `main`: parse, run, every error one line on stderr (exit status 2).
template <class Program>
int main(int argc, char** argv) {
  try {
    const auto o = parse<Program>(argc, argv);
    return o.precision == "bf16" ? run_precision<Program, fw::bf16>(o)
                                 : run_precision<Program, float>(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

}  // namespace decoder_program
