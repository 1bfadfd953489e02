#include "fourway/schedule/generators.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fourway/schedule/check.hpp"

namespace s = fourway::schedule;
namespace fw = fourway;

namespace {

/// The compute actions of one rank, written as in the papers' figures ("F0 B1 W0 ...").
std::string computes(const s::Table& t, int r) {
  std::string out;
  for (const s::Action& a : t.actions[static_cast<std::size_t>(r)]) {
    if (!s::is_compute(a.op)) continue;
    if (!out.empty()) out += " ";
    out += std::string(s::op_name(a.op)) + std::to_string(a.micro_batch);
    if (t.chunks_per_rank > 1) out += fourway::detail::cat("c", a.chunk);
  }
  return out;
}

}  // namespace

// Generated and proved at compile time.
static_assert(s::check(s::one_f_one_b(4, 8)).ok());
static_assert(s::check(s::gpipe(3, 2), s::Blocking::rendezvous).ok());
static_assert(s::check(s::zb_h1(3, 5), s::Blocking::rendezvous).ok());
static_assert(s::check(s::interleaved(2, 4, 2)).ok());
static_assert(s::check(s::zb_v(2, 4)).ok());
static_assert(s::validate({s::Kind::one_f_one_b, 4, 3}) == s::RequestProblem::fewer_micro_batches);

TEST(ScheduleGenerators, GPipeRunsAllForwardsThenAllBackwards) {
  const s::Table t = s::gpipe(2, 3);
  EXPECT_EQ(computes(t, 0), "F0 F1 F2 BW0 BW1 BW2");
  EXPECT_EQ(computes(t, 1), "F0 F1 F2 BW0 BW1 BW2");
}

// Narayanan et al. 2021, Fig. 4 (top): warm-up p - r - 1, then one forward one backward.
TEST(ScheduleGenerators, OneFOneBWarmsUpWithStagesMinusRankMinusOne) {
  const s::Table t = s::one_f_one_b(3, 4);
  EXPECT_EQ(computes(t, 0), "F0 F1 F2 BW0 F3 BW1 BW2 BW3");
  EXPECT_EQ(computes(t, 1), "F0 F1 BW0 F2 BW1 F3 BW2 BW3");
  EXPECT_EQ(computes(t, 2), "F0 BW0 F1 BW1 F2 BW2 F3 BW3");
}

// Megatron-LM's interleaved order: micro-batches in groups of p, local chunk (k / p) % v forward
// and v - 1 - that backward; warm-up 2(p - r - 1) + (v - 1)p.
TEST(ScheduleGenerators, InterleavedVisitsChunksInGroupsOfP) {
  const s::Table t = s::interleaved(2, 2, 2);
  EXPECT_EQ(computes(t, 0), "F0c0 F1c0 F0c2 F1c2 BW0c2 BW1c2 BW0c0 BW1c0");
  EXPECT_EQ(computes(t, 1), "F0c1 F1c1 F0c3 BW0c3 F1c3 BW1c3 BW0c1 BW1c1");
}

// ZB-H1: 1F1B's order with the backward split and rank r deferring its W's by r micro-batches.
TEST(ScheduleGenerators, ZbH1DefersWeightGradientsByRank) {
  const s::Table t = s::zb_h1(2, 3);
  EXPECT_EQ(computes(t, 0), "F0 F1 B0 W0 F2 B1 W1 B2 W2");
  EXPECT_EQ(computes(t, 1), "F0 B0 F1 B1 W0 F2 B2 W1 W2");
}

TEST(ScheduleGenerators, ZbVHoldsTwoChunksPerRankInAV) {
  const s::Table t = s::zb_v(2, 2);
  EXPECT_EQ(t.placement, s::Placement::v_shape);
  EXPECT_EQ(t.chunks(), 4);
  for (int r = 0; r < 2; ++r) {
    int f = 0, b = 0, w = 0;
    for (const s::Action& a : t.actions[static_cast<std::size_t>(r)]) {
      if (s::is_compute(a.op)) {
        EXPECT_TRUE(a.chunk == r || a.chunk == 3 - r) << s::to_string(a);
      }
      f += a.op == s::Op::forward;
      b += a.op == s::Op::backward_input;
      w += a.op == s::Op::backward_weight;
    }
    EXPECT_EQ(f, 4);  // 2 micro-batches x 2 chunks
    EXPECT_EQ(b, 4);
    EXPECT_EQ(w, 4);
  }
}

TEST(ScheduleGenerators, MessagesJoinNeighbouringChunksOnOtherRanks) {
  // 1F1B over 2 ranks: rank 0 sends each activation and receives each gradient.
  const s::Table t = s::one_f_one_b(2, 2, /*elements=*/96);
  EXPECT_EQ(s::to_string(t),
            "1F1B: 2 ranks x 1 chunks, 2 micro-batches\n"
            "  rank 0: F0.0 send_F0.0>1 F1.0 send_F1.0>1 recv_B0.1<1 BW0.0 "
            "recv_B1.1<1 BW1.0\n"
            "  rank 1: recv_F0.0<0 F0.1 BW0.1 send_B0.1>0 recv_F1.0<0 F1.1 "
            "BW1.1 send_B1.1>0\n");
  for (const auto& row : t.actions) {
    for (const s::Action& a : row) {
      if (s::is_p2p(a.op)) {
        EXPECT_EQ(a.elements, 96);
      }
    }
  }
  // the turn of the V (chunk 1 -> 2 on rank 1) needs no message
  const s::Table v = s::zb_v(2, 2);
  for (const s::Action& a : v.actions[1]) {
    if (a.op == s::Op::send_activation) {
      EXPECT_NE(a.chunk, 1) << s::to_string(a);
    }
  }
}

