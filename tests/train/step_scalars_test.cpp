// The per-step scalars of ShardedStrategy (loss sum, Σg²) travel as ONE packed all-reduce per step
// on the backend's memory (parallel/step_scalars.hpp), never as host doubles handed to the
// communicator: a recording communicator over LocalWorld sees every double all-reduce, its count
// and its buffer. The group's loss must still be the one-rank loss of the same global batch.
#include "fourway/parallel/step_scalars.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fourway/backend/capture.hpp"
#include "parallel/parallel_harness.hpp"

namespace fw = fourway;

namespace {

/// A LocalComm that records each all_reduce of doubles (its buffers and count).
class Recording {
 public:
  struct Call {
    const void* send;
    const void* recv;
    std::int64_t count;
  };
  explicit Recording(fw::LocalComm c) : c_(std::move(c)) {}
  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  std::string_view name() const { return c_.name(); }
  template <class T>
  void all_reduce(const T* s, T* r, std::int64_t n, fw::ReduceOp op) {
    if constexpr (std::is_same_v<T, double>) calls.push_back({s, r, n});
    c_.all_reduce(s, r, n, op);
  }
  template <class T>
  void reduce_scatter(const T* s, T* r, std::int64_t n, fw::ReduceOp op) {
    c_.reduce_scatter(s, r, n, op);
  }
  template <class T>
  void all_gather(const T* s, T* r, std::int64_t n) {
    c_.all_gather(s, r, n);
  }
  template <class T>
  void broadcast(T* b, std::int64_t n, int root) {
    c_.broadcast(b, n, root);
  }
  template <class T>
  void send(const T* b, std::int64_t n, int p, int t) {
    c_.send(b, n, p, t);
  }
  template <class T>
  void recv(T* b, std::int64_t n, int p, int t) {
    c_.recv(b, n, p, t);
  }
  void barrier() { c_.barrier(); }
  Recording split(int color, int key, std::string name = {}) {
    return Recording(c_.split(color, key, std::move(name)));
  }
  template <class T>
  fw::Work all_reduce_async(const T* s, T* r, std::int64_t n, fw::ReduceOp op) {
    if constexpr (std::is_same_v<T, double>) calls.push_back({s, r, n});
    return c_.all_reduce_async(s, r, n, op);
  }
  template <class T>
  fw::Work reduce_scatter_async(const T* s, T* r, std::int64_t n, fw::ReduceOp op) {
    return c_.reduce_scatter_async(s, r, n, op);
  }
  template <class T>
  fw::Work all_gather_async(const T* s, T* r, std::int64_t n) {
    return c_.all_gather_async(s, r, n);
  }
  template <class T>
  fw::Work broadcast_async(T* b, std::int64_t n, int root) {
    return c_.broadcast_async(b, n, root);
  }
  template <class T>
  fw::Work send_async(const T* b, std::int64_t n, int p, int t) {
    return c_.send_async(b, n, p, t);
  }
  template <class T>
  fw::Work recv_async(T* b, std::int64_t n, int p, int t) {
    return c_.recv_async(b, n, p, t);
  }

  std::vector<Call> calls;

