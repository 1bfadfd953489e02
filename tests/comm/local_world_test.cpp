#include "fourway/comm/local_world.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.hpp"

namespace fw = fourway;
using Clock = std::chrono::steady_clock;
using LocalRank = fw::World<fw::LocalWorld>;

namespace {

fw::CommOptions with_deadline(int ms, bool debug = false) {
  fw::CommOptions o;
  o.deadline = std::chrono::milliseconds(ms);
  o.debug = debug;
  return o;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

// ---- every op x element type x world size against the double-precision reference -------------

template <class T>
class LocalWorldOps : public ::testing::Test {};
using ElementTypes =
    ::testing::Types<float, fw::bf16, fw::fp16, double, std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(LocalWorldOps, ElementTypes);

TYPED_TEST(LocalWorldOps, EveryOpMatchesReferenceAt1To8Ranks) {
  for (int n : {1, 2, 3, 4, 8}) {
    fw::launch<fw::LocalWorld>(
        n,
        [&](LocalRank& w) {
          comm_test::check_every_op<TypeParam>(w.comm(), 1234u + static_cast<unsigned>(n));
        },
        with_deadline(60000, /*debug=*/true));
  }
}

TYPED_TEST(LocalWorldOps, AsyncFormsMatchTheBlockingOnes) {
  fw::launch<fw::LocalWorld>(3, [](LocalRank& w) {
    auto& c = w.comm();
    const std::int64_t count = 517;
    std::vector<std::vector<TypeParam>> all;
    for (int q = 0; q < 3; ++q) all.push_back(comm_test::rank_data<TypeParam>(99, q, count));
    const auto& mine = all[static_cast<std::size_t>(w.rank())];
    std::vector<TypeParam> sync_out(count), async_out(count), gathered(count * 3),
        scattered(count / 3 + 1);
    c.all_reduce(mine.data(), sync_out.data(), count, fw::ReduceOp::sum);
    // several operations in flight at once, waited in reverse order
    fw::Work a = c.all_reduce_async(mine.data(), async_out.data(), count, fw::ReduceOp::sum);
    fw::Work g = c.all_gather_async(mine.data(), gathered.data(), count);
    std::vector<TypeParam> rs_in(3 * scattered.size());
    for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = mine[i % mine.size()];
    fw::Work r =
        c.reduce_scatter_async(rs_in.data(), scattered.data(),
                               static_cast<std::int64_t>(scattered.size()), fw::ReduceOp::max);
    r.wait();
    g.wait();
    a.wait();
    EXPECT_TRUE(a.test());
    for (std::int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(comm_test::to_double(async_out[i]), comm_test::to_double(sync_out[i]));
      for (int q = 0; q < 3; ++q) {
        ASSERT_EQ(comm_test::to_double(gathered[q * count + i]), comm_test::to_double(all[q][i]));
      }
    }
    // a blocking call after queued async work runs after it (sequence order is preserved)
    std::vector<TypeParam> b1(count), b2(count);
    fw::Work w1 = c.broadcast_async(b1.data(), 0, 0);
    auto bc = comm_test::rank_data<TypeParam>(7, w.rank(), count);
    c.broadcast(bc.data(), count, 2);
    w1.wait();
    auto expect = comm_test::rank_data<TypeParam>(7, 2, count);
    for (std::int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(comm_test::to_double(bc[i]), comm_test::to_double(expect[i]));
    }
  });
}

// ---- determinism ------------------------------------------------------------------------------

TEST(LocalWorld, AllReduceIsTheFixedOrderSumBitwiseAndRepeatable) {
  for (int n : {2, 3, 8}) {
    const std::int64_t count = 4099;
    std::vector<std::vector<float>> data;
    for (int q = 0; q < n; ++q) data.push_back(comm_test::rank_data<float>(5, q, count));
    // The reference: one loop, ranks in order 0..n-1, fp32 accumulation.
    std::vector<float> expected(count);
    for (std::int64_t i = 0; i < count; ++i) {
      float acc = data[0][i];
      for (int q = 1; q < n; ++q) acc += data[q][i];
      expected[i] = acc;
    }
    std::vector<std::vector<float>> first(n), second(n);
    for (auto* out : {&first, &second}) {
      fw::launch<fw::LocalWorld>(n, [&](LocalRank& w) {
        std::vector<float> r(count);
        w.comm().all_reduce(data[w.rank()].data(), r.data(), count, fw::ReduceOp::sum);
        (*out)[w.rank()] = r;
      });
    }
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(0, std::memcmp(first[q].data(), expected.data(), count * sizeof(float))) << n;
      EXPECT_EQ(0, std::memcmp(second[q].data(), expected.data(), count * sizeof(float))) << n;
    }
  }
}

TEST(LocalWorld, LargeMessagesTakeTheStreamingStoresAndStayExact) {
  // Slices of >= 2 MiB are written with non-temporal stores; misaligned buffers (offset by one
  // element) exercise the unaligned head and tail of that path.
  const std::int64_t count = (std::int64_t{1} << 20) + 3;
  for (int n : {2, 3}) {
    std::vector<std::vector<fw::bf16>> data;
    for (int q = 0; q < n; ++q) data.push_back(comm_test::rank_data<fw::bf16>(8, q, count));
    fw::launch<fw::LocalWorld>(n, [&](LocalRank& w) {
      std::vector<fw::bf16> out(count + 1);
      w.comm().all_reduce(data[w.rank()].data(), out.data() + 1, count, fw::ReduceOp::sum);
      for (std::int64_t i = 0; i < count; ++i) {
        float acc = static_cast<float>(data[0][i]);
        for (int q = 1; q < n; ++q) acc += static_cast<float>(data[q][i]);
        ASSERT_EQ(out[i + 1].bits, fw::bf16(acc).bits) << i;
      }
    });
  }
}

TEST(LocalWorld, SixteenBitSumsAccumulateInFp32) {
  // Ranks 1..7 each add 1 to rank 0's 2048. fp16 spaces 2 apart there, so adding in fp16 one at
  // a time rounds back to 2048 every time; the fp32 sum 2055 rounds once, to 2056.
  fw::launch<fw::LocalWorld>(8, [](LocalRank& w) {
    const float start = w.rank() == 0 ? 2048.0f : 1.0f;
    fw::fp16 in(start), out;
    w.comm().all_reduce(&in, &out, 1, fw::ReduceOp::sum);
    EXPECT_EQ(static_cast<float>(out), 2056.0f);
  });
}

// ---- point-to-point ----------------------------------------------------------------------------

TEST(LocalWorld, PointToPointMatchesByTagAndKeepsFifoPerTag) {
  fw::launch<fw::LocalWorld>(2, [](LocalRank& w) {
    auto& c = w.comm();
    if (w.rank() == 0) {
      for (int k = 0; k < 3; ++k) {
        const int v = 10 + k;
        c.send(&v, 1, 1, 5);
      }
      const std::int64_t big[4] = {1, 2, 3, 4};
      c.send(big, 4, 1, 9);
      const float self = 3.5f;
      c.send(&self, 1, 0, 0);
      float back = 0;
      c.recv(&back, 1, 0, 0);
      EXPECT_EQ(back, 3.5f);
    } else {
      std::int64_t big[4] = {};
      c.recv(big, 4, 0, 9);  // posted later, received first
      EXPECT_EQ(big[3], 4);
      for (int k = 0; k < 3; ++k) {
        int v = 0;
        c.recv(&v, 1, 0, 5);
        EXPECT_EQ(v, 10 + k);
      }
    }
  });
}

TEST(LocalWorld, RecvOfWrongCountOrDtypeThrowsCommMismatch) {
  fw::launch<fw::LocalWorld>(2, [](LocalRank& w) {
    if (w.rank() == 0) {
      const float v[3] = {1, 2, 3};
      w.comm().send(v, 3, 1, 4);
      w.comm().send(v, 3, 1, 4);
    } else {
      float v[2];
      try {
        w.comm().recv(v, 2, 0, 4);
        ADD_FAILURE() << "no CommMismatch";
      } catch (const fw::CommMismatch& e) {
        EXPECT_TRUE(contains(e.what(), "count 3")) << e.what();
        EXPECT_TRUE(contains(e.what(), "count 2")) << e.what();
        EXPECT_TRUE(contains(e.what(), "tag 4")) << e.what();
      }
      std::int32_t iv[3];
      EXPECT_THROW(w.comm().recv(iv, 3, 0, 4), fw::CommMismatch);
    }
  });
}

// ---- split ------------------------------------------------------------------------------------

TEST(LocalWorld, SplitGroupsByColorAndRanksByKey) {
  fw::launch<fw::LocalWorld>(6, [](LocalRank& w) {
    const int color = w.rank() % 2;
    auto sub = w.comm().split(color, -w.rank());  // reverse order inside each color
    EXPECT_EQ(sub.size(), 3);
    EXPECT_EQ(sub.world_rank(), w.rank());
    // ranks of color 0 are 0,2,4 -> keys 0,-2,-4 -> new ranks 2,1,0
    EXPECT_EQ(sub.rank(), 2 - w.rank() / 2);
    std::int64_t v = w.rank(), sum = 0;
    sub.all_reduce(&v, &sum, 1, fw::ReduceOp::sum);
    EXPECT_EQ(sum, color == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    auto pair = sub.split(sub.rank() / 2, sub.rank(), "pair");
    EXPECT_EQ(pair.name(), "pair");
    EXPECT_EQ(pair.size(), sub.rank() / 2 == 0 ? 2 : 1);
    pair.barrier();
    w.comm().barrier();
  });
}

// A split child orders device memory on its parent's stream (the pipeline's tied-embedding group
// is split from a group whose stream was set; without this its all-reduce was refused on a GPU).
TEST(LocalWorld, SplitChildrenKeepTheParentsStream) {
  static int stream_stand_in[2];  // any address: the stream is only carried here, never used
  fw::launch<fw::LocalWorld>(2, [](LocalRank& w) {
    EXPECT_EQ(w.comm().split(0, 0).stream(), nullptr);
    w.comm().set_stream(&stream_stand_in[w.rank()]);
    auto sub = w.comm().split(0, 0);
    EXPECT_EQ(sub.stream(), &stream_stand_in[w.rank()]);
    EXPECT_EQ(sub.split(w.rank(), 0, "alone").stream(), &stream_stand_in[w.rank()]);
  });
}

// ---- uneven counts ----------------------------------------------------------------------------

TEST(LocalWorld, UnevenCountsGoThroughTheVForms) {
  fw::launch<fw::LocalWorld>(3, [](LocalRank& w) {
    const std::vector<std::int64_t> counts = {4, 0, 7};
    std::vector<std::vector<float>> all;
    for (int q = 0; q < 3; ++q) all.push_back(comm_test::rank_data<float>(3, q, counts[q]));
    std::vector<float> out(11);
    fw::all_gather_v(w.comm(), all[w.rank()].data(), out.data(), counts);
    std::size_t at = 0;
    for (int q = 0; q < 3; ++q) {
      for (float v : all[q]) EXPECT_EQ(out[at++], v);
    }
    std::vector<std::vector<float>> full;
    for (int q = 0; q < 3; ++q) full.push_back(comm_test::rank_data<float>(4, q, 11));
    std::vector<float> mine(counts[w.rank()]);
    fw::reduce_scatter_v(w.comm(), full[w.rank()].data(), mine.data(), counts, fw::ReduceOp::sum);
    const std::int64_t offset = w.rank() == 0 ? 0 : (w.rank() == 1 ? 4 : 4);
    for (std::int64_t i = 0; i < counts[w.rank()]; ++i) {
      double abs_sum = 0;
      const double e = comm_test::reference(full, offset + i, fw::ReduceOp::sum, &abs_sum);
      comm_test::expect_close(mine[i], e, abs_sum, fw::ReduceOp::sum, "reduce_scatter_v");
    }
  });
  EXPECT_EQ(fw::shard_count(12, 4), 3);
  try {
    (void)fw::shard_count(10, 4, "gradient count");
    ADD_FAILURE();
  } catch (const fw::ShapeError& e) {
    EXPECT_TRUE(contains(e.what(), "gradient count 10 does not divide by the group size 4"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "pad it to 12")) << e.what();
  }
}

// ---- no hangs: timeouts, mismatches, failures ------------------------------------------------

TEST(LocalWorld, MissingRankTurnsIntoCommTimeoutWithinDeadlinePlusTenPercent) {
  // Deadline 2 s. The bound below is the deadline + 10%, plus 0.3 s for a CI machine
  // whose 2 cores run several test processes at once (measured < 2.01 s unloaded).
  constexpr int deadline_ms = 2000;
  std::atomic<int> caught{0};
  std::mutex mu;
  std::vector<std::string> messages;
  std::vector<double> elapsed;
  fw::launch<fw::LocalWorld>(
      4,
      [&](LocalRank& w) {
        auto& c = w.comm();
        c.barrier();
        c.barrier();
        if (w.rank() == 0) {
          while (caught.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;  // never joins collective #3
        }
        std::vector<float> x(16, 1.0f);
        const auto t0 = Clock::now();
        try {
          c.all_reduce(x.data(), x.data(), 16, fw::ReduceOp::sum);
          ADD_FAILURE() << "no timeout";
        } catch (const fw::CommTimeout& e) {
          std::lock_guard lock(mu);
          elapsed.push_back(seconds_since(t0));
          messages.push_back(e.what());
        }
        caught.fetch_add(1);
      },
      with_deadline(deadline_ms));
  ASSERT_EQ(messages.size(), 3u);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    EXPECT_GE(elapsed[i], deadline_ms / 1000.0) << messages[i];
    EXPECT_LE(elapsed[i], deadline_ms / 1000.0 * 1.1 + 0.3) << messages[i];
    EXPECT_TRUE(contains(messages[i], "group 'world'")) << messages[i];
    EXPECT_TRUE(contains(messages[i], "all_reduce(fp32, count 16, sum) #3")) << messages[i];
    EXPECT_TRUE(contains(messages[i], "for rank 0 [last entered #2 barrier]")) << messages[i];
  }
}

TEST(LocalWorld, CallOptionsTimeoutOverridesTheWorldDeadlineForThatCallOnly) {
  // World deadline 60 s; one call asks for 300 ms (blocking) and one for 200 ms (async). Each
  // must fail with CommTimeout after its own timeout, far below the world's; a call with default
  // options and one whose timeout is met behave as before.
  static_assert(fw::call_options_communicator<fw::LocalComm>);
  std::atomic<bool> caught{false};
  std::vector<std::string> messages;
  std::vector<double> elapsed;
  std::vector<float> sums;
  fw::launch<fw::LocalWorld>(
      2,
      [&](LocalRank& w) {
        auto& c = w.comm();
        float x = static_cast<float>(w.rank() + 1);
        c.all_reduce(&x, &x, 1, fw::ReduceOp::sum, fw::CallOptions{});
        float y = 10.0f;
        c.all_reduce(&y, &y, 1, fw::ReduceOp::sum,
                     fw::CallOptions{.timeout = std::chrono::milliseconds(5000)});
        if (w.rank() == 1) sums = {x, y};
        if (w.rank() == 0) {
          while (!caught.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;  // never joins collective #3
        }
        EXPECT_THROW(c.barrier(fw::CallOptions{.timeout = std::chrono::milliseconds(-1)}),
                     fw::ConfigError);
        for (const int ms : {300, 200}) {
          const fw::CallOptions o{.timeout = std::chrono::milliseconds(ms)};
          float z = 1.0f;
          const auto t0 = Clock::now();
          try {
            if (ms == 300) {
              c.all_reduce(&z, &z, 1, fw::ReduceOp::sum, o);
            } else {
              c.all_reduce_async(&z, &z, 1, fw::ReduceOp::sum, o).wait();
            }
            ADD_FAILURE() << "no timeout at " << ms << " ms";
          } catch (const fw::CommTimeout& e) {
            elapsed.push_back(seconds_since(t0));
            messages.push_back(e.what());
          }
        }
        caught.store(true);
      },
      with_deadline(60000));
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums[0], 3.0f);
  EXPECT_EQ(sums[1], 20.0f);
  ASSERT_EQ(messages.size(), 2u);
  const double expect[2] = {0.3, 0.2};
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_GE(elapsed[i], expect[i]) << messages[i];
    // Far below the world's 60 s. The margin is wide: a wait polls and yields before it first
    // reads the clock, which took 0.46 s on top of 0.3 s with 7 busy processes on 2 cores.
    EXPECT_LE(elapsed[i], expect[i] + 2.0) << messages[i];
    EXPECT_TRUE(contains(messages[i], "(deadline " + std::to_string(i == 0 ? 300 : 200) + " ms)"))
        << messages[i];
    EXPECT_TRUE(contains(messages[i], "for rank 0")) << messages[i];
  }
}

TEST(LocalWorld, RecvTimeoutNamesPeerAndTagAndWaitingTags) {
  std::string msg;
  std::atomic<bool> caught{false};
  fw::launch<fw::LocalWorld>(
      2,
      [&](LocalRank& w) {
        if (w.rank() == 0) {
          const int v = 1;
          w.comm().send(&v, 1, 1, 3);  // wrong tag: the peer waits for tag 4
          while (!caught.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        } else {
          int v = 0;
          try {
            w.comm().recv(&v, 1, 0, 4);
          } catch (const fw::CommTimeout& e) {
            msg = e.what();
          }
          caught.store(true);
        }
      },
      with_deadline(200));
  EXPECT_TRUE(contains(msg, "recv #1 (int32, count 1) on rank 1 from rank 0 with tag 4")) << msg;
  EXPECT_TRUE(contains(msg, "waiting under tags 3")) << msg;
}

TEST(LocalWorld, MismatchedCallsThrowOnEveryRankNamingRanksAndFields) {
  std::mutex mu;
  std::vector<std::string> messages;
  fw::launch<fw::LocalWorld>(
      4,
      [&](LocalRank& w) {
        auto& c = w.comm();
        std::vector<float> x(100, 1.0f);
        const std::int64_t count = w.rank() == 2 ? 99 : 100;
        try {
          c.all_reduce(x.data(), x.data(), count, fw::ReduceOp::sum);
          ADD_FAILURE() << "no mismatch";
        } catch (const fw::CommMismatch& e) {
          std::lock_guard lock(mu);
          messages.push_back(e.what());
        }
        // the group stays usable: a wrong root is caught the same way, then a correct call works
        try {
          c.broadcast(x.data(), 100, w.rank() == 3 ? 1 : 0);
          ADD_FAILURE() << "no mismatch";
        } catch (const fw::CommMismatch& e) {
          EXPECT_TRUE(
              contains(e.what(), "rank 3 called broadcast(fp32, count 100, root 1) (root differ)"))
              << e.what();
        }
        try {
          if (w.rank() == 1) {
            c.barrier();
          } else {
            c.all_reduce(x.data(), x.data(), 100, fw::ReduceOp::max);
          }
          ADD_FAILURE() << "no mismatch";
        } catch (const fw::CommMismatch& e) {
          EXPECT_TRUE(contains(e.what(), "rank 1 called barrier (op differ)")) << e.what();
        }
        std::vector<std::int32_t> y(5, w.rank());
        c.all_reduce(y.data(), y.data(), 5, fw::ReduceOp::sum);
        EXPECT_EQ(y[4], 6);
      },
      with_deadline(20000, /*debug=*/true));
  ASSERT_EQ(messages.size(), 4u);
  for (const auto& m : messages) {
    EXPECT_EQ(m, messages[0]);  // every rank reports the same
    EXPECT_TRUE(contains(m, "collective #1")) << m;
    EXPECT_TRUE(contains(m, "rank 0 called all_reduce(fp32, count 100, sum)")) << m;
    EXPECT_TRUE(contains(m, "rank 2 called all_reduce(fp32, count 99, sum) (count differ)")) << m;
  }
}

TEST(LocalWorld, RankThatThrowsMakesTheOthersFailFast) {
  std::atomic<int> collateral{0};
  std::mutex mu;
  std::string collateral_msg;
  const auto t0 = Clock::now();
  try {
    fw::launch<fw::LocalWorld>(
        4,
        [&](LocalRank& w) {
          std::vector<float> x(64, 1.0f);
          w.comm().all_reduce(x.data(), x.data(), 64, fw::ReduceOp::sum);
          if (w.rank() == 2) throw std::runtime_error("boom in step 1 on rank 2");
          try {
            w.comm().all_reduce(x.data(), x.data(), 64, fw::ReduceOp::sum);
          } catch (const fw::CommError& e) {
            collateral.fetch_add(1);
            std::lock_guard lock(mu);
            collateral_msg = e.what();
            throw;
          }
        },
        with_deadline(60000));
    ADD_FAILURE() << "launch did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom in step 1 on rank 2");  // the first failure, not the collateral
  }
  EXPECT_LT(seconds_since(t0), 5.0);  // far below the 60 s deadline: nobody waited it out
  EXPECT_EQ(collateral.load(), 3);
  EXPECT_TRUE(contains(collateral_msg, "world rank 2 failed: boom in step 1 on rank 2"))
      << collateral_msg;
  EXPECT_TRUE(contains(collateral_msg, "all_reduce(fp32, count 64, sum) #2")) << collateral_msg;
}

TEST(LocalWorld, RankThatReturnedEarlyMakesTheOthersFailFast) {
  const auto t0 = Clock::now();
  std::atomic<int> fast{0};
  fw::launch<fw::LocalWorld>(
      3,
      [&](LocalRank& w) {
        if (w.rank() == 1) return;
        try {
          w.comm().barrier();
        } catch (const fw::CommError& e) {
          if (contains(e.what(), "rank 1 returned from its function without joining it"))
            fast.fetch_add(1);
        }
      },
      with_deadline(60000));
  EXPECT_EQ(fast.load(), 2);
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(LocalWorld, BadArgumentsAreTypedErrors) {
  EXPECT_THROW(fw::launch<fw::LocalWorld>(0, [](LocalRank&) {}), fw::ConfigError);
  fw::launch<fw::LocalWorld>(1, [](LocalRank& w) {
    float x = 0;
    EXPECT_THROW(w.comm().broadcast(&x, 1, 1), fw::ConfigError);
    EXPECT_THROW(w.comm().send(&x, 1, 2, 0), fw::ConfigError);
    EXPECT_THROW(w.comm().all_reduce(&x, &x, -1, fw::ReduceOp::sum), fw::ShapeError);
    EXPECT_THROW((void)w.comm().split(-1, 0), fw::ConfigError);
    EXPECT_EQ(w.memory().rank(), 0);
  });
}

TEST(LocalWorld, EachRankHasItsOwnAccountant) {
  fw::launch<fw::LocalWorld>(3, [](LocalRank& w) {
    fw::Tensor<float, fw::Host> t({static_cast<std::int64_t>(10 * (w.rank() + 1))},
                                  fw::MemTag::comm_buffers, w.ctx().memory());
    w.comm().barrier();
    EXPECT_EQ(w.memory().current(fw::MemTag::comm_buffers), 40u * (w.rank() + 1));
    EXPECT_EQ(w.memory().rank(), w.rank());
  });
}

// ---- measured traffic
// ----------------------------------------------------------------------------

// What each rank's copy loops move between ranks, per op, at counts that do not divide: rank r of
// an all_reduce of `count` owns slice r (count/N elements, one more for the first count % N
// ranks), which it reads from N−1 peers and writes into N−1 peers; the other ops move whole
// blocks into the caller. Expected values follow from the algorithm in the file comment alone.
TEST(LocalWorld, TrafficIsCountedPerOpAsTheBytesMove) {
  for (int n : {1, 3, 4}) {
    fw::launch<fw::LocalWorld>(n, [n](LocalRank& w) {
      auto& c = w.comm();
      const int r = w.rank();
      constexpr std::int64_t count = 7;
      constexpr std::uint64_t s = sizeof(float);
      std::vector<float> a(count * static_cast<std::size_t>(n), 1.0f), b(a.size());
      EXPECT_EQ(c.traffic().total(), 0u);

      c.all_reduce(a.data(), b.data(), count, fw::ReduceOp::sum);
      const std::uint64_t slice = count / n + (r < count % n ? 1 : 0);
      auto t = c.traffic();
      EXPECT_EQ(t.in[0], (n - 1) * slice * s) << n;
      EXPECT_EQ(t.out[0], (n - 1) * slice * s) << n;

      c.reset_traffic();
      c.reduce_scatter(a.data(), b.data(), count, fw::ReduceOp::sum);
      c.all_gather(a.data(), b.data(), count);
      c.broadcast(a.data(), count, n - 1);
      t = c.traffic();
      EXPECT_EQ(t.moved(fw::CommOp::reduce_scatter), (n - 1) * count * s);
      EXPECT_EQ(t.moved(fw::CommOp::all_gather), (n - 1) * count * s);
      EXPECT_EQ(t.moved(fw::CommOp::broadcast), r == n - 1 ? 0u : count * s);
      EXPECT_EQ(t.out[static_cast<std::size_t>(fw::CommOp::reduce_scatter)], 0u);

      c.reset_traffic();
      if (n > 1 && r == 0) c.send(a.data(), 5, 1, 0);
      if (n > 1 && r == 1) c.recv(b.data(), 5, 0, 0);
      t = c.traffic();
      EXPECT_EQ(t.out[static_cast<std::size_t>(fw::CommOp::send)], n > 1 && r == 0 ? 5 * s : 0u);
      EXPECT_EQ(t.in[static_cast<std::size_t>(fw::CommOp::recv)], n > 1 && r == 1 ? 5 * s : 0u);
      EXPECT_EQ(t.total(), n > 1 && r < 2 ? 5 * s : 0u);
    });
  }
}

// Summed over the ranks, an all_reduce moves (N−1)·P in and (N−1)·P out, the total a ring moves.
TEST(LocalWorld, AllReduceTrafficSumsToTheRingTotal) {
  constexpr int n = 4;
  constexpr std::int64_t count = 1031;
  std::atomic<std::uint64_t> in{0}, out{0};
  fw::launch<fw::LocalWorld>(n, [&](LocalRank& w) {
    std::vector<double> a(count, 1.0);
    w.comm().all_reduce(a.data(), a.data(), count, fw::ReduceOp::sum);
    const auto t = w.comm().traffic();
    in += t.in[0];
    out += t.out[0];
  });
  EXPECT_EQ(in.load(), (n - 1) * count * sizeof(double));
  EXPECT_EQ(out.load(), (n - 1) * count * sizeof(double));
}
