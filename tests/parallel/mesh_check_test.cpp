// check_mesh (train/mesh_check.hpp): the probe step recovers the gradient a plain backward
// computes; a correct 3D mesh passes in fp32 and bf16; a mesh that computes something else (one
// tensor perturbed on its ranks) fails, naming the tensor and the steps outside the bound.
// check_sharded: a model written here, from layers/, passes under ZeRO-3 and fails when its
// replicas start from different weights.
#include "fourway/train/mesh_check.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fourway/comm/local_world.hpp"
#include "fourway/layers/embedding.hpp"
#include "fourway/layers/gelu.hpp"
#include "fourway/layers/linear.hpp"
#include "fourway/mesh/groups.hpp"
#include "fourway/mesh/mesh.hpp"
#include "fourway/models/gpt2.hpp"
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

TEST(MeshCheck, ThreeAxesPassInBf16WithinBoundsMeasuredOnOneRank) {
  const fw::CheckReport r = check_3d<fw::bf16>();
  std::printf("%s", r.text().c_str());
  // derived from the one-rank bf16 run against itself (another micro-batch split), not the
  // precision's ceiling (2e-2 / 1e-1), which a mesh 5% wrong passed
  EXPECT_LT(r.bounds.loss, fw::CheckBounds::for_precision<fw::bf16>().loss / 10);
  EXPECT_LE(r.bounds.gradient, fw::CheckBounds::for_precision<fw::bf16>().gradient);
  EXPECT_GE(r.bounds.loss, fw::CheckBounds{}.loss);
  EXPECT_TRUE(r.ok());
}

/// Every rank's h.1.ln_2.weight 1% off: what a wrong slice looks like.
template <class T>
void one_percent_off(const fw::Context<fw::Host>&, auto& chunk) {
  chunk.visit_parameters([](fw::Parameter<T, fw::Host>& p) {
    if (p.name == "h.1.ln_2.weight")
      for (std::int64_t k = 0; k < p.numel(); ++k)
        p.weight[k] = fw::convert<T>(fw::convert<float>(p.weight[k]) * 1.01f);
  });
}

// Every weight of the mesh 5% off, which the ceiling bounds passed. (1% off — 1.0078 once
// stored in bf16 — changes this toy model's losses by 1e-5 to 8e-5, as much as a correct bf16
// tensor-parallel mesh's reordered sums do: below what a bf16 check of it can tell apart.)
TEST(MeshCheck, ABf16MeshFivePercentOffFails) {
  const fw::CheckReport r = check_3d<fw::bf16>([](const fw::Context<fw::Host>&, auto& chunk) {
    chunk.visit_parameters([](fw::Parameter<fw::bf16, fw::Host>& p) {
      for (std::int64_t k = 0; k < p.numel(); ++k)
        p.weight[k] = fw::convert<fw::bf16>(fw::convert<float>(p.weight[k]) * 1.05f);
    });
  });
  std::printf("%s", r.text().c_str());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.text().find("check FAILED"), std::string::npos);
}

TEST(MeshCheck, AMeshThatComputesSomethingElseFails) {
  const fw::CheckReport r = check_3d<float>(
      [](const fw::Context<fw::Host>& c, auto& chunk) { one_percent_off<float>(c, chunk); });
  std::printf("%s", r.text().c_str());
  EXPECT_FALSE(r.ok());
  EXPECT_GT(r.worst_loss_difference(), 1e-5);
  EXPECT_NE(r.text().find("OUTSIDE"), std::string::npos);
  EXPECT_NE(r.text().find("check FAILED"), std::string::npos);
}

}  // namespace

// ---- check_sharded: a model of the user's own -------------------------------------------------

namespace {

/// A model written here, not in the library: token + position embedding, one residual MLP, an
/// untied head, mean cross-entropy. Three FSDP units: embedding, MLP, head.
template <class T, class B>
class TinyLm {
 public:
  using value_type = T;
  using backend_type = B;
  struct Stash {
    typename fw::Embedding<T, B>::Stash emb;
    typename fw::Linear<T, B>::Stash up, down, head;
    typename fw::Gelu<T, B>::Stash gelu;
    fw::Tensor<T, B> y;  // x + mlp(x)
    fw::Tensor<std::int32_t, B> targets;
    fw::Tensor<float, B> losses;
  };
  TinyLm(const fw::Context<B>& ctx, std::uint64_t seed)
      : emb_(ctx, kV, kT, kC, seed),
        up_(ctx, "mlp.up", kC, 4 * kC, seed + 1),
        down_(ctx, "mlp.down", 4 * kC, kC, seed + 2),
        head_(ctx, "head", kC, kV, seed + 3, 0.02f, false) {}

