#include "fourway/schedule/check.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fourway/schedule/generators.hpp"

namespace s = fourway::schedule;
namespace fw = fourway;

namespace {

/// Index of `op(mb, chunk)` in rank r's list.
std::size_t at(const s::Table& t, int r, s::Op op, int mb, int chunk) {
  const auto& row = t.actions[static_cast<std::size_t>(r)];
  for (std::size_t i = 0; i < row.size(); ++i)
    if (row[i].op == op && row[i].micro_batch == mb && row[i].chunk == chunk) return i;
  ADD_FAILURE() << "no " << s::op_name(op) << mb << "." << chunk << " on rank " << r;
  return 0;
}

void erase(s::Table& t, int r, std::size_t i) {
  auto& row = t.actions[static_cast<std::size_t>(r)];
  row.erase(row.begin() + static_cast<std::ptrdiff_t>(i));
}

s::Problem problem(const s::Table& t, s::Blocking b = s::Blocking::eager) {
  return s::check(t, b).problem;
}

std::vector<s::Table> every_generated_table() {
  std::vector<s::Table> out;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, p, 2 * p, 4 * p + 1}) {
      out.push_back(s::gpipe(p, m, 16));
      if (m >= p) {
        out.push_back(s::one_f_one_b(p, m, 16));
        out.push_back(s::zb_h1(p, m, 16));
        out.push_back(s::zb_v(p, m, 16));
      }
      if (p >= 2 && m >= p && m % p == 0)
        for (int v : {2, 3}) out.push_back(s::interleaved(p, m, v, 16));
    }
  }
  return out;
}

}  // namespace

TEST(ScheduleCheck, EveryGeneratedTableIsValid) {
  for (const s::Table& t : every_generated_table()) {
    const s::CheckResult r = s::check(t);
    EXPECT_TRUE(r.ok()) << s::describe(r, t) << "\n" << s::to_string(t);
  }
}

// GPipe, 1F1B and ZB-H1 also run where sends block until matched; interleaved and ZB-V need
// eager sends once m > p (docs/schedule.md says so; this pins it).
TEST(ScheduleCheck, WhichTablesAreSafeWhenSendsBlock) {
  for (const s::Table& t : every_generated_table()) {
    const bool rendezvous_safe = s::check(t, s::Blocking::rendezvous).ok();
    const std::string name(t.name);
    if (name == "GPipe" || name == "1F1B" || name == "ZB-H1") {
      EXPECT_TRUE(rendezvous_safe) << s::to_string(t);
    }
  }
  EXPECT_TRUE(s::check(s::interleaved(4, 4, 2), s::Blocking::rendezvous).ok());
  EXPECT_EQ(problem(s::interleaved(4, 8, 2), s::Blocking::rendezvous), s::Problem::deadlock);
  EXPECT_EQ(problem(s::zb_v(3, 6), s::Blocking::rendezvous), s::Problem::deadlock);
}

TEST(ScheduleCheck, SwappedMessagesAreRefused) {
  // rank 1 receives micro-batch 1's activation where it expects micro-batch 0's
  s::Table t = s::one_f_one_b(2, 2);
  auto& row = t.actions[1];
  std::swap(row[at(t, 1, s::Op::recv_activation, 0, 0)],
            row[at(t, 1, s::Op::recv_activation, 1, 0)]);
  const s::CheckResult r = s::check(t);
  EXPECT_EQ(r.problem, s::Problem::missing_input);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(s::to_string(r.action), "F0.1");
  EXPECT_THROW(s::verify(t), fw::ScheduleError);
}

TEST(ScheduleCheck, AMissingRecvIsAMissingInput) {
  s::Table t = s::gpipe(3, 2);
  erase(t, 2, at(t, 2, s::Op::recv_activation, 1, 1));
  EXPECT_EQ(problem(t), s::Problem::missing_input);
}

TEST(ScheduleCheck, ASendWithoutItsRecvOrARecvWithoutItsSendIsUnmatched) {
  s::Table t = s::gpipe(2, 2);
  erase(t, 0, at(t, 0, s::Op::send_activation, 1, 0));
  const s::CheckResult r = s::check(t);
  EXPECT_EQ(r.problem, s::Problem::unmatched);
  EXPECT_EQ(r.rank, 1);
  EXPECT_NE(s::describe(r, t).find("rank 0 has no matching send_F"), std::string::npos)
      << s::describe(r, t);
}

TEST(ScheduleCheck, SizesMustAgree) {
  s::Table t = s::one_f_one_b(2, 2, 64);
  t.actions[1][at(t, 1, s::Op::recv_activation, 1, 0)].elements = 63;
  EXPECT_EQ(problem(t), s::Problem::size_mismatch);
}

TEST(ScheduleCheck, EveryMicroBatchRunsExactlyOnce) {
  s::Table dup = s::gpipe(2, 2);
  dup.actions[0].push_back(s::forward(1, 0));
  EXPECT_EQ(problem(dup), s::Problem::duplicate);

  s::Table missing = s::gpipe(2, 2);
  erase(missing, 0, at(missing, 0, s::Op::backward, 1, 0));
  EXPECT_EQ(problem(missing), s::Problem::missing_compute);

  s::Table mixed = s::gpipe(1, 1);
  mixed.actions[0].push_back(s::backward_input(0, 0));
  EXPECT_EQ(problem(mixed), s::Problem::mixed_backward);
}

