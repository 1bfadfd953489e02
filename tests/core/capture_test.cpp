// What a CUDA graph capture cannot hold, refused on the host as on the GPU (backend/capture.hpp):
// a synchronising call, a copy from host memory and a tensor the block cache cannot serve throw
// GraphCaptureError naming the call (or the bytes) and the capture; what the cache serves, and
// kernels, pass; the guard closes on every path; captures do not nest; StepGraph<Host> rehearses
// a capture and its replays; the blocks a graph was served are its own until it goes, and a step
// that frees a tensor made before its capture is refused. Expected messages are the calls' names
// as the backend passes them.
#include "fourway/backend/capture.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "fourway/backend/host/kernels.hpp"
#include "fourway/core/tensor.hpp"

namespace fw = fourway;

namespace {

/// The GraphCaptureError `f` throws, or "" when it throws none.
template <class F>
std::string capture_error(F&& f) {
  try {
    f();
  } catch (const fw::GraphCaptureError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST(GraphCapture, SynchronisingCallsAreRefusedNamingTheCall) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  std::vector<float> a(8, 1.0f), b(8, 0.0f);
  const std::uint64_t before = ctx.syncs();
  {
    fw::CaptureGuard<fw::Host> guard(ctx, "the test's capture");
    const std::string to_host =
        capture_error([&] { fw::host::to_host(ctx, b.data(), a.data(), 8); });
    EXPECT_TRUE(contains(to_host, "to_host (a copy to the host) inside the test's capture"))
        << to_host;
    EXPECT_TRUE(contains(to_host, "a captured step may not synchronise")) << to_host;
    EXPECT_TRUE(contains(capture_error([&] { (void)fw::host::sum_squares(ctx, a.data(), 8); }),
                         "sum_squares (a value read back) inside the test's capture"));
    EXPECT_TRUE(contains(capture_error([&] { (void)fw::host::has_inf_nan(ctx, a.data(), 8); }),
                         "has_inf_nan (a value read back)"));
    EXPECT_TRUE(contains(capture_error([&] { ctx.synchronize(); }), "synchronize inside"));
    const std::string upload =
        capture_error([&] { fw::host::from_host(ctx, b.data(), a.data(), 8); });
    EXPECT_TRUE(contains(upload,
                         "from_host (a copy from host memory) inside the test's capture: a "
                         "captured step may not copy from host memory"))
        << upload;
    // kernels are what a capture records: they run
    fw::host::scale(ctx, a.data(), 8, 2.0f);
    EXPECT_EQ(b[0], 0.0f);  // the refused copy did not happen
  }
  EXPECT_EQ(ctx.syncs(), before) << "a refused call is not counted";
  EXPECT_EQ(ctx.capture(), nullptr) << "the guard closed the capture";
  fw::host::to_host(ctx, b.data(), a.data(), 8);  // outside a capture: allowed and counted
  EXPECT_EQ(b[0], 2.0f);
  EXPECT_EQ(ctx.syncs(), before + 1);
}

TEST(GraphCapture, OnlyTheBlockCacheMayServeTensorsInsideACapture) {
  fw::MemoryAccountant mem(3);
  fw::Context<fw::Host> ctx(mem);
  { fw::Tensor<float, fw::Host> warm({256}, fw::MemTag::activations, mem); }  // back to the cache
  const std::size_t backend_blocks = mem.backend_allocations();
  {
    fw::CaptureGuard<fw::Host> guard(ctx, "the test's capture");
    fw::Tensor<float, fw::Host> again({256}, fw::MemTag::activations, mem);  // a cached block
    EXPECT_EQ(mem.backend_allocations(), backend_blocks);
    const std::string e = capture_error(
        [&] { fw::Tensor<float, fw::Host> other({300}, fw::MemTag::activations, mem); });
    EXPECT_TRUE(contains(e, "rank 3 allocates a new block of 1200 bytes inside the test's capture"))
        << e;
    EXPECT_TRUE(contains(e, "run the step once uncaptured first")) << e;
    EXPECT_EQ(mem.backend_allocations(), backend_blocks) << "refused before the backend";
  }
  fw::Tensor<float, fw::Host> after({300}, fw::MemTag::activations, mem);  // allowed again
  EXPECT_EQ(mem.backend_allocations(), backend_blocks + 1);
}

TEST(GraphCapture, TheGuardClosesWhenTheStepThrowsAndCapturesDoNotNest) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  EXPECT_THROW(
      {
        fw::CaptureGuard<fw::Host> guard(ctx, "outer");
        EXPECT_TRUE(contains(capture_error([&] { fw::CaptureGuard<fw::Host> inner(ctx, "inner"); }),
                             "inner opened inside outer: captures do not nest"));
        throw fw::ConfigError("the step failed");
      },
      fw::ConfigError);
  EXPECT_EQ(ctx.capture(), nullptr);
  fw::Tensor<float, fw::Host> fine({64}, fw::MemTag::activations, mem);  // no capture left open
  ctx.synchronize();
}

TEST(GraphCapture, StepGraphRehearsesTheCaptureAndEachReplayOnTheHost) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  std::vector<float> x(16, 1.0f);
  int runs = 0;
  // the step: a scratch tensor and a kernel; one uncaptured run puts its block in the cache
  const auto step = [&] {
    fw::Tensor<float, fw::Host> scratch({16}, fw::MemTag::workspace, mem);
    fw::host::scale(ctx, x.data(), 16, 2.0f);
    ++runs;
  };
  step();
  fw::StepGraph<fw::Host> graph;
  EXPECT_TRUE(contains(capture_error([&] { graph.replay(ctx); }), "replay before a capture"));
  graph.capture(ctx, step);
  graph.replay(ctx);
  graph.replay(ctx);
  EXPECT_TRUE(graph.captured());
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(x[0], 16.0f);
  // a step that reads a value back cannot be captured
  fw::StepGraph<fw::Host> reads;
  const std::string e = capture_error(
      [&] { reads.capture(ctx, [&] { (void)fw::host::sum_squares(ctx, x.data(), 16); }); });
  EXPECT_TRUE(contains(e,
                       "sum_squares (a value read back) inside a CUDA graph capture (rehearsed "
                       "on the host)"))
      << e;
  EXPECT_FALSE(reads.captured());
}

