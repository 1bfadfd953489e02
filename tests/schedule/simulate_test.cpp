#include "fourway/schedule/simulate.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fourway/schedule/generators.hpp"

namespace s = fourway::schedule;

// The closed forms these tests hold the simulator to (F, B, W the per-chunk costs, p2p = 0):
//   GPipe, 1F1B      idle fraction (p-1)/(m+p-1) on every rank, whatever F and B+W cost
//                    (Huang et al. 2019; Narayanan et al. 2021)
//   interleaved      (p-1)/(v m + p-1): the bubble divided by about v (Narayanan et al. 2021)
//   ZB-H1            idle (p-1)(F+B-W) per rank (Qi et al. 2023, section 3.1)
//   ZB-V             idle (p-1) F per rank whatever m: no bubble in the steady state
//   peak activations GPipe m; 1F1B p-r; interleaved min(2(p-r-1) + (v-1)p + 1, v m) chunks
//                    (Megatron-LM's warm-up count + 1); ZB-H1 p; ZB-V 2p chunks = p stages

namespace {
constexpr double kTol = 1e-12;
}

TEST(ScheduleSimulate, GPipeAnd1F1BBubbleIsPMinus1OverMPlusPMinus1) {
  for (const s::Costs costs : {s::Costs{}, s::Costs{2.0, 3.0, 1.5, -1.0, 0.0}}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, p, 2 * p, 4 * p + 1}) {
        const double expect = double(p - 1) / double(m + p - 1);
        const s::Timeline g = s::simulate(s::gpipe(p, m), costs);
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(g.bubble(r), expect, kTol) << "gpipe p=" << p << " m=" << m << " r=" << r;
          EXPECT_EQ(g.peak_in_flight[static_cast<std::size_t>(r)], m);
        }
        if (m < p) continue;
        const s::Timeline o = s::simulate(s::one_f_one_b(p, m), costs);
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(o.bubble(r), expect, kTol) << "1f1b p=" << p << " m=" << m << " r=" << r;
          EXPECT_EQ(o.peak_in_flight[static_cast<std::size_t>(r)], p - r);
        }
        EXPECT_NEAR(o.makespan,
                    (m + p - 1) * (costs.of(s::Op::forward) + costs.of(s::Op::backward)), kTol);
      }
    }
  }
}

TEST(ScheduleSimulate, InterleavedDividesTheBubbleByV) {
  for (int p : {2, 3, 4, 8}) {
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p, 4 * p}) {
        const s::Timeline t = s::simulate(s::interleaved(p, m, v), s::Costs{});
        const double expect = double(p - 1) / double(v * m + p - 1);
        for (int r = 0; r < p; ++r) {
          EXPECT_NEAR(t.bubble(r), expect, kTol) << "p=" << p << " v=" << v << " m=" << m;
          const int warm = 2 * (p - r - 1) + (v - 1) * p + 1;
          EXPECT_EQ(t.peak_in_flight[static_cast<std::size_t>(r)], std::min(warm, v * m))
              << "p=" << p << " v=" << v << " m=" << m << " r=" << r;
        }
        EXPECT_LT(t.bubble(), s::simulate(s::one_f_one_b(p, m), s::Costs{}).bubble());
      }
    }
  }
}

TEST(ScheduleSimulate, ZbH1IdlesPMinus1TimesFPlusBMinusW) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p + 1}) {
      const s::Timeline t = s::simulate(s::zb_h1(p, m), s::Costs{});  // F = B = W = 1
      for (int r = 0; r < p; ++r) {
        EXPECT_NEAR(t.idle(r), (p - 1) * (1.0 + 1.0 - 1.0), kTol) << "p=" << p << " m=" << m;
        EXPECT_EQ(t.peak_in_flight[static_cast<std::size_t>(r)], p);  // 1F1B's peak
      }
      // a third of 1F1B's idle time
      const s::Timeline o = s::simulate(s::one_f_one_b(p, m), s::Costs{});
      EXPECT_NEAR(o.idle(0), 3.0 * t.idle(0), kTol);
    }
  }
}

TEST(ScheduleSimulate, ZbVHasNoBubbleInTheSteadyState) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p + 1}) {
      const s::Timeline t = s::simulate(s::zb_v(p, m), s::Costs{});
      for (int r = 0; r < p; ++r) {
        EXPECT_NEAR(t.idle(r), (p - 1) * 1.0, kTol) << "p=" << p << " m=" << m << " r=" << r;
        EXPECT_EQ(t.peak_in_flight[static_cast<std::size_t>(r)], 2 * p);
      }
      EXPECT_NEAR(t.makespan, 6.0 * m + (p - 1), kTol);  // 2 chunks x (F + B + W) per micro-batch
    }
  }
}

TEST(ScheduleSimulate, MessagesCostTheirLatency) {
  // GPipe over 2 ranks, 1 micro-batch: F0 -> send -> F1 -> BW1 -> send -> BW0.
  const s::Timeline t = s::simulate(s::gpipe(2, 1), s::Costs{1.0, 1.0, 1.0, -1.0, 0.5});
  EXPECT_NEAR(t.makespan, 1 + 0.5 + 1 + 2 + 0.5 + 2, kTol);
  EXPECT_NEAR(t.busy[0], 3.0, kTol);
}

TEST(ScheduleSimulate, GroupsCostTheirOverheadAndChunksTheirOwnCosts) {
  // as above with a group overhead of 0.25: rank 1's first recv waits for F0's send (1 + 0.5);
  // its send group ends 0.25 after BW1 (4.5), and rank 0's recv at 4.5 + 0.5
  s::Costs c{1.0, 1.0, 1.0, -1.0, 0.5, 0.25};
  const s::Timeline t = s::simulate(s::gpipe(2, 1), c);
  EXPECT_NEAR(t.makespan, 7.0, kTol);
  EXPECT_NEAR(t.spans[1].back().end - t.spans[1].back().start, 0.0, kTol);  // a send: its post
  EXPECT_NEAR(t.idle(1), 7.0 - 3.0, kTol);
  // chunk 1 twice as slow: F1 = 2, BW1 = 4 on rank 1
  s::Costs slow{2.0, 2.0, 2.0, -1.0};
  const s::Timeline u = s::simulate(s::gpipe(2, 1), std::vector<s::Costs>{s::Costs{}, slow}, c);
  EXPECT_NEAR(u.makespan, 1.5 + 2 + 4 + 0.5 + 2, kTol);
  EXPECT_NEAR(u.busy[1], 6.0, kTol);
  EXPECT_THROW((void)s::simulate(s::gpipe(2, 1), std::vector<s::Costs>{c}, c),
               fourway::ScheduleError);
}

TEST(ScheduleSimulate, RefusesATableTheCheckerRefuses) {
  s::Table t = s::gpipe(2, 2);
  t.actions[1].erase(t.actions[1].begin());  // drop a recv
  EXPECT_THROW((void)s::simulate(t, s::Costs{}), fourway::ScheduleError);
}

static_assert(s::simulate(s::one_f_one_b(4, 8), s::Costs{}).makespan == 33.0);