TEST(ScheduleCheck, ForwardBeforeBackwardBeforeWeight) {
  s::Table t = s::zb_h1(2, 2);
  auto& row = t.actions[1];
  std::swap(row[at(t, 1, s::Op::backward_input, 0, 1)],
            row[at(t, 1, s::Op::backward_weight, 0, 1)]);
  EXPECT_EQ(problem(t), s::Problem::out_of_order);

  s::Table early = s::gpipe(2, 1);  // a send before the forward that produces it
  auto& r0 = early.actions[0];
  std::swap(r0[0], r0[1]);
  EXPECT_EQ(problem(early), s::Problem::out_of_order);
}

TEST(ScheduleCheck, ComputeRunsWhereItsChunkLives) {
  s::Table t = s::gpipe(2, 1);
  t.actions[0].insert(t.actions[0].begin(), s::forward(0, 1));
  EXPECT_EQ(problem(t), s::Problem::wrong_rank);
  s::Table peer = s::gpipe(3, 1);
  peer.actions[0][at(peer, 0, s::Op::send_activation, 0, 0)].peer = 2;
  EXPECT_EQ(problem(peer), s::Problem::wrong_peer);
  s::Table range = s::gpipe(2, 1);
  range.actions[0][0].micro_batch = 1;
  EXPECT_EQ(problem(range), s::Problem::out_of_range);
  s::Table rows = s::gpipe(2, 1);
  rows.actions.pop_back();
  EXPECT_EQ(problem(rows), s::Problem::bad_table);
}

TEST(ScheduleCheck, ACycleOfWaitsIsADeadlock) {
  // rank 0 waits for the gradient before it sends the activation that produces it
  s::Table t;
  t.ranks = 2;
  t.actions = {{s::forward(0, 0),
                {s::Op::recv_gradient, 0, 1, 1, 1},
                s::backward(0, 0),
                {s::Op::send_activation, 0, 0, 1, 1}},
               {{s::Op::recv_activation, 0, 0, 0, 1},
                s::forward(0, 1),
                s::backward(0, 1),
                {s::Op::send_gradient, 0, 1, 0, 1}}};
  for (s::Blocking b : {s::Blocking::eager, s::Blocking::rendezvous}) {
    const s::CheckResult r = s::check(t, b);
    EXPECT_EQ(r.problem, s::Problem::deadlock);
    EXPECT_NE(s::describe(r, t).find("deadlock"), std::string::npos);
  }
  // the same messages posted in the right order run
  std::swap(t.actions[0][1], t.actions[0][3]);
  std::swap(t.actions[0][2], t.actions[0][3]);
  EXPECT_TRUE(s::check(t, s::Blocking::rendezvous).ok()) << s::to_string(t);
}

// Interleaved 1F1B with m > p posts a send in one group and its rank's next recv in another:
// fine when sends return at once, a deadlock when they block until matched.
TEST(ScheduleCheck, BlockingSendsDeadlockWhereEagerOnesDoNot) {
  const s::Table t = s::interleaved(2, 4, 2);
  EXPECT_TRUE(s::check(t, s::Blocking::eager).ok());
  EXPECT_EQ(problem(t, s::Blocking::rendezvous), s::Problem::deadlock);
}

// A forward-only (evaluation) table needs no backward and may hold none: a BW, B or W, or a
// gradient message, is refused by name.
TEST(ScheduleCheck, AForwardOnlyTableRefusesABackward) {
  s::Table t = s::forward_only(s::one_f_one_b(2, 2), 4);
  ASSERT_TRUE(s::check(t).ok());
  s::Table bw = t;
  bw.actions[1].push_back(s::backward(0, 1));
  EXPECT_EQ(problem(bw), s::Problem::backward_in_forward_only);
  EXPECT_NE(s::describe(s::check(bw), bw).find("a backward in a forward-only (evaluation) table"),
            std::string::npos);
  s::Table grad = t;
  grad.actions[1].push_back({s::Op::send_gradient, 0, 1, 0, 4});
  grad.actions[0].push_back({s::Op::recv_gradient, 0, 1, 1, 4});
  EXPECT_EQ(problem(grad), s::Problem::backward_in_forward_only);
  s::Table missing = t;  // a forward that never runs is still missing
  missing.actions[1].pop_back();
  EXPECT_EQ(problem(missing), s::Problem::missing_compute);
  // a training table is still held to its backwards
  s::Table training = s::one_f_one_b(2, 2, 4);
  training.forward_only = false;
  ASSERT_TRUE(s::check(training).ok());
  for (auto& row : training.actions)
    std::erase_if(row, [](const s::Action& a) { return a.op == s::Op::backward; });
  EXPECT_EQ(problem(training), s::Problem::missing_compute);
}
