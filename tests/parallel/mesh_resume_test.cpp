// Checkpoints of any mesh (train/resume.hpp over MeshStrategy): train k steps on a mesh, save,
// resume on the same mesh or another, continue. On the mesh that saved, every later loss and
// every unsplit parameter equals the uninterrupted run bit for bit (tensor, pipeline and 3D
// meshes, every ZeRO stage, fp32, bf16 and fp16 with its loss scaler); on another mesh (dp4 ->
// tp2·pp2, tp2·pp2·dp2 ZeRO-3 -> dp8, pp3 -> pp2·dp3, tp2 -> pp2 ZeRO-2, ...) within the
// equivalence matrix's tolerance. The index of a tensor-parallel checkpoint holds strided slices
// that cover every tensor once, and no rank reads the whole model when it resumes; the runs of
// train/state_runs.hpp map every element as the model's view (layers/state_view.hpp) says.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "fourway/comm/local_world.hpp"
#include "fourway/layers/state_view.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/train/mesh_strategy.hpp"
#include "fourway/train/resume.hpp"
#include "fourway/train/state_runs.hpp"
#include "fourway/train/trainer.hpp"
#include "parallel_harness.hpp"

namespace {

namespace fs = std::filesystem;

constexpr float kLr = 1e-3f;  // as the equivalence matrix: rounding stays near 1e-7 relative

fs::path scratch(const std::string& name) {
  const auto dir =
      fs::temp_directory_path() / ("fourway_mesh_resume_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct MeshCase {
  int tp = 1;
  int cp = 1;
  int pp = 1;
  int dp = 1;
  int zero = 0;
  int micro_batches = 1;  // pipelines
  [[nodiscard]] int ranks() const { return tp * cp * pp * dp; }
  [[nodiscard]] std::string name() const {
    return fw::detail::cat("tp", tp, cp > 1 ? fw::detail::cat("·cp", cp) : "", "·pp", pp, "·dp", dp,
                           " zero", zero);
  }
};

struct Plan {
  MeshCase mesh;
  int until = 0;       // train until this iteration
  fs::path resume;     // resume from here first (empty: start fresh)
  fs::path save_root;  // save at the end (empty: no save)
  fw::LossScalerConfig scaler{};
  bool long_sequences = false;  // harness::long_gpt() on long_batch() (context parallelism)
};

struct Segment {
  std::vector<float> losses;                         // rank 0's, of the steps run
  std::map<std::string, std::vector<float>> params;  // the unsplit model at the end
  long iteration = 0;                                // after the resume
  float loss_scale = 0;
  long skipped = 0;
  std::vector<std::string> errors;
};

template <class MeshT, class T>
Segment run_mesh(const Plan& p) {
  using Comm = fw::LocalComm;
  using S = fw::MeshStrategy<MeshT, fw::Precision<T>, fw::Host, Comm>;
  const MeshCase& c = p.mesh;
  Segment out;
  out.errors.resize(static_cast<std::size_t>(c.ranks()));
  std::mutex mu;
  fw::launch<fw::LocalWorld>(c.ranks(), [&](fw::World<fw::LocalWorld>& w) {
    const MeshT mesh(w.size(), {.tp = c.tp, .cp = c.cp, .pp = c.pp});
    fw::MeshGroups<Comm> groups(mesh, w.comm());
    fw::MeshOptions mo;
    mo.pipeline.micro_batches = c.micro_batches;
    mo.sharded.bucket_bytes = 512;
    fw::TrainerOptions to;
    to.micro_batches = c.pp > 1 ? c.micro_batches : 1;
    to.loss_scaler = p.scaler;
    fw::Trainer<S> t(to, w.ctx(), mesh, groups,
                     p.long_sequences ? harness::long_gpt() : harness::mesh_gpt(), harness::kSeed,
                     mo, harness::adamw(kLr));
    const auto rank = static_cast<std::size_t>(w.rank());
    if (!p.resume.empty()) {
      try {
        (void)fw::resume_checkpoint(t, w.comm(), p.resume);
      } catch (const fw::CheckpointError& e) {
        out.errors[rank] = e.what();
        return;
      }
    }
    std::vector<float> losses;
    for (long s = t.iteration(); s < p.until; ++s) {
      const int step = static_cast<int>(s);
      losses.push_back(
          t.step((p.long_sequences ? harness::long_batch(step) : harness::batch(step)).view()));
    }
    if (!p.save_root.empty()) {
      (void)fw::save_checkpoint(t, w.comm(), fw::CheckpointOptions{p.save_root, 0, {}, {}});
    }
    const auto full = t.strategy().full_parameters();
    std::lock_guard lock(mu);
    if (w.rank() == 0) {
      out.losses = losses;
      out.iteration = t.iteration() - static_cast<long>(losses.size());
      out.loss_scale = t.loss_scaler().scale();
      out.skipped = t.loss_scaler().skipped_steps();
      for (const auto& nt : full) out.params[nt.name] = nt.values;
    }
  });
  return out;
}

template <class T, int Z>
Segment run_zero(const Plan& p) {
  const MeshCase& c = p.mesh;
  if (c.cp > 1) {  // a cp mesh: the tensor-parallel and pipeline cases the tests below use
    if (c.pp > 1) return run_mesh<fw::dynamic_mesh_t<false, true, Z, true>, T>(p);
    return run_mesh<fw::dynamic_mesh_t<false, false, Z, true>, T>(p);
  }
  if (c.tp > 1 && c.pp > 1) return run_mesh<fw::dynamic_mesh_t<true, true, Z>, T>(p);
  if (c.tp > 1) return run_mesh<fw::dynamic_mesh_t<true, false, Z>, T>(p);
  if (c.pp > 1) return run_mesh<fw::dynamic_mesh_t<false, true, Z>, T>(p);
  return run_mesh<fw::dynamic_mesh_t<false, false, Z>, T>(p);
}

template <class T>
Segment run(const Plan& p) {
  switch (p.mesh.zero) {
    case 1: return run_zero<T, 1>(p);
    case 2: return run_zero<T, 2>(p);
    case 3: return run_zero<T, 3>(p);
    default: return run_zero<T, 0>(p);
  }
}

/// Uninterrupted on `to` for `total` steps against `k` steps on `from`, saved, resumed on `to`.
/// Bitwise on the same mesh; across meshes fp32 losses and unsplit parameters within 1e-5
/// relative (the key bias by its own bound, harness::comparable), bf16 losses within 1e-3.
template <class T>
Segment expect_resume(MeshCase from, MeshCase to, int k, int total, bool bitwise,
                      fw::LossScalerConfig scaler = {}) {
  SCOPED_TRACE(from.name() + " -> " + to.name());
  const auto root = scratch("ckpt");
  const bool long_sequences = from.cp > 1 || to.cp > 1;
  const Segment whole = run<T>(Plan{to, total, {}, {}, scaler, long_sequences});
  const Segment first = run<T>(Plan{from, k, {}, root, scaler, long_sequences});
  const Segment rest = run<T>(Plan{to, total, root, {}, scaler, long_sequences});
  for (const auto& e : rest.errors) EXPECT_EQ(e, "");
  if (!rest.errors[0].empty()) return first;
  EXPECT_EQ(rest.iteration, k);
  EXPECT_EQ(first.losses.size() + rest.losses.size(), whole.losses.size());
  EXPECT_EQ(rest.params.size(), whole.params.size());
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
  for (const auto& [name, want] : whole.params) {
    const auto it = rest.params.find(name);
    EXPECT_NE(it, rest.params.end()) << name;
    if (it == rest.params.end()) continue;
    if (bitwise) {
      EXPECT_EQ(it->second, want) << name;
    } else if (std::is_same_v<T, float>) {
      EXPECT_LE(
          harness::rel_err(harness::comparable(name, it->second), harness::comparable(name, want)),
          tol)
          << name;
      harness::expect_key_bias_within(name, it->second, want, 2.0 * kLr * total, "resumed");
    }
  }
  EXPECT_EQ(rest.loss_scale, whole.loss_scale);
  EXPECT_EQ(rest.skipped, whole.skipped);
  return first;
}

}  // namespace

TEST(MeshResume, OnTheSameMeshEveryLaterLossAndParameterIsBitwiseTheUninterruptedRun) {
  expect_resume<float>({.tp = 2, .pp = 2, .dp = 2, .zero = 1, .micro_batches = 2},
                       {.tp = 2, .pp = 2, .dp = 2, .zero = 1, .micro_batches = 2}, 3, 6, true);
  expect_resume<float>({.tp = 2, .dp = 2, .zero = 3}, {.tp = 2, .dp = 2, .zero = 3}, 3, 6, true);
  expect_resume<float>({.tp = 4}, {.tp = 4}, 3, 6, true);
  expect_resume<float>({.pp = 3, .zero = 0, .micro_batches = 3},
                       {.pp = 3, .zero = 0, .micro_batches = 3}, 3, 6, true);
  expect_resume<float>({.tp = 2, .pp = 2, .zero = 2, .micro_batches = 2},
                       {.tp = 2, .pp = 2, .zero = 2, .micro_batches = 2}, 2, 5, true);
  expect_resume<fw::bf16>({.tp = 2, .pp = 2, .dp = 2, .zero = 3, .micro_batches = 2},
                          {.tp = 2, .pp = 2, .dp = 2, .zero = 3, .micro_batches = 2}, 2, 5, true);
}

TEST(MeshResume, Fp16OnATensorParallelPipelineRestoresTheLossScaler) {
  fw::LossScalerConfig sc;
  sc.init_scale = 524288.0f;  // 2^19: the first steps overflow fp16, the scale backs off
  sc.growth_interval = 2;
  const Segment first =
      expect_resume<fw::fp16>({.tp = 2, .pp = 2, .zero = 1, .micro_batches = 2},
                              {.tp = 2, .pp = 2, .zero = 1, .micro_batches = 2}, 5, 9, true, sc);
  EXPECT_GT(first.skipped, 0);
  EXPECT_LT(first.skipped, 5);
}

TEST(MeshResume, OnAnotherMeshTheRunContinuesWithinTheCrossMeshTolerance) {
  expect_resume<float>({.dp = 4}, {.tp = 2, .pp = 2, .micro_batches = 2}, 3, 6, false);
  expect_resume<float>({.tp = 2, .pp = 2, .dp = 2, .zero = 3, .micro_batches = 2}, {.dp = 8}, 3, 6,
                       false);
  expect_resume<float>({.pp = 3, .micro_batches = 3}, {.pp = 2, .dp = 3, .micro_batches = 2}, 3, 6,
                       false);
  expect_resume<float>({.tp = 2}, {.pp = 2, .zero = 2, .micro_batches = 2}, 3, 6, false);
  expect_resume<float>({.tp = 4, .dp = 2, .zero = 1}, {.tp = 2, .dp = 3, .zero = 3}, 3, 6, false);
  expect_resume<fw::bf16>({.tp = 2, .pp = 2, .dp = 2, .zero = 2, .micro_batches = 2},
                          {.dp = 2, .zero = 1}, 2, 4, false);
}

// Context parallelism (issue 48): a cp2·dp2 ZeRO-3 checkpoint resumes bitwise on its own mesh and
// within the cross-mesh tolerance on dp 4 and on a pipeline with cp (the shards are over cp × dp).
TEST(MeshResume, ContextParallelMeshesSaveAndResume) {
  expect_resume<float>({.cp = 2, .dp = 2, .zero = 3}, {.cp = 2, .dp = 2, .zero = 3}, 3, 6, true);
  expect_resume<float>({.cp = 2, .dp = 2, .zero = 3}, {.dp = 4}, 3, 6, false);
  expect_resume<float>({.dp = 2, .zero = 1}, {.cp = 2, .pp = 2, .zero = 2, .micro_batches = 2}, 3,
                       6, false);
}

TEST(MeshResume, ATensorParallelCheckpointHoldsStridedSlicesThatCoverEveryTensorOnce) {
  const auto root = scratch("layout");
  (void)run<float>(Plan{{.tp = 2, .pp = 2, .dp = 2, .zero = 1, .micro_batches = 2}, 2, {}, root});
  auto d = fw::StateDir::open(root / "step-00000002");  // the index's coverage check passed
  EXPECT_EQ(d.index().files.size(), 8u);
  // Every element once: the slices hold three values (master, two moments) per parameter of
  // the unsplit model, vocabulary padding and replicas excluded.
  fw::MemoryAccountant mem(0);
  fw::Context<fw::Host> ctx(mem);
  const fw::DeferredInit shapes_only;
  fw::models::Gpt<float, fw::Host> whole(ctx, harness::mesh_gpt(), harness::kSeed);
  std::int64_t numel = 0;
  whole.visit_parameters([&](fw::Parameter<float, fw::Host>& p) {
    numel += p.numel();
    const fw::StateTensor* t = d.index().tensor(p.name);
    ASSERT_NE(t, nullptr) << p.name;
    EXPECT_EQ(t->numel(), p.numel()) << p.name;
  });
  std::int64_t values = 0;
  int strided = 0;
  for (const auto& f : d.index().files) {
    for (const auto& s : f.slices) {
      values += s.values();
      strided += s.rows > 1 ? 1 : 0;
    }
  }
  EXPECT_EQ(values, 3 * numel);
  EXPECT_GT(strided, 0);  // column slices of c_attn and c_fc are boxes
  // A rank that resumes tp2·pp2·dp2 reads its slices, not the model: under a quarter of the bytes
  // (each rank holds an eighth, plus the rest of the slices it overlaps and the file headers).
  std::uint64_t most = 0;
  fw::launch<fw::LocalWorld>(8, [&](fw::World<fw::LocalWorld>& w) {
    using S = fw::MeshStrategy<fw::dynamic_mesh_t<true, true, 1>, fw::Precision<float>, fw::Host,
                               fw::LocalComm>;
    const fw::dynamic_mesh_t<true, true, 1> mesh(w.size(), {.tp = 2, .pp = 2});
    fw::MeshGroups<fw::LocalComm> groups(mesh, w.comm());
    fw::MeshOptions mo;
    mo.pipeline.micro_batches = 2;
    fw::TrainerOptions to;
    to.micro_batches = 2;
    fw::Trainer<S> t(to, w.ctx(), mesh, groups, harness::mesh_gpt(), harness::kSeed, mo,
                     harness::adamw(kLr));
    auto dir = fw::StateDir::open(root / "step-00000002");
    t.strategy().load_state(
        2, [&](const std::string& tensor, std::int64_t first, std::int64_t n, float* host) {
          dir.read(tensor, first, n, [&](std::int64_t off, std::span<const float> v) {
            std::copy(v.begin(), v.end(), host + off);
          });
        });
    static std::mutex mu;
    std::lock_guard lock(mu);
    most = std::max(most, dir.bytes_read());
  });
  EXPECT_LT(most, d.index().total_bytes() / 4);
  std::printf("the most one rank read: %llu of %llu B\n", static_cast<unsigned long long>(most),
              static_cast<unsigned long long>(d.index().total_bytes()));
}

// train/state_runs.hpp against an element-by-element reference: a ZeRO shard of a tp column slice
// (layers/state_view.hpp, `tp::Placement::state_view`) that starts and ends mid-row becomes runs
// whose elements map local -> global exactly as the view's blocks do, each element once; loading
// puts a padding run first when the view leaves elements out.
TEST(StateRuns, AShardOfAColumnSliceMapsEveryElementAsTheViewSays) {
  struct ColumnModel {  // one parameter: rank 1 of 2 of a (5, 12) q|k|v column split
    fw::tp::Placement pl;
    [[nodiscard]] fw::StateView state_view(int) const { return pl.state_view(2, 1); }
  };
  ColumnModel model;
  model.pl.name = "w";
  model.pl.split = fw::tp::Split::column;
  model.pl.rows = 5;
  model.pl.cols = 12;
  model.pl.parts = 3;
  model.pl.matrix = true;
  fw::MemoryAccountant mem(0);
  fw::Context<fw::Host> ctx(mem);
  fw::Parameter<float, fw::Host> p(ctx, "w", fw::Shape{5, 6});
  const fw::OwnedRun<float, fw::Host> owned{&p, 4, 19, 0, 100, p.weight.data() + 4, 0};  // [4, 23)
  // the reference: local element e of the slice is global column block k, row i
  std::map<std::int64_t, std::int64_t> want;  // local -> global
  for (std::int64_t e = 4; e < 23; ++e) {
    const std::int64_t i = e / 6, k = (e % 6) / 2, j = e % 2;
    want[e] = i * 12 + k * 4 + 2 + j;
  }
  std::map<std::int64_t, std::int64_t> got;
  int strided = 0;
  for (const auto& r : fw::state_runs(model, std::vector{owned}, true)) {
    EXPECT_EQ(r.tensor, "w");
    EXPECT_EQ(r.shape, (std::vector<std::int64_t>{5, 12}));
    EXPECT_FALSE(r.padding);
    strided += r.rows > 1 ? 1 : 0;
    for (std::int64_t i = 0; i < r.rows; ++i) {
      for (std::int64_t j = 0; j < r.count; ++j) {
        const std::int64_t local = r.at - 100 + 4 + i * r.local_stride + j;
        EXPECT_EQ(r.weights + i * r.local_stride + j, p.weight.data() + local);
        EXPECT_TRUE(got.emplace(local, r.first + i * r.stride + j).second) << "twice: " << local;
      }
    }
  }
  EXPECT_EQ(got, want);
  EXPECT_GT(strided, 0);  // whole rows of a block travel as one strided run
  // A view that leaves elements out (vocabulary padding) loads a zero run first.
  model.pl.split = fw::tp::Split::vocab;
  model.pl.rows = 3;  // 3 real rows of 4 padded, rank 1 holds rows [2, 4): row 3 is padding
  model.pl.cols = 6;
  model.pl.padded_rows = 4;
  fw::Parameter<float, fw::Host> v(ctx, "w", fw::Shape{2, 6});
  const fw::OwnedRun<float, fw::Host> all{&v, 0, 12, 0, 0, v.weight.data(), 0};
  const auto loads = fw::state_runs(model, std::vector{all}, false);
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_TRUE(loads[0].padding);
  EXPECT_EQ(loads[0].count, 12);
  EXPECT_EQ(loads[1].first, 12);
  EXPECT_EQ(loads[1].count, 6);
  EXPECT_EQ(fw::state_runs(model, std::vector{all}, true).size(), 1u);
}