TEST(GraphCapture, AGraphsBlocksServeOnlyItsCapturesUntilItGoes) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  std::vector<float> x(16, 1.0f);
  const auto step = [&] {
    fw::Tensor<float, fw::Host> scratch({64}, fw::MemTag::workspace, mem);
    fw::host::scale(ctx, x.data(), 16, 2.0f);
  };
  step();  // one 256-byte block in the cache
  const std::size_t blocks = mem.backend_allocations();
  fw::StepGraph<fw::Host> graph;
  graph.capture(ctx, step);
  EXPECT_EQ(mem.backend_allocations(), blocks) << "the capture was served from the cache";
  EXPECT_EQ(mem.graph_blocks(), 1u);
  {
    // a tensor made between replays never gets the graph's block: a replay would write over it
    fw::Tensor<float, fw::Host> between({64}, fw::MemTag::activations, mem);
    EXPECT_EQ(mem.backend_allocations(), blocks + 1);
    graph.replay(ctx);
    EXPECT_EQ(mem.backend_allocations(), blocks + 1) << "the replay reuses its own block";
  }
  // the graph's idle block stays when the cache is emptied (the other block goes)
  EXPECT_EQ(mem.release_cached_blocks(), 256u);
  EXPECT_EQ(mem.cached_bytes(), 256u);
  graph.replay(ctx);
  EXPECT_EQ(mem.backend_allocations(), blocks + 1);
  // another graph's capture does not get it either: the second graph's first capture misses
  {
    fw::StepGraph<fw::Host> other;
    const std::string e = capture_error([&] { other.capture(ctx, step); });
    EXPECT_TRUE(contains(e, "allocates a new block of 256 bytes")) << e;
    EXPECT_EQ(mem.graph_blocks(), 1u) << "the refused capture took nothing";
  }
  graph.replay(ctx);
  // once the graph goes, its block serves any tensor
  graph.drop();
  EXPECT_EQ(mem.graph_blocks(), 0u);
  fw::Tensor<float, fw::Host> after({64}, fw::MemTag::activations, mem);
  EXPECT_EQ(mem.backend_allocations(), blocks + 1);
  EXPECT_EQ(mem.cached_bytes(), 0u);
}

TEST(GraphCapture, AStepThatFreesATensorMadeBeforeItsCaptureIsRefused) {
  fw::MemoryAccountant mem(2);
  fw::Context<fw::Host> ctx(mem);
  std::optional<fw::Tensor<float, fw::Host>> kept;
  kept.emplace(fw::Shape{32}, fw::MemTag::activations, mem);  // made before the capture
  fw::StepGraph<fw::Host> graph;
  const std::string e = capture_error([&] { graph.capture(ctx, [&] { kept.reset(); }); });
  EXPECT_TRUE(contains(e,
                       "rank 2 frees a tensor of 128 bytes (activations) made before a CUDA "
                       "graph capture (rehearsed on the host)"))
      << e;
  EXPECT_TRUE(contains(e, "free it before the capture, or keep it alive past it")) << e;
  EXPECT_FALSE(graph.captured());
  EXPECT_EQ(mem.graph_blocks(), 0u) << "a refused capture keeps no block";
  // a tensor made and freed inside the step is what a capture may hold
  graph.capture(ctx, [&] { fw::Tensor<float, fw::Host> t({32}, fw::MemTag::activations, mem); });
  EXPECT_TRUE(graph.captured());
}