TEST(ScheduleGenerators, InvalidRequestsSayWhatWouldWork) {
  const auto message = [](const s::Request& q) {
    try {
      (void)s::make(q);
    } catch (const fw::ScheduleError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({s::Kind::one_f_one_b, 4, 3}),
            "fourway: schedule 1f1b with 4 pipeline ranks, 3 micro-batches, 1 virtual stages: "
            "needs micro-batches >= pipeline ranks (4) so that every rank reaches its steady "
            "state; raise --micro-batches to 4 or more, or use gpipe");
  EXPECT_NE(message({s::Kind::interleaved, 4, 6, 2}).find("use 4 or 8 micro-batches"),
            std::string::npos);
  EXPECT_NE(message({s::Kind::interleaved, 4, 8, 1}).find("--virtual-stages >= 2"),
            std::string::npos);
  EXPECT_NE(message({s::Kind::interleaved, 1, 8, 2}).find("at least 2 pipeline ranks"),
            std::string::npos);
  EXPECT_NE(message({s::Kind::zb_h1, 3, 2}).find("raise --micro-batches to 3"), std::string::npos);
  EXPECT_NE(message({s::Kind::zb_v, 3, 2}).find("raise --micro-batches to 3"), std::string::npos);
  EXPECT_NE(message({s::Kind::gpipe, 0, 2}).find("at least 1 pipeline rank"), std::string::npos);
  EXPECT_NE(message({s::Kind::gpipe, 2, 0}).find("at least 1 micro-batch"), std::string::npos);
  EXPECT_NE(message({s::Kind::one_f_one_b, 2, 4, 2}).find("use interleaved"), std::string::npos);
  EXPECT_EQ(message({s::Kind::gpipe, 4, 1}), "no error");  // GPipe takes any m
}

// The evaluation table of every schedule: forwards only, each rank's chunks in model order and
// their micro-batches in order, with the activations' messages; valid wherever the training
// table is (under eager sends, what the executor runs, always).
TEST(ScheduleGenerators, ForwardOnlyTablesRunEveryForwardAndNothingElse) {
  EXPECT_EQ(computes(s::forward_only(s::one_f_one_b(2, 3)), 0), "F0 F1 F2");
  EXPECT_EQ(computes(s::forward_only(s::zb_v(2, 2)), 0), "F0c0 F1c0 F0c3 F1c3");
  EXPECT_EQ(computes(s::forward_only(s::zb_v(2, 2)), 1), "F0c1 F1c1 F0c2 F1c2");
  EXPECT_EQ(computes(s::forward_only(s::interleaved(2, 2, 2)), 1), "F0c1 F1c1 F0c3 F1c3");
  const s::Table fo = s::forward_only(s::one_f_one_b(2, 2), 96);
  EXPECT_TRUE(fo.forward_only);
  EXPECT_EQ(s::to_string(fo),
            "forward-only: 2 ranks x 1 chunks, 2 micro-batches\n"
            "  rank 0: F0.0 send_F0.0>1 F1.0 send_F1.0>1\n"
            "  rank 1: recv_F0.0<0 F0.1 recv_F1.0<0 F1.1\n");
  for (int p : {1, 2, 3, 4}) {
    for (int m : {p, 2 * p, 2 * p + 1}) {
      std::vector<s::Table> tables = {s::gpipe(p, m, 8), s::one_f_one_b(p, m, 8), s::zb_h1(p, m, 8),
                                      s::zb_v(p, m, 8)};
      if (p >= 2 && m % p == 0) tables.push_back(s::interleaved(p, m, 2, 8));
      for (const s::Table& t : tables) {
        const s::Table e = s::forward_only(t, 8);
        for (const auto blocking : {s::Blocking::eager, s::Blocking::rendezvous}) {
          // safe where its training table is: under eager sends always (what the executor
          // runs), where sends block when the training table is
          if (!s::check(t, blocking).ok()) continue;
          const s::CheckResult r = s::check(e, blocking);
          EXPECT_TRUE(r.ok()) << t.name << " p=" << p << " m=" << m << ": " << s::describe(r, e)
                              << "\n"
                              << s::to_string(e);
        }
        int forwards = 0;
        for (const auto& row : e.actions) {
          for (const s::Action& a : row) {
            EXPECT_TRUE(a.op == s::Op::forward || a.op == s::Op::send_activation ||
                        a.op == s::Op::recv_activation)
                << s::to_string(a);
            forwards += a.op == s::Op::forward;
          }
        }
        EXPECT_EQ(forwards, m * t.chunks()) << t.name;
      }
    }
  }
}
