// check_mesh (train/mesh_check.hpp): the probe step recovers the gradient a plain backward
// computes; a correct 3D mesh passes in fp32 and bf16; a mesh that computes something else (one
// tensor perturbed on its ranks) fails, naming the tensor and the steps outside the bound.
#include "fourway/train/mesh_check.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fourway/comm/local_world.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "parallel_harness.hpp"

namespace {

using Mesh3 = fw::Mesh<fw::TensorParallel<fw::dynamic>, fw::Pipeline<fw::dynamic, fw::dynamic>,
                       fw::Sharded<1>>;

fw::models::GptConfig model() {
  fw::models::GptConfig c = harness::tiny_gpt();
  c.layers = 2;
  c.heads = 4;
  c.dim = 16;
  return c;
}

template <class T>
fw::CheckReport check_3d(const typename fw::MeshStrategy<Mesh3, fw::Precision<T>, fw::Host,
                                                         fw::LocalComm>::loader& load = {}) {
  fw::CheckReport out;
  std::vector<fw::TokenBatch> batches;
  for (int s = 0; s < 4; ++s) batches.push_back(harness::batch(s, 8));
  fw::launch<fw::LocalWorld>(8, [&](fw::World<fw::LocalWorld>& w) {
    const Mesh3 mesh(w.size(), {.tp = 2, .pp = 2});
    fw::MeshGroups<fw::LocalComm> groups(mesh, w.comm());
    fw::MeshOptions mo;
    mo.pipeline.micro_batches = 2;
    fw::TrainerOptions to;
    to.micro_batches = 2;
    fw::CheckOptions co;
    co.steps = 4;
    const auto r = fw::check_mesh<Mesh3, fw::Precision<T>>(
        w.ctx(), mesh, groups, w.comm(), model(), harness::kSeed, mo, harness::adamw(1e-3f), to,
        [&](int s) { return batches[static_cast<std::size_t>(s)].view(); }, co, load);
    if (w.rank() == 0) out = r;
    EXPECT_EQ(r.one_rank_loss, out.one_rank_loss.empty() ? r.one_rank_loss : out.one_rank_loss)
        << "every rank returns rank 0's report";
  });
  return out;
}

TEST(MeshCheck, ProbeStepRecoversTheGradient) {
  // the gradient of one backward on one rank, against (w0 - w1) / K of the probe step
  fw::MemoryAccountant mem(0);
  fw::Context<fw::Host> ctx(mem);
  using G = fw::models::Gpt<float, fw::Host>;
  G direct(ctx, model(), harness::kSeed);
  const fw::TokenBatch b = harness::batch(0, 8);
  fw::zero_grad(ctx, direct);
  typename G::Stash s;
  const auto tokens = fw::Tensor<std::int32_t, fw::Host>::view_of(
      const_cast<std::int32_t*>(b.inputs.data()), fw::Shape{8, harness::kSeq});
  const auto targets = fw::Tensor<std::int32_t, fw::Host>::view_of(
      const_cast<std::int32_t*>(b.targets.data()), fw::Shape{8, harness::kSeq});
  direct.forward(ctx, tokens, targets, s);
  direct.backward(ctx, s);
  std::vector<fw::NamedTensor> before, after;
  G probed(ctx, model(), harness::kSeed);
  const auto snap = [&](std::vector<fw::NamedTensor>& out) {
    probed.visit_parameters([&](fw::Parameter<float, fw::Host>& p) {
      out.push_back({p.name, std::vector<float>(p.weight.data(), p.weight.data() + p.numel())});
    });
  };
  snap(before);
  {
    fw::Trainer<fw::SingleRank<G, fw::Precision<float>, fw::Host>> t(
        fw::TrainerOptions{}, ctx, probed, fw::detail::probe_adamw());
    fw::detail::probe_step(t, b.view());
  }
  snap(after);
  const auto g = fw::detail::difference_over_k(before, after);
  std::size_t i = 0;
  direct.visit_parameters([&](fw::Parameter<float, fw::Host>& p) {
    const std::vector<float> want(p.grad.data(), p.grad.data() + p.numel());
    double num = 0, den = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
      num += (double(g[i][k]) - want[k]) * (double(g[i][k]) - want[k]);
      den += double(want[k]) * want[k];
    }
    if (den > 0) {
      EXPECT_LE(std::sqrt(num / den), 1e-5) << p.name;
    } else {
      EXPECT_LE(std::sqrt(num), 1e-6) << p.name << ": the probe's gradient of a zero gradient";
    }
    ++i;
  });
  EXPECT_EQ(i, g.size());
}

TEST(MeshCheck, ThreeAxesPassInFp32) {
  const fw::CheckReport r = check_3d<float>();
  std::printf("%s", r.text().c_str());
  ASSERT_EQ(r.mesh_loss.size(), 4u);
  ASSERT_EQ(r.tensors.size(), 4u + 12u * 2u);
  EXPECT_TRUE(r.ok());
  EXPECT_LE(r.worst_loss_difference(), 1e-5);
  EXPECT_LE(r.gradient_difference[r.worst_tensor()], 1e-4);
  EXPECT_NE(r.text().find("check passed"), std::string::npos);
}

TEST(MeshCheck, ThreeAxesPassInBf16) {
  const fw::CheckReport r = check_3d<fw::bf16>();
  std::printf("%s", r.text().c_str());
  EXPECT_EQ(r.bounds.loss, fw::CheckBounds::for_precision<fw::bf16>().loss);
  EXPECT_TRUE(r.ok());
}

TEST(MeshCheck, AMeshThatComputesSomethingElseFails) {
  // every rank's h.1.ln_2.weight 1% off: what a wrong slice or a dropped reduction looks like
  const fw::CheckReport r = check_3d<float>([](const fw::Context<fw::Host>&, auto& chunk) {
    chunk.visit_parameters([](fw::Parameter<float, fw::Host>& p) {
      if (p.name == "h.1.ln_2.weight")
        for (std::int64_t k = 0; k < p.numel(); ++k) p.weight[k] *= 1.01f;
    });
  });
  std::printf("%s", r.text().c_str());
  EXPECT_FALSE(r.ok());
  EXPECT_GT(r.worst_loss_difference(), 1e-5);
  EXPECT_NE(r.text().find("OUTSIDE"), std::string::npos);
  EXPECT_NE(r.text().find("check FAILED"), std::string::npos);
}

}  // namespace
