//! Save a training run and resume it, on the same mesh or another: a `Trainer` and its strategy
//! to and from a checkpoint directory (checkpoint/state_dir.hpp).
//!
//! `save_checkpoint(trainer, comm, options)` is a collective of every rank that holds state (the
//! strategy's group; for a `MeshStrategy` the whole mesh): every rank writes only the optimizer
//! state it owns (its ZeRO shard; under plain data parallelism its 1/N of every parameter; of a
//! tensor-parallel slice the part that maps onto the unsplit tensor, a replicated parameter on tp
//! rank 0 only; of a pipeline stage its own layers, the tied `wte` once), as fp32 slices of
//! global tensors — each parameter's master value and
//! Adam's `exp_avg` and `exp_avg_sq` — plus the run's progress in the index: the trainer's
//! iteration (the learning-rate schedule's index), Adam's step, the loss scaler (scale, clean
//! run, skipped steps), precision and mesh, and whatever the program adds (its data position).
//!
//! `resume_checkpoint(trainer, comm, path)` reads, on every rank, only the slices that overlap
//! what the rank owns now — whatever mesh wrote them — checks each slice's CRC-32C, restores
//! masters, moments, working weights, Adam's step, the iteration and the loss scaler, agrees
//! success over the group (so a bad file on one rank is an error on every rank, never a hang),
//! and only then runs the strategy's own collectives (the weight all-gather of ZeRO-1/2).
//! Resuming on the mesh that saved is bitwise the uninterrupted run; on another mesh it differs
//! only by the reduction order of later steps.
//!
//! `save_checkpoint_async(trainer, pending, ...)` is the same save with the file writes in the
//! background (checkpoint/async_state_save.hpp): the rank's state is copied to host memory at the
//! call, training continues, and `pending.poll` / `pending.wait` commit it later.
#pragma once

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/checkpoint/async_state_save.hpp"
#include "fourway/checkpoint/sharded_io.hpp"
#include "fourway/checkpoint/state_dir.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/train/state_runs.hpp"

namespace fourway {

struct CheckpointOptions {
  std::filesystem::path root;               // checkpoints go to root/step-NNNNNNNN
  int keep = 0;                             // > 0: keep the newest `keep` committed checkpoints
  std::map<std::string, std::string> meta;  // the program's own (data position, corpus, ...)
  std::function<void(SavePhase)> at_phase;  // tests: fault injection between phases
};

namespace detail {
inline std::string exact_float(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  return std::string(buf, r.ptr);
}

template <class N>
N meta_number(const StateIndex& x, const std::string& key, const std::string& source) {
  const auto it = x.meta.find(key);
  check<CheckpointError>(it != x.meta.end(), "fourway: checkpoint ", source, " lacks \"", key,
                         "\" in its index");
  N v{};
  const auto r = std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
  check<CheckpointError>(r.ec == std::errc() && r.ptr == it->second.data() + it->second.size(),
                         "fourway: checkpoint ", source, ": \"", key, "\" = \"", it->second,
                         "\" is not a number");
  return v;
}

/// The ranks that write a checkpoint of strategy `s`: the whole mesh (`checkpoint_ranks()`) or,
/// for a data-parallel strategy, its group.
template <class Strategy>
int checkpoint_ranks(const Strategy& s) {
  if constexpr (requires { s.checkpoint_ranks(); }) {
    return s.checkpoint_ranks();
  } else {
    return s.dp_size();
  }
}
}  // namespace detail

/// What a save of the run writes besides the values (the index's tensors and metadata), rank
/// `world`'s group of the strategy.
template <class TrainerT>
StateSave checkpoint_save(TrainerT& trainer, int world, const CheckpointOptions& o) {
  auto& s = trainer.strategy();
  check<ConfigError>(
      detail::checkpoint_ranks(s) == world,
      "fourway: save_checkpoint needs every rank that holds state: the strategy has ",
      detail::checkpoint_ranks(s), " (its whole mesh), the group ", world,
      " (pass the world communicator of the mesh)");
  using T = typename std::remove_cvref_t<decltype(s)>::precision_type::param_type;
  StateSave save;
  save.root = o.root;
  save.step = trainer.iteration();
  save.keep = o.keep;
  save.at_phase = o.at_phase;
  save.tensors = state_tensors(s.checkpoint_runs(true));
  save.meta = o.meta;
  save.meta["iteration"] = std::to_string(trainer.iteration());
  save.meta["adam_step"] = std::to_string(s.state().step());
  save.meta["loss_scale"] = detail::exact_float(trainer.loss_scaler().scale());
  save.meta["loss_scale_clean_run"] = std::to_string(trainer.loss_scaler().clean_run());
  save.meta["skipped_steps"] = std::to_string(trainer.loss_scaler().skipped_steps());
  save.meta["precision"] = std::string(dtype_name(dtype_of<T>::value));
  save.meta["saved_by_ranks"] = std::to_string(world);
  if constexpr (requires { s.mesh().describe(); }) {
    save.meta["mesh"] = s.mesh().describe();  // "tp=2 pp=2 dp=2 (8 ranks)"
  } else {
    save.meta["mesh"] = detail::cat("dp=", s.dp_size(), " (", world, " ranks)");
  }
  using St = std::remove_cvref_t<decltype(s)>;
  if constexpr (requires { St::zero_stage; }) {
    save.meta["zero"] = std::to_string(St::zero_stage);
  } else if constexpr (requires { St::stage; }) {
    save.meta["zero"] = std::to_string(St::stage);
  }
  return save;
}

/// The pieces this rank of the strategy writes (its runs' parts, state_runs.hpp).
template <class Strategy>
std::vector<StatePiece> checkpoint_pieces(const Strategy& s) {
  return state_pieces(s.checkpoint_runs(true));
}

/// Saves the run (see the file comment); a collective of the strategy's group, rank `rank` of
/// `world`, agreeing through `flags` (flag_gather(ctx, comm), checkpoint/sharded_io.hpp). Returns
/// the committed directory, root/step-<trainer.iteration()>.
template <class TrainerT>
std::filesystem::path save_checkpoint(TrainerT& trainer, int rank, int world,
                                      const FlagGather& flags, const CheckpointOptions& o) {
  auto& s = trainer.strategy();
  return save_state_dir(
      rank, world, flags, checkpoint_save(trainer, world, o), checkpoint_pieces(s),
      [&](StateSink& sink) {
        s.save_state([&](std::size_t piece, std::int64_t offset, std::span<const float> v) {
          sink.put(piece, offset, v);
        });
      });
}

/// Starts an asynchronous save of the run (see checkpoint/async_state_save.hpp); a collective
/// like `save_checkpoint`. The save in flight in `pending`, if any, is finished first (its
/// errors are raised here); then this rank's state is copied into `pending`'s host snapshot and
/// the files are written in the background while the caller trains on. The checkpoint is
/// committed by a later `pending.poll(flags)` or `pending.wait(flags)`, which must run before the
/// program exits. The files and the index equal those of `save_checkpoint` at the same step.
template <class TrainerT>
void save_checkpoint_async(TrainerT& trainer, AsyncStateSave& pending, int rank, int world,
                           const FlagGather& flags, const CheckpointOptions& o) {
  (void)pending.wait(flags);  // one save in flight, one snapshot in host memory
  auto& s = trainer.strategy();
  StateSave save = checkpoint_save(trainer, world, o);
  StateSnapshot& snap = pending.snapshot(checkpoint_pieces(s));
  std::string error;
  detail::guarded(error, [&] {
    s.save_state([&](std::size_t piece, std::int64_t offset, std::span<const float> v) {
      snap.put(piece, offset, v);
    });
    snap.check_complete();
  });
  detail::agree_or_throw(
      flags, "copying the state of step " + std::to_string(save.step) + " to host memory", error,
      [] {}, detail::nothing_committed);
  pending.start(rank, world, flags, std::move(save));
}

template <class TrainerT, communicator Comm>
std::filesystem::path save_checkpoint(TrainerT& trainer, Comm& comm, const CheckpointOptions& o) {
  return save_checkpoint(trainer, comm.rank(), comm.size(),
                         flag_gather(trainer.strategy().context(), comm), o);
}

template <class TrainerT, communicator Comm>
void save_checkpoint_async(TrainerT& trainer, AsyncStateSave& pending, Comm& comm,
                           const CheckpointOptions& o) {
  save_checkpoint_async(trainer, pending, comm.rank(), comm.size(),
                        flag_gather(trainer.strategy().context(), comm), o);
}

/// A committed checkpoint directory, or the newest one under a root of them.
inline std::filesystem::path resolve_checkpoint(const std::filesystem::path& p) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(p / "index.json", ec)) return p;
  const auto latest = latest_checkpoint(p);
  check<CheckpointError>(latest.has_value(), "fourway: ", p.string(),
                         " holds no committed checkpoint (a directory with an index.json, or a ",
                         "root of step-NNNNNNNN ones)");
  return *latest;
}

