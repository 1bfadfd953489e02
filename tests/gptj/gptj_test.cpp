// The third model (examples/gptj/): a GPT-J-style parallel-block decoder with grouped-query
// attention and rotary embeddings, written on the tensor-parallel-ready layers and fw::Decoder
// with no tensor-parallel or pipeline code of its own. Its backward against central finite
// differences (fw::check_gradients), then every mesh of the equivalence matrix that applies to it
// against the one-rank run (fw::check_mesh), then the program's --check.
#include "gptj.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fourway/fourway.hpp"
#include "support/gradcheck.hpp"
#include "support/program.hpp"

namespace fw = fourway;
using Host = fw::Host;

namespace {

gptj::Config config() {
  gptj::Config c;
  c.vocab = 37;  // not a multiple of 2 or 4: padded vocabulary slices
  c.dim = 32;
  c.heads = 4;
  c.kv_heads = 2;
  c.layers = 2;
  c.max_seq = 8;
  return c;
}

}  // namespace

// The block (attention and MLP in parallel, grouped-query heads, rotary q and k) and the whole
// model's loss against finite differences in double (docs/layers.md: a correct backward lands
// near 1e-3 for a layer; a model's float loss limits it to a few percent).
TEST(Gptj, BackwardMatchesFiniteDifferences) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  gptj::Block<float, Host, fw::Alone> block(ctx, config(), 0, fw::TpGroup<>{}, 3);
  (void)fw::test::randomize_parameters(ctx, block, 5, 0.3);
  fw::Tensor<float, Host> x(fw::Shape{2, 4, 32}, fw::MemTag::activations, mem);
  fw::test::upload(ctx, x, fw::test::randn(static_cast<std::size_t>(x.numel()), 9));
  const auto r = fw::check_gradients(ctx, block, x);
  EXPECT_TRUE(r.within(1e-2)) << r.str();
  EXPECT_EQ(r.tensors.size(), 13u) << r.str();  // ln_1, q, kv, out, fc_in, fc_out (2 each), x

  fw::launch<fw::LocalWorld>(1, [](fw::World<fw::LocalWorld>& w) {
    gptj::Model<float, Host, fw::LocalComm> model(w.ctx(), config(), w.comm(), 1);
    (void)fw::test::randomize_parameters(w.ctx(), model, 8, 0.5);
    fw::Tensor<std::int32_t, Host> tokens(fw::Shape{2, 4}, fw::MemTag::activations, w.memory());
    fw::Tensor<std::int32_t, Host> targets(fw::Shape{2, 4}, fw::MemTag::activations, w.memory());
    for (std::int64_t i = 0; i < 8; ++i) {
      tokens[i] = static_cast<std::int32_t>((3 * i + 1) % 37);
      targets[i] = static_cast<std::int32_t>((7 * i + 2) % 37);
    }
    fw::NoHooks hooks;
    // the loss is a float: its rounding over the step is the finite differences' resolution
    // (docs/layers.md), so a wide step, and gradients below 5% of their tensor's largest judged
    // against that largest; the block above is the precise check
    fw::GradientCheckOptions o;
    o.step = 1e-2;
    o.floor = 5e-2;
    const auto m = fw::check_gradients(w.ctx(), model, tokens, targets, hooks, o);
    EXPECT_TRUE(m.within(6e-2)) << m.str();
    EXPECT_EQ(m.tensors.size(), 1u + 12u * 2 + 3u) << m.str();  // wte, 12 per block, ln_f, head
  });
}

namespace {

struct Case {
  int tp = 1, pp = 1, dp = 1, zero = 0, micro_batches = 1, cp = 1;
  fw::schedule::Kind schedule = fw::schedule::Kind::one_f_one_b;
  bool checkpoint = false;
  bool sequence_parallel = false;
  [[nodiscard]] std::string name() const {
    return fw::detail::cat("tp", tp, " cp", cp, " pp", pp, " dp", dp, " zero", zero, " M",
                           micro_batches, " ", fw::schedule::kind_name(schedule),
                           checkpoint ? " checkpointed" : "",
                           sequence_parallel ? " sequence-parallel" : "");
  }
};

template <class MeshT>
fw::CheckReport check(const Case& c) {
  constexpr std::int64_t B = 8, T = 8;
  std::vector<std::vector<std::int32_t>> inputs, targets;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::int32_t> in, tg;
    for (std::int64_t i = 0; i < B * T; ++i) {
      in.push_back(static_cast<std::int32_t>((i * 7 + s * 3 + 1) % 37));
      tg.push_back(static_cast<std::int32_t>((i * 5 + s + 2) % 37));
    }
    inputs.push_back(in);
    targets.push_back(tg);
  }
  fw::CheckReport report;
  fw::launch<fw::LocalWorld>(c.tp * c.cp * c.pp * c.dp, [&](fw::World<fw::LocalWorld>& w) {
    const MeshT mesh(w.size(), {.tp = c.tp, .cp = c.cp, .pp = c.pp});
    fw::MeshGroups<fw::LocalComm> groups(mesh, w.comm());
    fw::MeshOptions mo;
    mo.pipeline.schedule = c.schedule;
    mo.pipeline.micro_batches = c.micro_batches;
    mo.sharded.bucket_bytes = 2048;  // several buckets
    mo.tensor.sequence_parallel = c.sequence_parallel;
    fw::TrainerOptions to;
    to.micro_batches = c.micro_batches;
    gptj::Config cfg = config();
    cfg.checkpoint = c.checkpoint;
    fw::CheckOptions co;
    co.steps = 3;
    const auto batch_at = [&](int s) {
      return fw::Batch{inputs[static_cast<std::size_t>(s)], targets[static_cast<std::size_t>(s)], B,
                       T};
    };
    const auto r = fw::check_mesh<MeshT, fw::Precision<float>>(
        w.ctx(), mesh, groups, w.comm(), cfg, 7, mo, fw::AdamW{}, to, batch_at, co);
    if (w.rank() == 0) report = r;
  });
  return report;
}

