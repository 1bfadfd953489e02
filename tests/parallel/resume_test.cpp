// train/resume.hpp: train k steps, save, resume in a fresh process state, continue. On the mesh
// that saved, every later loss and every final weight equals the uninterrupted run's bit for bit
// (ZeRO 0-3, one rank, fp32 / bf16 / fp16 with its loss scaler); on another mesh (dp and ZeRO
// stage changed, one rank <-> many) they agree within the equivalence matrix's tolerance. Bad
// checkpoints are typed errors on every rank.
#include "fourway/train/resume.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel_harness.hpp"

namespace {

namespace fs = std::filesystem;

fs::path scratch_path(const std::string& name) {
  return fs::temp_directory_path() / ("fourway_resume_" + std::to_string(::getpid())) / name;
}

fs::path scratch(const std::string& name) {
  const auto dir = scratch_path(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// A mesh: ranks and ZeRO stage; ranks 0 means the one-rank reference strategy (SingleRank).
struct MeshSpec {
  int ranks = 1;
  int stage = 0;
};

struct Segment {
  std::vector<float> losses;               // of the steps run, rank 0
  std::vector<std::vector<float>> params;  // final, gathered
  std::vector<std::string> names;          // of the parameters
  long iteration = 0;                      // after the resume (before training)
  float loss_scale = 0;                    // at the end
  long skipped = 0;
  std::vector<std::string> errors;  // of the resume, per rank ("" when none)
};

struct Plan {
  MeshSpec mesh;
  int until = 0;       // train until this iteration
  fs::path resume;     // resume from here first (empty: start fresh)
  fs::path save_root;  // save at the end (empty: no save)
  fw::LossScalerConfig scaler{};
  fw::models::GptConfig model = harness::tiny_gpt();
  int async_at = -1;  // >= 0: save asynchronously to save_root at this iteration, train on to
                      // `until` while the background write is held back, then wait for it
};

template <class TrainerT, class Comm>
void train_segment(TrainerT& t, Comm& comm, const Plan& p, Segment& out, int rank) {
  if (!p.resume.empty()) {
    try {
      (void)fw::resume_checkpoint(t, comm, p.resume);
    } catch (const fw::CheckpointError& e) {
      out.errors[static_cast<std::size_t>(rank)] = e.what();
      return;
    }
  }
  if (rank == 0) out.iteration = t.iteration();
  std::vector<float> losses;
  fw::AsyncStateSave pending;
  std::atomic<bool> trained{false};
  const auto hold_write = [&](fw::SavePhase phase) {  // runs on the background thread
    if (phase != fw::SavePhase::write) return;
    while (!trained) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  for (long s = t.iteration(); s < p.until; ++s) {
    if (s == p.async_at) {
      fw::save_checkpoint_async(t, pending, comm,
                                fw::CheckpointOptions{p.save_root, 0, {}, hold_write});
    }
    losses.push_back(t.step(harness::batch(static_cast<int>(s)).view()));
  }
  trained = true;  // the state has moved on since the copy; now let the write run
  if (p.async_at >= 0) {
    EXPECT_TRUE(pending.wait(fw::flag_gather(t.strategy().context(), comm)).has_value());
  } else if (!p.save_root.empty()) {
    (void)fw::save_checkpoint(t, comm, fw::CheckpointOptions{p.save_root, 0, {}, {}});
  }
  if (rank == 0) {
    out.losses = losses;
    out.loss_scale = t.loss_scaler().scale();
    out.skipped = t.loss_scaler().skipped_steps();
  }
}

/// One rank, in this thread, with a one-rank LocalWorld communicator for the collectives.
template <class T>
Segment run_single(const Plan& p) {
  Segment out;
  out.errors.resize(1);
  fw::launch<fw::LocalWorld>(1, [&](fw::World<fw::LocalWorld>& w) {
    fw::models::Gpt<T, fw::Host> model(w.ctx(), p.model, harness::kSeed);
    fw::TrainerOptions opts;
    opts.loss_scaler = p.scaler;
    fw::Trainer<fw::SingleRank<fw::models::Gpt<T, fw::Host>, fw::Precision<T>, fw::Host>> t(
        opts, w.ctx(), model, harness::adamw());
    train_segment(t, w.comm(), p, out, 0);
    out.params = harness::model_params(model);
    model.visit_parameters([&](auto& prm) { out.names.push_back(prm.name); });
  });
  return out;
}

template <class T, int Stage>
Segment run_stage(const Plan& p) {
  using Model = fw::models::Gpt<T, fw::Host>;
  using S = fw::ShardedStrategy<Stage, Model, fw::Precision<T>, fw::Host, fw::LocalComm>;
  Segment out;
  out.errors.resize(static_cast<std::size_t>(p.mesh.ranks));
  std::mutex mu;
  fw::launch<fw::LocalWorld>(p.mesh.ranks, [&](fw::World<fw::LocalWorld>& w) {
    fw::LocalComm dp = w.comm().split(0, w.rank(), "dp");
    Model model = Model::deferred(w.ctx(), p.model, harness::kSeed);
    fw::TrainerOptions opts;
    opts.loss_scaler = p.scaler;
    fw::ShardedOptions so;
    so.bucket_bytes = 512;
    fw::Trainer<S> t(opts, w.ctx(), model, dp, harness::adamw(), so);
    train_segment(t, dp, p, out, w.rank());
    if (!out.errors[static_cast<std::size_t>(w.rank())].empty()) return;
    bool any_error = false;
    {
      std::lock_guard lock(mu);
      for (const auto& e : out.errors) any_error = any_error || !e.empty();
    }
    if (any_error) return;
    auto params = t.strategy().gather_full_parameters();
    if (w.rank() == 0) {
      out.params = std::move(params);
      model.visit_parameters([&](auto& prm) { out.names.push_back(prm.name); });
    }
  });
  return out;
}

/// The stages each precision is tested under (fewer instantiations, faster to build): fp32 all
/// four, bf16 ZeRO-1 and ZeRO-3, fp16 ZeRO-2.
template <class T>
constexpr bool tested(int stage) {
  if constexpr (std::is_same_v<T, float>) return true;
  if constexpr (std::is_same_v<T, fw::bf16>) return stage == 1 || stage == 3;
  return stage == 2;
}

template <class T>
Segment run(const Plan& p) {
  if (p.mesh.ranks == 0) return run_single<T>(p);
  Segment none;
  none.errors.assign(1, "this test does not instantiate stage " + std::to_string(p.mesh.stage));
  switch (p.mesh.stage) {
    case 0:
      if constexpr (tested<T>(0)) return run_stage<T, 0>(p);
      return none;
    case 1:
      if constexpr (tested<T>(1)) return run_stage<T, 1>(p);
      return none;
    case 2:
      if constexpr (tested<T>(2)) return run_stage<T, 2>(p);
      return none;
    default:
      if constexpr (tested<T>(3)) return run_stage<T, 3>(p);
      return none;
  }
}

std::string label(MeshSpec m) {
  return m.ranks == 0 ? std::string("one rank")
                      : "dp" + std::to_string(m.ranks) + " zero" + std::to_string(m.stage);
}

/// Uninterrupted on `to` for `total` steps vs `k` steps on `from`, saved, resumed on `to`. Across
/// meshes the equivalence matrix's tolerances hold (tests/parallel/sharded_test.cpp): fp32 losses
/// and parameters within 1e-5 relative (the key bias left out, harness::comparable), bf16 losses
/// within 1e-3.
/// Returns the first (saved) segment.
template <class T>
Segment expect_resume(MeshSpec from, MeshSpec to, int k, int total, bool bitwise,
                      fw::LossScalerConfig scaler = {}, int async_extra = 0) {
  SCOPED_TRACE(label(from) + " -> " + label(to) + (async_extra ? " (async save)" : ""));
  const auto root = scratch("ckpt");
  const Segment whole = run<T>(Plan{to, total, {}, {}, scaler});
  Plan saving{from, k + async_extra, {}, root, scaler};
  if (async_extra > 0) saving.async_at = k;  // the state moves on for async_extra steps
  const Segment first = run<T>(saving);
  const Segment rest = run<T>(Plan{to, total, root, {}, scaler});
  for (const auto& e : rest.errors) EXPECT_EQ(e, "");
  if (!rest.errors.empty() && !rest.errors[0].empty()) return first;
  EXPECT_EQ(rest.iteration, k);
  EXPECT_EQ(first.losses.size() - static_cast<std::size_t>(async_extra) + rest.losses.size(),
            whole.losses.size());
  EXPECT_EQ(rest.params.size(), whole.params.size());
  if (rest.params.size() != whole.params.size()) return first;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-3;
  for (std::size_t i = 0; i < rest.losses.size(); ++i) {
    const float want = whole.losses[static_cast<std::size_t>(k) + i];
    if (bitwise) {
      EXPECT_EQ(rest.losses[i], want) << "step " << k + static_cast<int>(i);
    } else {
      EXPECT_NEAR(rest.losses[i], want, tol * std::fabs(want))
          << "step " << k + static_cast<int>(i);
    }
  }
  for (std::size_t i = 0; i < rest.params.size(); ++i) {
    if (bitwise) {
      EXPECT_EQ(rest.params[i], whole.params[i]) << whole.names[i];
    } else if (std::is_same_v<T, float>) {
      EXPECT_LE(harness::rel_err(harness::comparable(whole.names[i], rest.params[i]),
                                 harness::comparable(whole.names[i], whole.params[i])),
                tol)
          << whole.names[i];
    }
  }
  EXPECT_EQ(rest.loss_scale, whole.loss_scale);
  EXPECT_EQ(rest.skipped, whole.skipped);
  return first;
}

}  // namespace

TEST(Resume, OnTheSameMeshEveryLaterLossAndWeightIsBitwiseTheUninterruptedRun) {
  expect_resume<float>({0, 0}, {0, 0}, 3, 6, true);
  for (int stage = 0; stage < 4; ++stage) expect_resume<float>({2, stage}, {2, stage}, 3, 6, true);
  expect_resume<fw::bf16>({3, 3}, {3, 3}, 2, 5, true);
  expect_resume<fw::bf16>({2, 1}, {2, 1}, 2, 5, true);
}

TEST(Resume, Fp16RestoresTheLossScalerItsSkippedStepsAndItsGrowth) {
  // A scale that overflows at first (skipped steps, back-offs) and grows every 2 clean steps.
  fw::LossScalerConfig sc;
  sc.init_scale = 524288.0f;  // 2^19: the first two steps overflow fp16, the scale backs off
  sc.growth_interval = 2;
  const Segment first = expect_resume<fw::fp16>({2, 2}, {2, 2}, 6, 10, true, sc);
  // The saved state is mid-flight: steps were skipped and steps were applied before the save.
  EXPECT_GT(first.skipped, 0);
  EXPECT_LT(first.skipped, 6);
  std::printf("fp16: %ld of the first 6 steps skipped, loss scale %g at the save\n", first.skipped,
              static_cast<double>(first.loss_scale));
}

TEST(Resume, OnAnotherMeshTheRunContinuesWithinTheCrossMeshTolerance) {
  expect_resume<float>({2, 3}, {3, 1}, 3, 6, false);  // dp2 ZeRO-3 -> dp3 ZeRO-1
  expect_resume<float>({4, 0}, {0, 0}, 3, 6, false);  // dp4 -> one rank
  expect_resume<float>({0, 0}, {4, 2}, 3, 6, false);  // one rank -> dp4 ZeRO-2
  expect_resume<fw::bf16>({3, 1}, {2, 3}, 2, 4, false);
}

namespace {

/// The bytes of a file.
std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// --save-async's library side: the state is copied at iteration 3, training goes on to 5 while
// the background write is held back, and then the files are written. They must hold the state
// of iteration 3 — byte for byte what a synchronous save at 3 writes, index included — and a
// resume from them must continue bitwise as the uninterrupted run. (A write that read the live
// state instead of its copy would hold iteration 5's values and fail both.)
template <class T>
void expect_async_save_is_the_sync_save(MeshSpec mesh) {
  SCOPED_TRACE(label(mesh));
  const Segment first = expect_resume<T>(mesh, mesh, 3, 6, true, {}, 2);
  const Segment whole = run<T>(Plan{mesh, 5, {}, {}});
  EXPECT_EQ(first.losses, whole.losses);  // saving asynchronously did not disturb the run
  const auto async_dir = scratch_path("ckpt") / "step-00000003";
  const auto sync_root = scratch("sync");
  (void)run<T>(Plan{mesh, 3, {}, sync_root});
  const auto sync_dir = sync_root / "step-00000003";
  std::vector<std::string> names, async_names;
  for (const auto& e : fs::directory_iterator(sync_dir)) {
    names.push_back(e.path().filename().string());
  }
  for (const auto& e : fs::directory_iterator(async_dir)) {
    async_names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  std::sort(async_names.begin(), async_names.end());
  EXPECT_EQ(async_names, names);
  EXPECT_EQ(names.size(), static_cast<std::size_t>(std::max(mesh.ranks, 1) + 1));
  for (const auto& n : names) {
    EXPECT_EQ(file_bytes(async_dir / n), file_bytes(sync_dir / n)) << n;
  }
}

}  // namespace

TEST(Resume, AnAsyncSaveHoldsItsStepsStateWhileTrainingContinuesAndResumesBitwise) {
  expect_async_save_is_the_sync_save<float>({0, 0});
  expect_async_save_is_the_sync_save<float>({2, 3});
  expect_async_save_is_the_sync_save<float>({3, 0});
  expect_async_save_is_the_sync_save<fw::bf16>({2, 1});
}

TEST(Resume, ACorruptSliceOrAnotherModelIsAnErrorOnEveryRank) {
  const auto root = scratch("bad");
  (void)run<float>(Plan{{2, 3}, 2, {}, root});
  const auto dir = *fw::latest_checkpoint(root);
  // Another model: a wider embedding. Every rank refuses before touching its state.
  Plan other{{2, 3}, 4, dir, {}};
  other.model.dim *= 2;
  auto seg = run<float>(other);
  for (const auto& e : seg.errors) {
    EXPECT_NE(e.find("resuming from " + dir.string() + " failed on rank(s) 0, 1"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("saved from another model"), std::string::npos) << e;
  }
  // One flipped bit in rank 1's file: only the ranks that read that slice see the checksum,
  // every rank fails.
  const auto file = dir / "rank-00001.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  seg = run<float>(Plan{{2, 3}, 4, dir, {}});
  for (const auto& e : seg.errors) {
    EXPECT_NE(e.find("failed on rank(s) 1"), std::string::npos) << e;
  }
  EXPECT_NE(seg.errors[1].find("checksum mismatch in " + file.string()), std::string::npos)
      << seg.errors[1];
}
