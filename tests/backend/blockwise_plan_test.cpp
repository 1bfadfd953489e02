// blockwise_plan (backend/blockwise_plan.hpp): how the GPU's blockwise attention cuts a call into
// blocks of query rows and groups of sequences. Expected plans are worked out by hand from the
// rule in the header's comment; the sweep checks the bounds every plan must keep.
#include "fourway/backend/blockwise_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

namespace fw = fourway;

namespace {

TEST(BlockwisePlan, WholeBatchAndFullBlocksWhenTheyFit) {
  // 2 · 3 heads · 256 rows · 300 keys = 460 800 scores, far below 2^24
  const fw::BlockwisePlan p = fw::blockwise_plan(2, 300, 3);
  EXPECT_EQ(p.rows, 256);
  EXPECT_EQ(p.sequences, 2);
  EXPECT_EQ(p.scores(300, 3), 460800);
  // rows never exceed T
  EXPECT_EQ(fw::blockwise_plan(4, 7, 2).rows, 7);
  EXPECT_EQ(fw::blockwise_plan(2, 300, 3, 16).rows, 16);
}

TEST(BlockwisePlan, RowsShrinkBeforeTheBatchSplits) {
  // GPT-2 small, B 8, T 1024, 12 heads: 2^24 / (12 · 1024) = 1365 rows of all heads fit; 8 · 256
  // do not; 1365 / 8 = 170, cut to 160 (a multiple of 32): 8 · 12 · 160 · 1024 = 15 728 640.
  const fw::BlockwisePlan p = fw::blockwise_plan(8, 1024, 12);
  EXPECT_EQ(p.rows, 160);
  EXPECT_EQ(p.sequences, 8);
  EXPECT_EQ(p.scores(1024, 12), 15728640);
  // B 64: 1365 / 64 = 21 rows, under the 64-row floor, so 64 rows and 1365 / 64 = 21 sequences
  const fw::BlockwisePlan q = fw::blockwise_plan(64, 1024, 12);
  EXPECT_EQ(q.rows, 64);
  EXPECT_EQ(q.sequences, 21);
  EXPECT_EQ(q.scores(1024, 12), 16515072);
}

TEST(BlockwisePlan, LongSequencesGoRowByRow) {
  // T = 2^20, 16 heads: one row of all heads is 2^24 scores, exactly the budget
  const fw::BlockwisePlan p = fw::blockwise_plan(2, std::int64_t{1} << 20, 16);
  EXPECT_EQ(p.rows, 1);
  EXPECT_EQ(p.sequences, 1);
  EXPECT_EQ(p.scores(std::int64_t{1} << 20, 16), std::int64_t{1} << 24);
  // beyond it a row cannot be cut: one row of one sequence, over the budget (documented)
  const fw::BlockwisePlan q = fw::blockwise_plan(2, std::int64_t{1} << 21, 16);
  EXPECT_EQ(q.rows, 1);
  EXPECT_EQ(q.sequences, 1);
}

TEST(BlockwisePlan, EveryPlanKeepsItsBounds) {
  for (std::int64_t B : {1, 2, 3, 8, 33}) {
    for (std::int64_t T : {1, 7, 64, 100, 1000, 4096}) {
      for (std::int64_t NH : {1, 3, 12}) {
        for (std::int64_t chunk : {1, 16, 256}) {
          for (std::int64_t budget :
               {std::int64_t{1} << 10, std::int64_t{1} << 16, std::int64_t{1} << 24}) {
            const fw::BlockwisePlan p = fw::blockwise_plan(B, T, NH, chunk, budget);
            SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " NH=" << NH
                                              << " chunk=" << chunk << " budget=" << budget);
            EXPECT_GE(p.rows, 1);
            EXPECT_LE(p.rows, std::min(chunk, T));
            EXPECT_GE(p.sequences, 1);
            EXPECT_LE(p.sequences, B);
            if (NH * T <= budget) {
              EXPECT_LE(p.scores(T, NH), budget);  // only a row over the budget may exceed it
            }
            if (B * NH * std::min(chunk, T) * T <= budget) {
              EXPECT_EQ(p.rows, std::min(chunk, T));
              EXPECT_EQ(p.sequences, B);
            }
          }
        }
      }
    }
  }
}

TEST(BlockwisePlan, RefusesANonPositiveChunkOrBudget) {
  EXPECT_THROW((void)fw::blockwise_plan(1, 8, 1, 0), fw::ShapeError);
  EXPECT_THROW((void)fw::blockwise_plan(1, 8, 1, 16, 0), fw::ShapeError);
  EXPECT_THROW((void)fw::blockwise_plan(1, 8, 0), fw::ShapeError);
}

}  // namespace
