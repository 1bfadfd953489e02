// The strict world (CommOptions::strict, docs/comm.md "The strict world"): LocalWorld held to
// NCCL's contract. Each test runs the same code in the lenient world, where it passes (or the
// opposite), so the strict rule itself is what the test sees.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "fourway/comm/local_world.hpp"
#include "fourway/core/tensor.hpp"

namespace fw = fourway;
using Clock = std::chrono::steady_clock;
using LocalRank = fw::World<fw::LocalWorld>;

namespace {

fw::CommOptions options(bool strict, int deadline_ms = 20000) {
  fw::CommOptions o;
  o.deadline = std::chrono::milliseconds(deadline_ms);
  o.strict = strict;
  return o;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

fw::Tensor<float, fw::Host> filled(LocalRank& w, std::int64_t n, float v) {
  fw::Tensor<float, fw::Host> t(fw::Shape{n}, fw::MemTag::comm_buffers, w.memory());
  for (std::int64_t i = 0; i < n; ++i) t[i] = v + static_cast<float>(i);
  return t;
}

/// Runs `fn` on `n` ranks and returns the message of the first failure ("" when none).
template <class Fn>
std::string failure(int n, const fw::CommOptions& o, Fn fn) {
  try {
    fw::launch<fw::LocalWorld>(n, fn, o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace

// ---- buffers: memory the backend allocated, as NCCL takes device memory only ----------------

TEST(StrictWorld, RefusesHostScalarsVectorsAndStackArrays) {
  for (int which = 0; which < 3; ++which) {
    std::string what;
    fw::launch<fw::LocalWorld>(
        2,
        [&](LocalRank& w) {
          double scalar = 1.0;
          std::vector<float> vec(4, 1.0f);
          std::int64_t stack[3] = {1, 2, 3};
          try {
            if (which == 0) w.comm().all_reduce(&scalar, &scalar, 1, fw::ReduceOp::sum);
            if (which == 1) w.comm().all_gather(vec.data(), vec.data(), 2);
            if (which == 2) w.comm().broadcast(stack, 3, 0);
            ADD_FAILURE() << "case " << which << " was not refused";
          } catch (const fw::CommError& e) {
            if (w.rank() == 0) what = e.what();
          }
        },
        options(true));
    EXPECT_TRUE(contains(what, "pageable host memory")) << what;
    EXPECT_TRUE(contains(what, "NCCL reads and writes device memory only")) << what;
    EXPECT_TRUE(contains(what, "strict world")) << what;
  }
  // the same calls run in the lenient world
  fw::launch<fw::LocalWorld>(2, [](LocalRank& w) {
    double scalar = 1.0;
    w.comm().all_reduce(&scalar, &scalar, 1, fw::ReduceOp::sum);
    EXPECT_EQ(scalar, 2.0);
  });
}

TEST(StrictWorld, AcceptsTensorsAndViewsButNotPastTheirEnd) {
  fw::launch<fw::LocalWorld>(
      2,
      [](LocalRank& w) {
        auto t = filled(w, 8, static_cast<float>(w.rank()));
        w.comm().all_reduce(t.data(), t.data(), 8, fw::ReduceOp::sum);
        EXPECT_EQ(t[0], 1.0f);
        w.comm().all_reduce(t.data() + 4, t.data() + 4, 4, fw::ReduceOp::sum);  // a view
        EXPECT_EQ(t[4], 2.0f * (1.0f + 8.0f));
        EXPECT_THROW(w.comm().all_reduce(t.data() + 4, t.data() + 4, 5, fw::ReduceOp::sum),
                     fw::CommError);
      },
      options(true));
}

TEST(StrictWorld, RefusesAFreedTensor) {
  fw::launch<fw::LocalWorld>(
      1,
      [](LocalRank& w) {
        auto t = filled(w, 4, 0.0f);
        float* p = t.data();
        t.reset();
        EXPECT_THROW(w.comm().all_reduce(p, p, 4, fw::ReduceOp::sum), fw::CommError);
      },
      options(true));
}

// ---- point-to-point is a rendezvous, except inside a group ----------------------------------

TEST(StrictWorld, TwoRanksThatEachSendThenReceiveDeadlockNamingBothRanks) {
  auto exchange = [](LocalRank& w) {
    auto out = filled(w, 16, 1.0f);
    auto in = filled(w, 16, 0.0f);
    const int peer = 1 - w.rank();
    w.comm().send(out.data(), 16, peer, 7);
    w.comm().recv(in.data(), 16, peer, 7);
    EXPECT_EQ(in[3], 4.0f);
  };
  // lenient: eager sends pass each other
  EXPECT_EQ(failure(2, options(false), exchange), "");
  // strict: found certain well before the 20 s deadline, with every rank's pending operations
  const auto t0 = Clock::now();
  const std::string what = failure(2, options(true), exchange);
  const double s = seconds_since(t0);
  std::printf("%s\n(found in %.3f s)\n", what.c_str(), s);
  EXPECT_LT(s, 5.0) << "the deadlock was found by the deadline, not by the detector";
  EXPECT_TRUE(contains(what, "CommDeadlock")) << what;
  EXPECT_TRUE(contains(what,
                       "world rank 0: in group 'world' (2 ranks): send (fp32, count 16) to "
                       "rank 1 with tag 7"))
      << what;
  EXPECT_TRUE(contains(what,
                       "world rank 1: in group 'world' (2 ranks): send (fp32, count 16) to "
                       "rank 0 with tag 7"))
      << what;
  EXPECT_TRUE(contains(what, "group_start()")) << what;
}

TEST(StrictWorld, TheSameExchangeAsOneGroupCompletes) {
  for (std::int64_t n : {std::int64_t{16}, std::int64_t{3} << 20}) {  // 64 B and 12 MiB
    fw::launch<fw::LocalWorld>(
        2,
        [&](LocalRank& w) {
          auto out = filled(w, n, static_cast<float>(10 * w.rank()));
          auto in = filled(w, n, -1.0f);
          const int peer = 1 - w.rank();
          w.comm().group_start();
          fw::Work s = w.comm().send_async(out.data(), n, peer, 7);
          fw::Work r = w.comm().recv_async(in.data(), n, peer, 7);
          w.comm().group_end();
          r.wait();
          s.wait();
          EXPECT_EQ(in[n - 1], static_cast<float>(10 * peer) + static_cast<float>(n - 1));
        },
        options(true));
  }
}

TEST(StrictWorld, ASendWaitsForItsRecvToBePosted) {
  for (bool strict : {false, true}) {
    double send_seconds = 0;
    fw::launch<fw::LocalWorld>(
        2,
        [&](LocalRank& w) {
          auto buf = filled(w, 8, 1.0f);
          if (w.rank() == 0) {
            const auto t0 = Clock::now();
            w.comm().send(buf.data(), 8, 1, 0);
            send_seconds = seconds_since(t0);
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            w.comm().recv(buf.data(), 8, 0, 0);
          }
        },
        options(strict));
    if (strict) {
      EXPECT_GE(send_seconds, 0.25) << "a strict send returned before its recv was posted";
    } else {
      EXPECT_LT(send_seconds, 0.25) << "a lenient send is eager";
    }
  }
}

TEST(StrictWorld, MessagesMatchByOrderNotTag) {
  auto swapped = [](LocalRank& w) {
    auto a = filled(w, 4, 1.0f);
    auto b = filled(w, 4, 2.0f);
    if (w.rank() == 0) {
      w.comm().group_start();
      fw::Work first = w.comm().send_async(a.data(), 4, 1, 1);
      fw::Work second = w.comm().send_async(b.data(), 4, 1, 2);
      w.comm().group_end();
      first.wait();
      second.wait();
    } else {
      w.comm().group_start();
      fw::Work second = w.comm().recv_async(b.data(), 4, 0, 2);
      fw::Work first = w.comm().recv_async(a.data(), 4, 0, 1);
      w.comm().group_end();
      second.wait();
      first.wait();
      EXPECT_EQ(a[0], 1.0f);
      EXPECT_EQ(b[0], 2.0f);
    }
  };
  EXPECT_EQ(failure(2, options(false), swapped), "");  // LocalWorld matches tags
  const std::string what = failure(2, options(true), swapped);
  EXPECT_TRUE(contains(what, "CommMismatch")) << what;
  EXPECT_TRUE(contains(what, "posting order, not tag")) << what;
}

TEST(StrictWorld, AGroupHoldsPointToPointOnly) {
  fw::launch<fw::LocalWorld>(
      1,
      [](LocalRank& w) {
        auto t = filled(w, 4, 0.0f);
        w.comm().group_start();
        EXPECT_THROW(w.comm().all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum),
                     fw::ConfigError);
        EXPECT_THROW(w.comm().send(t.data(), 4, 0, 0), fw::ConfigError);
        EXPECT_THROW(w.comm().barrier(), fw::ConfigError);
        w.comm().group_end();
        EXPECT_THROW(w.comm().group_end(), fw::ConfigError);
      },
      options(true));
}

// ---- collectives in the same order on every rank of every group ------------------------------

TEST(StrictWorld, CollectivesOfTwoGroupsInDifferentOrdersDeadlock) {
  auto crossed = [](LocalRank& w) {
    fw::LocalComm a = w.comm().split(0, w.rank(), "a");
    fw::LocalComm b = w.comm().split(0, w.rank(), "b");
    auto t = filled(w, 4, 1.0f);
    if (w.rank() == 0) {
      a.all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum);
      b.all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum);
    } else {
      b.all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum);
      a.all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum);
    }
  };
  const auto t0 = Clock::now();
  const std::string what = failure(2, options(true), crossed);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_TRUE(contains(what, "CommDeadlock")) << what;
  EXPECT_TRUE(contains(what, "in group 'a' (2 ranks): all_reduce(fp32, count 4, sum)")) << what;
  EXPECT_TRUE(contains(what, "in group 'b' (2 ranks): all_reduce(fp32, count 4, sum)")) << what;
}

