// Misuse is a sentence, not a crash: a model whose forward and backward never call the hooks they
// are given trains under DataParallel (nothing is released there) but under ZeRO-3, where a
// unit's weights exist only between its hooks, the first layer to use a released parameter
// throws a ConfigError naming it and the hooks, before any kernel touches the missing memory —
// fourway's GPT and its tensor-parallel twin alike.
// A model without units() or visit_unit_parameters is a compile error
// (compile_fail_unit_members.cpp).
#include <gtest/gtest.h>

#include <mutex>
#include <string>

#include "fourway/comm/local_world.hpp"
#include "fourway/layers/gpt.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/train/sharded_strategy.hpp"
#include "fourway/train/trainer.hpp"
#include "parallel_harness.hpp"

namespace {

using Host = fw::Host;
using Gpt = fw::models::Gpt<float, Host>;

/// A model (fourway's GPT, or its tensor-parallel twin) behind a forward and backward that drop
/// the strategy's hooks.
template <class M>
struct HookSkipper {
  using value_type = float;
  using backend_type = Host;
  using Stash = typename M::Stash;
  M gpt;

  template <class Hooks>
  float forward(const fw::Context<Host>& ctx, const fw::Tensor<std::int32_t, Host>& tokens,
                const fw::Tensor<std::int32_t, Host>& targets, Stash& s, Hooks& /*ignored*/) {
    fw::NoHooks none;
    return gpt.forward(ctx, tokens, targets, s, none);
  }
  template <class Hooks>
  void backward(const fw::Context<Host>& ctx, Stash& s, float scale, Hooks& /*ignored*/) {
    fw::NoHooks none;
    gpt.backward(ctx, s, scale, none);
  }
  template <class F>
  void visit_parameters(F&& f) {
    gpt.visit_parameters(f);
  }
  [[nodiscard]] int units() const { return gpt.units(); }
  template <class F>
  void visit_unit_parameters(int u, F&& f) {
    gpt.visit_unit_parameters(u, f);
  }
};

/// One step of the hook-skipping model `build(ctx, tp)` (tp: a tensor-parallel group of one) on
/// 2 ranks under `Stage`: rank 0's error, or "".
template <int Stage, class M, class Build>
std::string step_without_hooks(Build build) {
  using S = fw::ShardedStrategy<Stage, HookSkipper<M>, fw::Precision<float>, Host, fw::LocalComm>;
  std::mutex mu;
  std::string error;
  fw::launch<fw::LocalWorld>(2, [&](fw::World<fw::LocalWorld>& w) {
    fw::LocalComm dp = w.comm().split(0, w.rank(), "dp");
    fw::LocalComm solo = w.comm().split(w.rank(), 0, "tp");
    HookSkipper<M> model{build(w.ctx(), solo)};
    fw::Trainer<S> trainer(fw::TrainerOptions{}, w.ctx(), model, dp, harness::adamw());
    try {
      (void)trainer.step(harness::batch(0).view());
    } catch (const fw::ConfigError& e) {
      const std::lock_guard lock(mu);
      if (w.rank() == 0) error = e.what();
    }
  });
  return error;
}

template <int Stage>
std::string gpt_step_without_hooks() {
  return step_without_hooks<Stage, Gpt>([](const fw::Context<Host>& ctx, fw::LocalComm&) {
    return Gpt(ctx, harness::tiny_gpt(), harness::kSeed);
  });
}

}  // namespace

TEST(HookMisuse, DataParallelNeedsNoHooks) { EXPECT_EQ(gpt_step_without_hooks<0>(), ""); }

TEST(HookMisuse, Zero3NamesTheParameterAndTheHooksInsteadOfCrashing) {
  const std::string e = gpt_step_without_hooks<3>();
  ASSERT_FALSE(e.empty()) << "ZeRO-3 without hooks must be a typed error";
  // the embedding (unit 0) is the first layer to run: wte or wpe, as the compiler orders its reads
  EXPECT_TRUE(e.find("fourway: parameter wte.weight has no weights bound") != std::string::npos ||
              e.find("fourway: parameter wpe.weight has no weights bound") != std::string::npos)
      << e;
  EXPECT_NE(e.find("hooks.pre_forward(u)"), std::string::npos) << e;
}

// The tensor-parallel layers read their weights the same way (the split GPT's embedding, blocks and
// vocabulary-parallel head): the same typed error, not a read of released memory.
TEST(HookMisuse, TensorParallelLayersNameTheParameterToo) {
  using TpGpt = fw::models::Gpt<float, Host, fw::LocalComm>;
  const std::string e =
      step_without_hooks<3, TpGpt>([](const fw::Context<Host>& ctx, fw::LocalComm& tp) {
        return TpGpt(ctx, harness::tiny_gpt(), tp, harness::kSeed);
      });
  ASSERT_FALSE(e.empty()) << "ZeRO-3 without hooks must be a typed error";
  EXPECT_NE(e.find("has no weights bound"), std::string::npos) << e;
  EXPECT_NE(e.find("hooks.pre_forward(u)"), std::string::npos) << e;
}

TEST(HookMisuse, AParameterWithoutStorageIsRefusedByName) {
  fw::MemoryAccountant mem;
  fw::Context<Host> ctx(mem);
  Gpt gpt = Gpt::deferred(ctx, harness::tiny_gpt(), harness::kSeed);  // described, never placed
  fw::Tensor<std::int32_t, Host> tokens(fw::Shape{1, 2}, fw::MemTag::activations, mem);
  tokens[0] = 1;
  tokens[1] = 2;
  Gpt::Stash s;
  fw::NoHooks none;
  try {
    (void)gpt.forward(ctx, tokens, tokens, s, none);
    ADD_FAILURE() << "a deferred model's forward must throw";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("a deferred model needs a strategy"), std::string::npos)
        << e.what();
  }
}