  [[nodiscard]] int units() const { return 3; }
  template <class F>
  void visit_parameters(F&& f) {
    emb_.visit_parameters(f);
    up_.visit_parameters(f);
    down_.visit_parameters(f);
    head_.visit_parameters(f);
  }
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    if (u == 0) emb_.visit_parameters(f);
    if (u == 1) {
      up_.visit_parameters(f);
      down_.visit_parameters(f);
    }
    if (u == 2) head_.visit_parameters(f);
  }
  template <class Hooks>
  float forward(const fw::Context<B>& ctx, const fw::Tensor<std::int32_t, B>& tokens,
                const fw::Tensor<std::int32_t, B>& targets, Stash& s, Hooks&& hooks) {
    hooks.pre_forward(0);
    const fw::Tensor<T, B> x = emb_.forward(ctx, tokens, s.emb);
    hooks.post_forward(0);
    hooks.pre_forward(1);
    const fw::Tensor<T, B> h =
        down_.forward(ctx, gelu_.forward(ctx, up_.forward(ctx, x, s.up), s.gelu), s.down);
    s.y = fw::detail::activation<T, B>(ctx, x.shape());
    fw::Ops<B>::residual_forward(ctx, s.y.data(), x.data(), h.data(), x.numel());
    hooks.post_forward(1);
    hooks.pre_forward(2);
    const fw::Tensor<T, B> logits = head_.forward(ctx, s.y, s.head);
    const std::int64_t rows = targets.numel();
    s.targets = targets.view();
    s.losses = fw::detail::activation<float, B>(ctx, fw::Shape{rows});
    fw::Ops<B>::cross_entropy_forward(ctx, s.losses.data(), logits.data(), targets.data(), rows,
                                      kV);
    double sum = 0;
    for (std::int64_t i = 0; i < rows; ++i) sum += s.losses[i];
    hooks.post_forward(2);
    return static_cast<float>(sum / static_cast<double>(rows));
  }
  template <class Hooks>
  void backward(const fw::Context<B>& ctx, Stash& s, float grad_scale, Hooks&& hooks) {
    const std::int64_t rows = s.targets.numel();
    hooks.pre_backward(2);
    fw::Tensor<T, B> dlogits = fw::detail::workspace<T, B>(ctx, s.head.y.shape());
    fw::Ops<B>::cross_entropy_backward(ctx, dlogits.data(), s.head.y.data(), s.targets.data(), rows,
                                       kV, grad_scale / static_cast<float>(rows));
    const fw::Tensor<T, B> dy = head_.backward(ctx, dlogits, s.head);
    hooks.post_backward(2);
    hooks.pre_backward(1);
    const fw::Tensor<T, B> dmlp =
        up_.backward(ctx, gelu_.backward(ctx, down_.backward(ctx, dy, s.down), s.gelu), s.up);
    fw::Tensor<T, B> dx = fw::detail::workspace<T, B>(ctx, dy.shape());
    fw::Ops<B>::residual_forward(ctx, dx.data(), dy.data(), dmlp.data(), dy.numel());
    hooks.post_backward(1);
    hooks.pre_backward(0);
    (void)emb_.backward(ctx, dx, s.emb);
    hooks.post_backward(0);
    s = Stash{};
  }

  static constexpr std::int64_t kV = 37, kT = 9, kC = 16;

 private:
  fw::Embedding<T, B> emb_;
  fw::Linear<T, B> up_, down_, head_;
  fw::Gelu<T, B> gelu_;
};

/// A LocalComm whose asynchronous all-reduces of more than 16 elements (the gradient buckets)
/// do nothing: a data-parallel step that drops its gradient reduction.
class DroppingComm : public fw::LocalComm {
 public:
  explicit DroppingComm(fw::LocalComm c) : fw::LocalComm(std::move(c)) {}
  template <fw::comm_element T>
  fw::Work all_reduce_async(const T* s, T* r, std::int64_t n, fw::ReduceOp op,
                            fw::CallOptions o = {}) {
    if (n > 16) return fw::Work{};
    return fw::LocalComm::all_reduce_async(s, r, n, op, o);
  }
  DroppingComm split(int color, int key, std::string name = {}) {
    return DroppingComm(fw::LocalComm::split(color, key, std::move(name)));
  }
};
static_assert(fw::communicator<DroppingComm>);

template <int Stage, class T = float, class Comm = fw::LocalComm>
fw::CheckReport check_tiny_lm(bool replicas_disagree) {
  fw::CheckReport out;
  std::vector<fw::TokenBatch> batches;
  for (int s = 0; s < 3; ++s) batches.push_back(harness::batch(s, 8));
  fw::launch<fw::LocalWorld>(4, [&](fw::World<fw::LocalWorld>& w) {
    // replicas that start from other weights: what a missing broadcast at start looks like
    const std::uint64_t seed = replicas_disagree ? 7u + static_cast<unsigned>(w.rank()) : 7u;
    fw::CheckOptions co;
    co.steps = 3;
    Comm dp(w.comm().split(0, w.rank(), "dp"));
    const auto r = fw::check_sharded<Stage, fw::Precision<T>>(
        w.ctx(), dp, [&](const fw::Context<fw::Host>& c) { return TinyLm<T, fw::Host>(c, seed); },
        harness::adamw(1e-3f), fw::TrainerOptions{},
        [&](int s) { return batches[static_cast<std::size_t>(s)].view(); }, co);
    if (w.rank() == 0) out = r;
  });
  return out;
}

TEST(MeshCheck, AModelOfYourOwnUnderZero3Passes) {
  static_assert(fw::trainable_model<TinyLm<float, fw::Host>>);
  const fw::CheckReport r = check_tiny_lm<3>(false);
  std::printf("%s", r.text().c_str());
  ASSERT_EQ(r.tensors.size(), 7u);  // wte, wpe, up w/b, down w/b, head w
  EXPECT_TRUE(r.ok());
  EXPECT_LE(r.gradient_difference[r.worst_tensor()], 1e-4);
}

TEST(MeshCheck, ADroppedGradientAllReduceFailsInFp32AndBf16) {
  for (const auto& r : {check_tiny_lm<0, float, DroppingComm>(false),
                        check_tiny_lm<0, fw::bf16, DroppingComm>(false)}) {
    std::printf("%s", r.text().c_str());
    EXPECT_FALSE(r.ok());
  }
  EXPECT_TRUE((check_tiny_lm<0, fw::bf16>(false).ok())) << "the control: nothing dropped";
}

TEST(MeshCheck, AModelOfYourOwnWithReplicasThatDisagreeFails) {
  const fw::CheckReport r = check_tiny_lm<1>(true);
  std::printf("%s", r.text().c_str());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.text().find("check FAILED"), std::string::npos);
}

}  // namespace