TEST(StrictWorld, ASlowRankIsATimeoutNotADeadlock) {
  // rank 1 computes past the deadline: rank 0's wait must end in CommTimeout, since rank 1 is
  // running (it could still arrive), within the deadline + 10% (+ 0.3 s for loaded CI cores, as
  // the LocalWorld and MPI timeout tests allow)
  double waited = 0;
  const std::string what = failure(2, options(true, 400), [&](LocalRank& w) {
    auto t = filled(w, 4, 1.0f);
    if (w.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const auto t0 = Clock::now();
    try {
      w.comm().all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum);
    } catch (...) {
      if (w.rank() == 0) waited = seconds_since(t0);
      throw;
    }
  });
  EXPECT_GE(waited, 0.4);
  EXPECT_LE(waited, 0.4 * 1.1 + 0.3);
  EXPECT_TRUE(contains(what, "CommTimeout")) << what;
  EXPECT_FALSE(contains(what, "CommDeadlock")) << what;
  EXPECT_TRUE(contains(what, "Pending operations")) << what;
}

TEST(StrictWorld, ACommunicatorIsAStream) {
  // an async recv queued before a send on the same communicator blocks it (a communicator is a
  // stream, on NCCL and on LocalWorld alike): rank 0 recv_async then send, rank 1 the same ->
  // a deadlock, found by the detector
  auto streamed = [](LocalRank& w) {
    auto in = filled(w, 4, 0.0f);
    auto out = filled(w, 4, 1.0f);
    const int peer = 1 - w.rank();
    fw::Work r = w.comm().recv_async(in.data(), 4, peer, 0);
    w.comm().send(out.data(), 4, peer, 0);
    r.wait();
  };
  const std::string what = failure(2, options(true), streamed);
  EXPECT_TRUE(contains(what, "CommDeadlock")) << what;
}