template <int Z>
fw::CheckReport check_zero(const Case& c) {
  if (c.tp > 1 && c.pp > 1) return check<fw::dynamic_mesh_t<true, true, Z>>(c);
  if (c.tp > 1) return check<fw::dynamic_mesh_t<true, false, Z>>(c);
  if (c.pp > 1) return check<fw::dynamic_mesh_t<false, true, Z>>(c);
  return check<fw::dynamic_mesh_t<false, false, Z>>(c);
}

fw::CheckReport check_case(const Case& c) {
  if (c.cp > 1) {  // the context-parallel meshes of the list below, one instantiation each
    if (c.tp > 1) return check<fw::dynamic_mesh_t<true, false, 2, true>>(c);
    if (c.pp > 1) return check<fw::dynamic_mesh_t<false, true, 3, true>>(c);
    return check<fw::dynamic_mesh_t<false, false, 0, true>>(c);
  }
  switch (c.zero) {
    case 1: return check_zero<1>(c);
    case 2: return check_zero<2>(c);
    case 3: return check_zero<3>(c);
    default: return check_zero<0>(c);
  }
}

}  // namespace

// Every mesh shape of the equivalence matrix against the one-rank run, with fp32's bounds: tensor
// parallelism over 2 ranks (the 2 key/value heads), with and without sequence parallelism, ZeRO
// 1-3, pipelines of every schedule family, the 3D mesh, and context parallelism (sequences of 8
// split over 2 ranks, the ring's attention and rotary positions at each row's place in the whole
// sequence) alone, with tensor parallelism and with a pipeline.
TEST(Gptj, EveryMeshMatchesTheOneRankRun) {
  using K = fw::schedule::Kind;
  const std::vector<Case> cases = {
      {},
      {.tp = 2},
      {.tp = 2, .sequence_parallel = true},
      {.dp = 2, .zero = 3},
      {.tp = 2, .dp = 2, .zero = 2},
      {.pp = 2, .micro_batches = 2, .schedule = K::gpipe},
      {.pp = 2, .dp = 2, .zero = 1, .micro_batches = 2},
      {.pp = 2, .micro_batches = 2, .schedule = K::zb_h1},
      {.tp = 2, .pp = 2, .dp = 2, .zero = 1, .micro_batches = 2},
      {.tp = 2, .pp = 2, .dp = 2, .zero = 3, .micro_batches = 2, .checkpoint = true},
      {.tp = 2, .pp = 2, .micro_batches = 2, .sequence_parallel = true},
      {.cp = 2},
      {.tp = 2, .dp = 2, .zero = 2, .cp = 2, .sequence_parallel = true},
      {.pp = 2, .dp = 2, .zero = 3, .micro_batches = 2, .cp = 2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    const fw::CheckReport r = check_case(c);
    EXPECT_TRUE(r.ok()) << r.text();
    std::printf("%s: losses within %.1e, step-1 gradients within %.1e\n", c.name().c_str(),
                r.worst_loss_difference(), r.gradient_difference[r.worst_tensor()]);
  }
}

TEST(GptjProgram, ChecksThe3dMeshAgainstTheOneRankRun) {
  const auto run = fw::test::run_program(
      FOURWAY_GPTJ_EXE, "--tp 2 --pp 2 --dp 2 --zero 1 --micro-batches 2 --steps 3 --check",
      "fourway_gptj_test");
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("tp=2 pp=2 dp=2"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("check passed"), std::string::npos) << run.out;
  const auto bad = fw::test::run_program(FOURWAY_GPTJ_EXE, "--tp 4 --steps 1", "fourway_gptj_test");
  EXPECT_EQ(bad.status, 2) << bad.out << bad.err;  // 2 key/value heads over 4 ranks
  EXPECT_NE(bad.err.find("kv_heads=2 divisible by 4"), std::string::npos) << bad.err;
}
