// The exchange checker (schedule/exchange.hpp) on the ring's programs
// (parallel/cp/ring_schedule.hpp) and on broken ones: each rule's violation is built by hand and
// must be the problem reported.
#include "fourway/schedule/exchange.hpp"

#include <gtest/gtest.h>

#include <string>

#include "fourway/core/error.hpp"
#include "fourway/parallel/cp/ring_schedule.hpp"

namespace s = fourway::schedule;
namespace cp = fourway::cp;

namespace {

// proved while compiling: a constexpr program goes through the same checker
static_assert(s::check(cp::ring_exchange(4, cp::RingDirection::backward, 96, 96)).ok());
static_assert(s::check(cp::ring_exchange(2, cp::RingDirection::forward, 8, 0)).ok());

s::Problem problem(const s::Exchange& x, s::Blocking b = s::Blocking::rendezvous) {
  return s::check(x, b).problem;
}

TEST(RingExchange, EveryRingIsValidUnderRendezvousAndEager) {
  for (int c = 1; c <= 16; ++c) {
    for (auto dir : {cp::RingDirection::forward, cp::RingDirection::backward}) {
      const s::Exchange x = cp::ring_exchange(c, dir, 6 * c, 12 * c);
      for (auto b : {s::Blocking::rendezvous, s::Blocking::eager}) {
        const s::ExchangeResult res = s::check(x, b);
        EXPECT_TRUE(res.ok()) << s::describe(res, x) << "\n" << s::to_string(x);
      }
    }
  }
}

// The programs themselves, counted from the ring's definition: forward c − 1 passes of a block
// and c computes; backward c − 1 passes of a block, c of gradients (c > 1) and c computes.
TEST(RingExchange, RowsHoldThePassesTheRingMakes) {
  for (int c : {1, 2, 3, 5}) {
    const s::Exchange f = cp::ring_exchange(c, cp::RingDirection::forward, 10, 0);
    const s::Exchange b = cp::ring_exchange(c, cp::RingDirection::backward, 10, 20);
    for (int r = 0; r < c; ++r) {
      int sends = 0, recvs = 0, computes = 0, grads = 0;
      for (const s::Transfer& t : b.moves[static_cast<std::size_t>(r)]) {
        sends += t.move == s::Move::send;
        recvs += t.move == s::Move::recv;
        computes += t.move == s::Move::compute;
        grads += t.tag == cp::ring_gradient_tag && t.elements == 20;
        if (t.move == s::Move::send) {
          EXPECT_EQ(t.peer, (r + 1) % c);
        } else if (t.move == s::Move::recv) {
          EXPECT_EQ(t.peer, (r + c - 1) % c);
        }
      }
      const int gradient_passes = c > 1 ? c : 0;
      EXPECT_EQ(sends, c - 1 + gradient_passes);
      EXPECT_EQ(recvs, c - 1 + gradient_passes);
      EXPECT_EQ(computes, c);
      EXPECT_EQ(grads, 2 * gradient_passes);
      EXPECT_EQ(f.moves[static_cast<std::size_t>(r)].size(), static_cast<std::size_t>(3 * c - 2));
    }
  }
}

TEST(RingExchange, ARecvWithoutItsSendIsUnmatched) {
  s::Exchange x = cp::ring_exchange(3, cp::RingDirection::forward, 10, 0);
  auto& row = x.moves[1];
  row.erase(row.begin() + 1);  // rank 1's first recv
  const s::ExchangeResult res = s::check(x);
  EXPECT_EQ(res.problem, s::Problem::unmatched);
  EXPECT_NE(s::describe(res, x).find("rank 1"), std::string::npos) << s::describe(res, x);
}

TEST(RingExchange, SizesThatDisagreeAreRefused) {
  s::Exchange x = cp::ring_exchange(4, cp::RingDirection::backward, 10, 20);
  x.moves[2][0].elements = 11;  // rank 2 sends a longer block than rank 3 expects
  EXPECT_EQ(problem(x), s::Problem::size_mismatch);
}

// c = 2: both ends of the ring are one rank, so the block and the gradient share a stream; a
// rank that receives them in another order than its peer sends them would take the wrong one.
TEST(RingExchange, MessagesOfAStreamInAnotherOrderAreRefused) {
  s::Exchange x = cp::ring_exchange(2, cp::RingDirection::backward, 10, 10);
  auto& row = x.moves[1];  // send kv, recv kv, compute0, send dkv, recv dkv, ...
  ASSERT_EQ(row[1].tag, cp::ring_backward_tag);
  ASSERT_EQ(row[4].tag, cp::ring_gradient_tag);
  std::swap(row[1].tag, row[4].tag);
  const s::ExchangeResult res = s::check(x);
  EXPECT_EQ(res.problem, s::Problem::stream_order);
  EXPECT_NE(s::describe(res, x).find("by order"), std::string::npos);
}

TEST(RingExchange, PeersOutsideTheGroupOrTheRankItselfAreRefused) {
  s::Exchange x = cp::ring_exchange(3, cp::RingDirection::forward, 10, 0);
  x.moves[0][0].peer = 0;
  EXPECT_EQ(problem(x), s::Problem::wrong_peer);
  x.moves[0][0].peer = 3;
  EXPECT_EQ(problem(x), s::Problem::wrong_peer);
  s::Exchange rows = cp::ring_exchange(3, cp::RingDirection::forward, 10, 0);
  rows.moves.pop_back();
  EXPECT_EQ(problem(rows), s::Problem::bad_table);
}

// Every rank sends before it posts its recv, each in a group of its own: with sends that block
// until matched (one NCCL communicator) nobody reaches a recv; with eager sends it finishes.
TEST(RingExchange, ASendOutsideItsRecvsGroupDeadlocksUnderRendezvous) {
  s::Exchange x = cp::ring_exchange(3, cp::RingDirection::forward, 10, 0);
  for (auto& row : x.moves) row.insert(row.begin() + 1, s::compute_step(-1));
  const s::ExchangeResult res = s::check(x, s::Blocking::rendezvous);
  EXPECT_EQ(res.problem, s::Problem::deadlock);
  EXPECT_NE(s::describe(res, x).find("deadlock"), std::string::npos);
  EXPECT_TRUE(s::check(x, s::Blocking::eager).ok());
}

TEST(RingExchange, VerifyThrowsAScheduleErrorNamingTheRank) {
  s::Exchange x = cp::ring_exchange(2, cp::RingDirection::forward, 10, 0);
  x.moves[0][0].elements = 0;
  try {
    s::verify(x);
    FAIL() << "an exchange with an empty message was accepted";
  } catch (const fourway::ScheduleError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fourway: exchange ring attention forward, rank 0"), std::string::npos)
        << what;
  }
}

}  // namespace