/// Resumes the run from `path` (a checkpoint or a root of them; see the file comment); a
/// collective of the strategy's group agreeing through `flags`. Returns the index, whose `meta`
/// holds the program's own entries.
template <class TrainerT>
StateIndex resume_checkpoint(TrainerT& trainer, const FlagGather& flags,
                             const std::filesystem::path& path) {
  auto& s = trainer.strategy();
  StateIndex index;
  std::string error;
  std::string where = path.string();
  try {
    const auto dir = resolve_checkpoint(path);
    where = dir.string();
    StateDir d = StateDir::open(dir);
    for (const auto& t : state_tensors(s.checkpoint_runs(false))) {
      const StateTensor* saved = d.index().tensor(t.name);
      check<CheckpointError>(saved != nullptr, "fourway: checkpoint ", where, " has no tensor \"",
                             t.name, "\"; it was saved from another model");
      check<CheckpointError>(saved->shape == t.shape, "fourway: checkpoint ", where, ": \"", t.name,
                             "\" has shape ", dims_string(saved->shape), ", the model has ",
                             dims_string(t.shape), "; it was saved from another model");
    }
    const auto adam_step = detail::meta_number<int>(d.index(), "adam_step", where);
    s.load_state(adam_step,
                 [&](const std::string& tensor, std::int64_t first, std::int64_t n, float* host) {
                   std::int64_t got = 0;
                   d.read(tensor, first, n, [&](std::int64_t offset, std::span<const float> v) {
                     std::copy(v.begin(), v.end(), host + offset);
                     got += static_cast<std::int64_t>(v.size());
                   });
                   check<CheckpointError>(got == n, "fourway: checkpoint ", where, " gave ", got,
                                          " of ", n, " elements of \"", tensor, "\"");
                 });
    trainer.restore_progress(detail::meta_number<long>(d.index(), "iteration", where),
                             detail::meta_number<float>(d.index(), "loss_scale", where),
                             detail::meta_number<int>(d.index(), "loss_scale_clean_run", where),
                             detail::meta_number<long>(d.index(), "skipped_steps", where));
    index = d.index();
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree_or_throw(
      flags, "resuming from " + where, error, [] {}, "; the run was not resumed");
  s.sync_loaded_state();
  return index;
}

template <class TrainerT, communicator Comm>
StateIndex resume_checkpoint(TrainerT& trainer, Comm& comm, const std::filesystem::path& path) {
  return resume_checkpoint(trainer, flag_gather(trainer.strategy().context(), comm), path);
}

}  // namespace fourway