 private:
  fw::LocalComm c_;
};
static_assert(fw::communicator<Recording>);

/// The tiny GPT trained on one rank.
struct OneRank {
  using Model = fw::models::Gpt<float, fw::Host>;
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx{mem};
  Model model{ctx, harness::tiny_gpt(), harness::kSeed};
  fw::Trainer<fw::SingleRank<Model, fw::Precision<float>, fw::Host>> trainer{
      fw::TrainerOptions{}, ctx, model, fw::AdamW{}};
};

/// The first step's loss on one rank (the reference for the group's loss).
float single_rank_loss() {
  OneRank one;
  return one.trainer.step(harness::batch(0).view());
}

template <int Stage>
void check_stage(int ranks, float reference) {
  using Model = fw::models::Gpt<float, fw::Host>;
  using S = fw::ShardedStrategy<Stage, Model, fw::Precision<float>, fw::Host, Recording>;
  std::mutex mu;
  fw::launch<fw::LocalWorld>(ranks, [&](fw::World<fw::LocalWorld>& w) {
    Recording dp(w.comm().split(0, w.rank(), "dp"));
    Model model(w.ctx(), harness::tiny_gpt(), harness::kSeed);
    fw::Trainer<S> t(fw::TrainerOptions{}, w.ctx(), model, dp, fw::AdamW{});
    const double* packed = t.strategy().step_scalars().data();
    for (int step = 0; step < 3; ++step) {
      dp.calls.clear();
      const float loss = t.step(harness::batch(step).view());
      std::lock_guard lock(mu);
      ASSERT_EQ(dp.calls.size(), 1u)
          << "stage " << Stage << " step " << step << ": one packed scalar all-reduce per step";
      EXPECT_EQ(dp.calls[0].count, Stage == 0 ? 1 : 2) << "loss (+ Σg² from stage 1)";
      EXPECT_EQ(dp.calls[0].send, packed) << "the strategy's buffer, not a host double";
      EXPECT_EQ(dp.calls[0].recv, packed);
      if (step == 0) {
        EXPECT_NEAR(loss, reference, 1e-6 * std::abs(reference)) << Stage;
      }
    }
    // the buffer is the backend's memory, counted like every other communication buffer
    EXPECT_GE(w.memory().current(fw::MemTag::comm_buffers),
              sizeof(double) * fw::StepScalars<fw::Host>::capacity);
  });
}

TEST(StepScalars, SumsPackedScalarsInOneAllReduceOnTheBackendBuffer) {
  fw::launch<fw::LocalWorld>(3, [](fw::World<fw::LocalWorld>& w) {
    Recording comm(w.comm().split(0, w.rank(), "dp"));
    fw::StepScalars<fw::Host> scalars(w.ctx());
    const double r = w.rank();
    const auto got = scalars.sum(comm, std::array<double, 3>{r, 10.0 * r, 0.5});
    EXPECT_EQ(got[0], 0.0 + 1.0 + 2.0);
    EXPECT_EQ(got[1], 0.0 + 10.0 + 20.0);
    EXPECT_EQ(got[2], 1.5);
    ASSERT_EQ(comm.calls.size(), 1u);
    EXPECT_EQ(comm.calls[0].count, 3);
    EXPECT_EQ(comm.calls[0].send, scalars.data());
  });
}

TEST(StepScalars, EveryShardedStageReducesItsScalarsOncePerStep) {
  const float reference = single_rank_loss();
  check_stage<0>(2, reference);
  check_stage<1>(2, reference);
  check_stage<2>(2, reference);
  check_stage<3>(4, reference);
}

// What stands between a Trainer step and a CUDA graph today (backend/capture.hpp): after a
// warm-up step every tensor of the next step comes from the block cache, so no allocation is
// refused; the first call a capture refuses is the step's read of its scalars (loss and Σg²),
// which the step returns and the optimizer's clipping and loss scale read. A captured step must
// keep that read outside the graph.
TEST(StepScalars, ATrainerStepIsRefusedCaptureAtItsScalarsReadBack) {
  OneRank one;
  (void)one.trainer.step(harness::batch(0).view());
  const std::size_t blocks = one.mem.backend_allocations();
  fw::StepGraph<fw::Host> graph;
  std::string refused;
  try {
    graph.capture(one.ctx, [&] { (void)one.trainer.step(harness::batch(1).view()); });
  } catch (const fw::GraphCaptureError& e) {
    refused = e.what();
  }
  EXPECT_NE(refused.find("to_host (a copy to the host) inside a CUDA graph capture"),
            std::string::npos)
      << refused;
  EXPECT_EQ(one.mem.backend_allocations(), blocks) << "the warm step's blocks served the capture";
  EXPECT_FALSE(graph.captured());
}

}  // namespace
