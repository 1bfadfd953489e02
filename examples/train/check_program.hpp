// fourway-train ... --check: runs the configured mesh (--tp, --cp, --pp, --dp, --zero, the
// schedule, the precision) and the one-rank run of the same model on the same batches for --steps
// steps with fw::check_mesh (train/mesh_check.hpp), prints per step the two losses and their
// relative difference and, at step 1, the largest relative gradient differences per tensor, and
// exits with status 1 when any is outside the precision's bound. The mesh runs on LocalWorld
// threads. Compiled in its own unit (train_check.cpp) so that its instantiations build beside
// train.cpp.
#pragma once

#include <algorithm>
#include <cstdio>
#include <optional>
#include <type_traits>
#include <vector>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/checkpoint/tp_checkpoint.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/train/mesh_check.hpp"
#include "fourway/train/token_data.hpp"
#include "train_program.hpp"

namespace fourway_train {

template <class Target, class T, bool Tp, bool Pp, int Zero>
bool check_ranks(const Options& o, int ranks) {
  using B = typename Target::backend;
  using Comm = fw::LocalComm;
  using MeshT = fw::dynamic_mesh_t<Tp, Pp, Zero, true>;  // --cp 1: as without the axis
  using S = fw::MeshStrategy<MeshT, fw::Precision<T>, B, Comm>;
  bool ok = false;
  const auto rank_main = [&](fw::World<fw::LocalWorld>& w) {
    const bool lead = w.rank() == 0;
    fw::Context<B> ctx = Target::context(w.memory(), 0, o);
    apply_memory_options<Target>(o, w.memory(), 0);
    const MeshT mesh(w.size(), {.tp = Tp ? o.tp : fw::dynamic,
                                .cp = o.cp,
                                .pp = Pp ? o.pp : fw::dynamic,
                                .dp = o.dp == 0 ? fw::dynamic : o.dp});
    fw::MeshGroups<Comm> groups(mesh, w.comm());
    std::optional<fw::SafetensorsReader> ckpt;
    const fw::models::GptConfig cfg = model_config(o, ckpt, lead);
    const fw::TokenData data = o.data.empty() ? fw::builtin_corpus() : fw::TokenData::read(o.data);
    fw::TokenLoader loader(data, o.batch, o.seq, cfg.vocab);
    std::vector<fw::SequenceBatch> batches;  // random access: both runs see step s's batch
    for (int s = 0; s < o.steps; ++s) batches.push_back(loader.next());
    const fw::MeshOptions mo = mesh_options(o);
    typename S::loader load;
    std::function<void(const fw::Context<B>&, fw::models::Gpt<T, B>&)> load_one_rank;
    if (ckpt) {
      if constexpr (Tp) {
        load = [&](const fw::Context<B>& c, auto& m) { fw::load_gpt2_tp(c, *ckpt, m); };
      } else {
        load = [&](const fw::Context<B>& c, auto& m) { fw::load_gpt2(c, *ckpt, m, Pp); };
      }
      load_one_rank = [&](const fw::Context<B>& c, fw::models::Gpt<T, B>& m) {
        fw::load_gpt2(c, *ckpt, m);
      };
    }
    const fw::TrainerOptions to = trainer_options(o);
    fw::CheckOptions co;
    co.steps = o.steps;
    const fw::CheckReport r = fw::check_mesh<MeshT, fw::Precision<T>>(
        ctx, mesh, groups, w.comm(), cfg, o.seed, mo, make_adamw(o), to,
        [&](int s) {
          const auto& b = batches[static_cast<std::size_t>(s)];
          return fw::Batch{b.inputs, b.targets, b.B, b.T};
        },
        co, load, load_one_rank);
    if (lead) {
      std::printf("checking %s on %d ranks (LocalWorld), %s\n", mesh.describe().c_str(), w.size(),
                  o.precision.c_str());
      std::printf("%s", r.text().c_str());
      ok = r.ok();
    }
  };
  fw::launch<fw::LocalWorld>(ranks, rank_main, o.comm_options());
  return ok;
}

/// --check: 0 when the mesh matches the one-rank run within the bounds, 1 when it does not. The
/// flags were validated (validate.hpp): LocalWorld, --steps >= 1, --ranks = tp x cp x pp x dp.
template <class Target, class T>
int run_check(const Options& o) {
  bool ok = false;
  with_zero_stage(o.zero, [&]<int Z>() {
    if (o.tp > 1 && o.pp > 1)
      ok = check_ranks<Target, T, true, true, Z>(o, o.ranks);
    else if (o.tp > 1)
      ok = check_ranks<Target, T, true, false, Z>(o, o.ranks);
    else if (o.pp > 1)
      ok = check_ranks<Target, T, false, true, Z>(o, o.ranks);
    else
      ok = check_ranks<Target, T, false, false, Z>(o, o.ranks);
  });
  return ok ? 0 : 1;
}

}  // namespace fourway_train
