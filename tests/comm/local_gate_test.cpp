// LocalWorld's gate (comm/local/gate.hpp): an async collective's data moves only on the cores of
// ranks that are blocked on it, any blocked rank may do a computing peer's share, a rank that
// only polls still finishes, a communicator destroyed with work queued drains it, and results
// stay the fixed-order reduction whoever ran which chunk. Expected values come from one loop over
// the ranks' inputs in rank order (the reference of comm/local/comm.hpp's file comment).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "collective_checks.hpp"
#include "fourway/comm/local/gate.hpp"
#include "fourway/comm/local_world.hpp"

namespace fw = fourway;
using LocalRank = fw::World<fw::LocalWorld>;
using namespace std::chrono_literals;

namespace {

// Several 64 KiB chunks of fp32, and a remainder.
constexpr std::int64_t big = 3 * 16384 + 5;

std::vector<float> fixed_order_sum(const std::vector<std::vector<float>>& data) {
  std::vector<float> s(data[0]);
  for (std::size_t q = 1; q < data.size(); ++q) {
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += data[q][i];
  }
  return s;
}

float sentinel_load(float& x) { return std::atomic_ref<float>(x).load(std::memory_order_relaxed); }

}  // namespace

// Both ranks post an all_reduce and keep "computing": no chunk runs (their recv buffers keep the
// sentinel). Then rank 1 blocks: its thread does every chunk, rank 0's share included, so rank 0
// finds the whole result in its buffer before it ever waits.
TEST(LocalGate, AComputingRankMovesNoDataAndABlockedPeerDoesItsShare) {
  std::vector<std::vector<float>> data;
  for (int q = 0; q < 2; ++q) data.push_back(comm_test::rank_data<float>(31, q, big));
  const auto expected = fixed_order_sum(data);
  std::atomic<int> posted{0}, checked{0};
  std::atomic<bool> rank1_done{false};
  fw::launch<fw::LocalWorld>(2, [&](LocalRank& w) {
    const int r = w.rank();
    std::vector<float> out(big, -7.0f);
    fw::Work work = w.comm().all_reduce_async(data[r].data(), out.data(), big, fw::ReduceOp::sum);
    posted.fetch_add(1);
    while (posted.load() < 2) std::this_thread::yield();
    std::this_thread::sleep_for(100ms);  // both ranks "compute": nothing may move meanwhile
    for (std::int64_t i = 0; i < big; i += 997) {
      ASSERT_EQ(sentinel_load(out[static_cast<std::size_t>(i)]), -7.0f) << "rank " << r << " " << i;
    }
    checked.fetch_add(1);
    while (checked.load() < 2) std::this_thread::yield();
    if (r == 1) {
      work.wait();  // rank 0 has not waited: this rank's thread does all of it
      EXPECT_EQ(0, std::memcmp(out.data(), expected.data(), big * sizeof(float)));
      rank1_done.store(true, std::memory_order_release);
      return;
    }
    while (!rank1_done.load(std::memory_order_acquire)) std::this_thread::sleep_for(1ms);
    // rank 1's wait returned, so the collective completed: rank 0's share was done for it
    EXPECT_EQ(0, std::memcmp(out.data(), expected.data(), big * sizeof(float)));
    work.wait();
  });
}

// Ranks that only poll (`test()`) run one chunk per poll on their own thread and finish.
TEST(LocalGate, RanksThatOnlyPollFinish) {
  constexpr int n = 3;
  std::vector<std::vector<float>> data;
  for (int q = 0; q < n; ++q) data.push_back(comm_test::rank_data<float>(32, q, big));
  const auto expected = fixed_order_sum(data);
  fw::launch<fw::LocalWorld>(n, [&](LocalRank& w) {
    std::vector<float> out(big);
    fw::Work work =
        w.comm().all_reduce_async(data[w.rank()].data(), out.data(), big, fw::ReduceOp::sum);
    while (!work.test()) std::this_thread::yield();
    EXPECT_EQ(0, std::memcmp(out.data(), expected.data(), big * sizeof(float)));
  });
}

