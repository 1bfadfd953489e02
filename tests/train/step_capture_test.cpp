// The Trainer's captured step (train/trainer.hpp, `StepCapture`), rehearsed on the host
// (backend/capture.hpp): a captured run trains bit for bit like the uncaptured one — losses,
// gradient norms, clip coefficients, fp16 skips and loss scales, final weights — with one
// synchronising call per step, one capture per shape and gradient scale and a replay for every
// other step; validation between steps does not disturb it; a strategy with collectives or a
// model that returns its loss is refused under `on` and left uncaptured under `when_possible`; a
// capture that fails (a block the cache cannot serve) throws under `on` and falls back under
// `when_possible`. The reference is the same Trainer with capture off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fourway/backend/capture.hpp"
#include "fourway/train/trainer.hpp"
#include "parallel/parallel_harness.hpp"

namespace {

template <class T>
using Model = fw::models::Gpt<T, fw::Host>;
template <class T>
using OneRankTrainer = fw::Trainer<fw::SingleRank<Model<T>, fw::Precision<T>, fw::Host>>;

/// What a run did, step by step, and the weights it ended with (as raw bits).
struct Record {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<float> clips;
  std::vector<bool> skipped;
  std::vector<float> scales;
  std::vector<float> evals;
  std::vector<std::uint64_t> syncs;
  std::vector<std::uint8_t> weights;
  long captures = 0;
  long replays = 0;
  fw::StepCapture capture = fw::StepCapture::off;
  std::string note;
};

struct RunSpec {
  fw::StepCapture capture = fw::StepCapture::off;
  int steps = 6;
  int micro_batches = 1;
  fw::LossScalerConfig scaler{};
  bool evaluate_after_step_3 = false;
  bool block_cache = true;
};

template <class T>
Record run(const RunSpec& spec) {
  fw::MemoryAccountant mem;
  mem.set_block_caching(spec.block_cache);
  fw::Context<fw::Host> ctx(mem);
  Model<T> model(ctx, harness::tiny_gpt(), harness::kSeed);
  fw::AdamWConfig c = harness::adamw().config();
  // a warm-up then cosine schedule: the learning rate changes every step, outside the graph
  OneRankTrainer<T> trainer(
      fw::TrainerOptions{
          .micro_batches = spec.micro_batches, .loss_scaler = spec.scaler, .capture = spec.capture},
      ctx, model, fw::AdamW(c, fw::LrSchedule::warmup_cosine(c.lr, 2, spec.steps + 1)));
  Record r;
  for (int step = 0; step < spec.steps; ++step) {
    const auto before = ctx.syncs();
    r.losses.push_back(trainer.step(harness::batch(step).view()));
    r.syncs.push_back(ctx.syncs() - before);
    const fw::StepReport& rep = trainer.last_report();
    r.norms.push_back(rep.grad_norm);
    r.clips.push_back(rep.clip_coef);
    r.skipped.push_back(rep.skipped);
    r.scales.push_back(trainer.loss_scaler().scale());
    if (spec.evaluate_after_step_3 && step == 2) {
      r.evals.push_back(trainer.evaluate(harness::batch(100).view()));
    }
  }
  model.visit_parameters([&](auto& p) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(p.weight.data());
    r.weights.insert(r.weights.end(), bytes, bytes + p.weight.bytes());
  });
  r.captures = trainer.captures();
  r.replays = trainer.replays();
  r.capture = trainer.capture();
  r.note = trainer.capture_note();
  return r;
}

/// Everything a step reports, and the weights, bit for bit.
void expect_same_training(const Record& got, const Record& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (std::size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&got.losses[i], &want.losses[i], sizeof(float)), 0)
        << what << " step " << i << ": loss " << got.losses[i] << " vs " << want.losses[i];
    EXPECT_EQ(got.norms[i], want.norms[i]) << what << " step " << i;
    EXPECT_EQ(got.clips[i], want.clips[i]) << what << " step " << i;
    EXPECT_EQ(got.skipped[i], want.skipped[i]) << what << " step " << i;
    EXPECT_EQ(got.scales[i], want.scales[i]) << what << " step " << i;
  }
  EXPECT_EQ(got.evals, want.evals) << what;
  EXPECT_TRUE(got.weights == want.weights) << what << ": final weights differ";
}

}  // namespace

