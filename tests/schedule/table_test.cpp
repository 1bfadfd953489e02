#include "fourway/schedule/table.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace s = fourway::schedule;

TEST(ScheduleTable, LoopPlacementPutsChunkCOnRankCModP) {
  s::Table t;
  t.ranks = 3;
  t.chunks_per_rank = 2;
  EXPECT_EQ(t.chunks(), 6);
  for (int c = 0; c < 6; ++c) EXPECT_EQ(t.rank_of(c), c % 3);
  EXPECT_EQ(t.chunks_of(1), (std::vector<int>{1, 4}));
}

TEST(ScheduleTable, VPlacementGoesDownThenUp) {
  s::Table t;
  t.ranks = 4;
  t.chunks_per_rank = 2;
  t.placement = s::Placement::v_shape;
  const std::vector<int> expect{0, 1, 2, 3, 3, 2, 1, 0};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(t.rank_of(c), expect[static_cast<std::size_t>(c)]);
  EXPECT_EQ(t.chunks_of(0), (std::vector<int>{0, 7}));
  EXPECT_EQ(t.chunks_of(3), (std::vector<int>{3, 4}));
}

TEST(ScheduleTable, PrintsOneLinePerRank) {
  s::Table t;
  t.name = "mine";
  t.ranks = 2;
  t.actions = {{s::forward(0, 0), {s::Op::send_activation, 0, 0, 1, 4}},
               {{s::Op::recv_activation, 0, 0, 0, 4}, s::forward(0, 1)}};
  EXPECT_EQ(s::to_string(t),
            "mine: 2 ranks x 1 chunks, 1 micro-batches\n"
            "  rank 0: F0.0 send_F0.0>1\n"
            "  rank 1: recv_F0.0<0 F0.1\n");
}