// A communicator destroyed with an unwaited collective queued lets its worker finish it.
TEST(LocalGate, ACommunicatorDestroyedWithWorkQueuedDrainsIt) {
  std::vector<std::vector<float>> data;
  for (int q = 0; q < 2; ++q) data.push_back(comm_test::rank_data<float>(33, q, big));
  const auto expected = fixed_order_sum(data);
  std::vector<std::vector<float>> out(2, std::vector<float>(big));
  fw::launch<fw::LocalWorld>(2, [&](LocalRank& w) {
    const int r = w.rank();
    {
      auto sub = w.comm().split(0, r);
      (void)sub.all_reduce_async(data[r].data(), out[r].data(), big, fw::ReduceOp::sum);
      if (r == 1) std::this_thread::sleep_for(50ms);
    }  // `sub` dies here on both ranks, neither waited
    EXPECT_EQ(0, std::memcmp(out[r].data(), expected.data(), big * sizeof(float)));
  });
}

// Multi-chunk all_reduce, reduce_scatter and all_gather (in place and not, 3 ranks) with the
// ranks blocking at staggered times, so chunks are split between them differently every run:
// every result is bitwise the fixed-order reference, on every rank, three runs in a row.
TEST(LocalGate, ResultsDoNotDependOnWhoRanTheChunks) {
  constexpr int n = 3;
  std::vector<std::vector<float>> data;
  for (int q = 0; q < n; ++q) data.push_back(comm_test::rank_data<float>(34, q, big * n));
  const auto sum = fixed_order_sum(data);  // of the whole n·big inputs
  for (int run = 0; run < 3; ++run) {
    fw::launch<fw::LocalWorld>(n, [&](LocalRank& w) {
      auto& c = w.comm();
      const int r = w.rank();
      const auto& mine = data[static_cast<std::size_t>(r)];
      std::vector<float> ar(big), ar_inplace(mine.begin(), mine.begin() + big), rs(big),
          rs_inplace(mine), ag(big * n), ag_inplace(big * n);
      std::memcpy(ag_inplace.data() + r * big, mine.data(), big * sizeof(float));
      std::vector<fw::Work> works;
      works.push_back(c.all_reduce_async(mine.data(), ar.data(), big, fw::ReduceOp::sum));
      works.push_back(
          c.all_reduce_async(ar_inplace.data(), ar_inplace.data(), big, fw::ReduceOp::sum));
      works.push_back(c.reduce_scatter_async(mine.data(), rs.data(), big, fw::ReduceOp::sum));
      works.push_back(c.reduce_scatter_async(rs_inplace.data(), rs_inplace.data() + r * big, big,
                                             fw::ReduceOp::sum));
      works.push_back(c.all_gather_async(mine.data(), ag.data(), big));
      works.push_back(c.all_gather_async(ag_inplace.data() + r * big, ag_inplace.data(), big));
      std::this_thread::sleep_for(std::chrono::milliseconds(15 * ((r + run) % n)));
      for (auto& wk : works) wk.wait();
      const auto bytes = static_cast<std::size_t>(big) * sizeof(float);
      EXPECT_EQ(0, std::memcmp(ar.data(), sum.data(), bytes)) << r;
      EXPECT_EQ(0, std::memcmp(ar_inplace.data(), sum.data(), bytes)) << r;
      EXPECT_EQ(0, std::memcmp(rs.data(), sum.data() + r * big, bytes)) << r;
      EXPECT_EQ(0, std::memcmp(rs_inplace.data() + r * big, sum.data() + r * big, bytes)) << r;
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(0, std::memcmp(ag.data() + q * big, data[q].data(), bytes)) << r << " " << q;
        EXPECT_EQ(0, std::memcmp(ag_inplace.data() + q * big, data[q].data(), bytes)) << r;
      }
    });
  }
}

// The gate itself: open while a Blocked lives (nested), help() runs the offered chunk once per
// call and nothing when no offer stands, and the offer is gone when its scope ends.
TEST(LocalGate, OpensWhileBlockedAndOffersChunksToTheRanksThread) {
  int wakes = 0;
  fw::detail::LocalGate gate([&] { ++wakes; });
  EXPECT_FALSE(gate.open());
  {
    const fw::detail::LocalGate::Blocked a(gate);
    EXPECT_TRUE(gate.open());
    {
      const fw::detail::LocalGate::Blocked b(gate);
      EXPECT_TRUE(gate.open());
    }
    EXPECT_TRUE(gate.open());
  }
  EXPECT_FALSE(gate.open());
  EXPECT_EQ(wakes, 2);
  int ran = 0;
  gate.help();
  EXPECT_EQ(ran, 0);
  {
    auto one = [&] { return ++ran <= 2; };
    const fw::detail::LocalGate::Offer offer(gate, one);
    gate.help();
    gate.help();
    EXPECT_EQ(ran, 2);
  }
  gate.help();
  EXPECT_EQ(ran, 2);
}