TEST(StepCapture, CapturedStepsTrainBitForBitLikeUncapturedOnes) {
  for (int m : {1, 2}) {
    const std::string what = std::to_string(m) + " micro-batch(es)";
    RunSpec spec{.micro_batches = m, .evaluate_after_step_3 = true};
    const Record plain = run<float>(spec);
    spec.capture = fw::StepCapture::on;
    const Record graph = run<float>(spec);
    expect_same_training(graph, plain, what);
    // step 1 fills the cache, step 2 is captured (and runs), step 3 replays; the validation after
    // it drops the graph (its forward reuses the step's blocks), step 4 recaptures, 5-6 replay
    EXPECT_EQ(graph.captures, 2) << what;
    EXPECT_EQ(graph.replays, 3) << what;
    EXPECT_EQ(graph.capture, fw::StepCapture::on) << what;
    EXPECT_TRUE(graph.note.empty()) << graph.note;
    for (std::size_t i = 0; i < graph.syncs.size(); ++i) {
      EXPECT_EQ(graph.syncs[i], 1u) << what << " step " << i << ": the scalars' read-back only";
    }
    EXPECT_EQ(plain.captures + plain.replays, 0) << what;
  }
  // bf16 weights with fp32 masters
  const Record plain = run<fw::bf16>({});
  const Record graph = run<fw::bf16>({.capture = fw::StepCapture::when_possible});
  expect_same_training(graph, plain, "bf16");
  EXPECT_EQ(graph.captures, 1);
  EXPECT_EQ(graph.replays, 4);
}

// fp16: the gradient scale is part of the graph's key, so a loss scale that changes (backed off
// after an overflow, grown after clean steps) recaptures; the skip and the scale's update are
// decided after the read-back, outside the graph.
TEST(StepCapture, Fp16LossScaleChangesRecaptureAndSkipsStayOutsideTheGraph) {
  const fw::LossScalerConfig scaler{.init_scale = 4194304.0f,  // 2^22: the first steps overflow
                                    .growth_interval = 3};
  const RunSpec plain_spec{.steps = 20, .scaler = scaler};
  const Record plain = run<fw::fp16>(plain_spec);
  RunSpec spec = plain_spec;
  spec.capture = fw::StepCapture::on;
  const Record graph = run<fw::fp16>(spec);
  expect_same_training(graph, plain, "fp16");
  ASSERT_TRUE(plain.skipped[0]) << "the test needs an overflow at 2^22";
  int changes = 0;
  for (std::size_t i = 1; i < plain.scales.size(); ++i)
    changes += plain.scales[i] != plain.scales[i - 1];
  EXPECT_GE(changes, 3) << "backed off, then grown";
  // the keying, step by step: the first step runs uncaptured, a gradient scale not seen in the
  // graph is captured at once (the shapes are warm), the steps after replay it
  long captures = 0, replays = 0;
  float graph_scale = 0.0f;
  for (std::size_t i = 1; i < plain.scales.size(); ++i) {
    const float scale = plain.scales[i - 1];
    if (captures > 0 && scale == graph_scale) {
      ++replays;
    } else {
      graph_scale = scale;
      ++captures;
    }
  }
  EXPECT_EQ(graph.captures, captures);
  EXPECT_EQ(graph.replays, replays);
  EXPECT_GE(graph.captures, 2) << "a new scale is a new graph";
  EXPECT_GE(graph.replays, 1);
}

// A capture the cache cannot serve (block caching off: every tensor is a new block) throws under
// `on` and falls back, for good, under `when_possible`, with the same training.
TEST(StepCapture, AFailedCaptureThrowsUnderOnAndFallsBackUnderWhenPossible) {
  const Record plain = run<float>({.block_cache = false});
  const Record fallback =
      run<float>({.capture = fw::StepCapture::when_possible, .block_cache = false});
  expect_same_training(fallback, plain, "fallback");
  EXPECT_EQ(fallback.capture, fw::StepCapture::off);
  EXPECT_EQ(fallback.captures + fallback.replays, 0);
  EXPECT_NE(fallback.note.find("not captured (fourway: rank 0 allocates a new block of"),
            std::string::npos)
      << fallback.note;
  try {
    (void)run<float>({.capture = fw::StepCapture::on, .block_cache = false});
    ADD_FAILURE() << "capture on without a block cache did not throw";
  } catch (const fw::GraphCaptureError& e) {
    EXPECT_NE(std::string(e.what()).find("run the step once uncaptured first"), std::string::npos)
        << e.what();
  }
}

namespace {

/// The GPT without `forward_into`: its loss comes back to the host each micro-batch.
struct ReturnsItsLoss {
  using value_type = float;
  using backend_type = fw::Host;
  using Stash = Model<float>::Stash;
  Model<float>* gpt;
  template <class Hooks>
  float forward(const fw::Context<fw::Host>& ctx, const fw::Tensor<std::int32_t, fw::Host>& tok,
                const fw::Tensor<std::int32_t, fw::Host>& tgt, Stash& s, Hooks&& h) {
    return gpt->forward(ctx, tok, tgt, s, h);
  }
  template <class Hooks>
  void backward(const fw::Context<fw::Host>& ctx, Stash& s, float g, Hooks&& h) {
    gpt->backward(ctx, s, g, h);
  }
  template <class F>
  void visit_parameters(F&& f) {
    gpt->visit_parameters(f);
  }
};

}  // namespace

TEST(StepCapture, StepsThatCannotBeCapturedAreRefusedUnderOnAndLeftUncapturedOtherwise) {
  // a model that returns its loss to the host
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  Model<float> gpt(ctx, harness::tiny_gpt(), harness::kSeed);
  ReturnsItsLoss model{&gpt};
  using S = fw::SingleRank<ReturnsItsLoss, fw::Precision<float>, fw::Host>;
  try {
    fw::Trainer<S> t(fw::TrainerOptions{.capture = fw::StepCapture::on}, ctx, model,
                     harness::adamw());
    ADD_FAILURE() << "capture on was accepted for a model that returns its loss";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the step cannot be captured in a CUDA graph (the model "
                                         "returns each micro-batch's loss to the host)"),
              std::string::npos)
        << e.what();
  }
  fw::Trainer<S> lenient(fw::TrainerOptions{.capture = fw::StepCapture::when_possible}, ctx, model,
                         harness::adamw());
  EXPECT_EQ(lenient.capture(), fw::StepCapture::off);
  EXPECT_EQ(lenient.capture_note(),
            "not captured: the model returns each micro-batch's loss to the host");
  EXPECT_TRUE(std::isfinite(lenient.step(harness::batch(0).view())));

  // a strategy with collectives (ZeRO-1 over two LocalWorld ranks)
  using Z1 = fw::ShardedStrategy<1, Model<float>, fw::Precision<float>, fw::Host, fw::LocalComm>;
  fw::launch<fw::LocalWorld>(2, [](fw::World<fw::LocalWorld>& w) {
    fw::LocalComm dp = w.comm().split(0, w.rank(), "dp");
    Model<float> m(w.ctx(), harness::tiny_gpt(), harness::kSeed);
    EXPECT_THROW(fw::Trainer<Z1>(fw::TrainerOptions{.capture = fw::StepCapture::on}, w.ctx(), m, dp,
                                 harness::adamw()),
                 fw::ConfigError);
    fw::Trainer<Z1> t(fw::TrainerOptions{.capture = fw::StepCapture::when_possible}, w.ctx(), m, dp,
                      harness::adamw());
    EXPECT_EQ(t.capture(), fw::StepCapture::off);
    EXPECT_NE(t.capture_note().find("only SingleRank's step splits into a device half and a host "
                                    "half"),
              std::string::npos)
        << t.capture_note();
    (void)t.step(harness::batch(0).view());
  });
}
