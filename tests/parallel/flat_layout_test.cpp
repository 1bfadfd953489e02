// Shard and padding arithmetic of FlatLayout and the bucket planner, against brute-force
// element-by-element ownership computed here from the rule in the header's comment.
#include "fourway/parallel/dp/flat_layout.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace fw = fourway;

namespace {

using Segments = std::vector<std::vector<std::pair<int, std::int64_t>>>;

Segments random_segments(std::mt19937& rng, int& params) {
  std::uniform_int_distribution<int> nseg(1, 5), nparam(1, 4);
  std::uniform_int_distribution<std::int64_t> numel(0, 37);
  Segments segs(static_cast<std::size_t>(nseg(rng)));
  params = 0;
  for (auto& s : segs) {
    const int k = nparam(rng);
    for (int i = 0; i < k; ++i) s.emplace_back(params++, numel(rng));
  }
  return segs;
}

}  // namespace

TEST(ParallelFlatLayout, PaddingRule) {
  EXPECT_EQ(fw::padded_numel(10, 3), 12);
  EXPECT_EQ(fw::shard_numel(10, 3), 4);
  EXPECT_EQ(fw::padded_numel(12, 3), 12);
  EXPECT_EQ(fw::padded_numel(0, 8), 0);
  EXPECT_EQ(fw::padded_numel(7, 1), 7);
}

TEST(ParallelFlatLayout, EveryElementOwnedOnceAndPaddingAtSegmentEnds) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    int params = 0;
    const Segments segs = random_segments(rng, params);
    for (int n : {1, 2, 3, 4, 8}) {
      const fw::FlatLayout layout(segs, n);
      std::int64_t psi = 0, padded = 0, shard = 0;
      for (const auto& s : segs) {
        std::int64_t k = 0;
        for (const auto& p : s) k += p.second;
        psi += k;
        padded += (k + n - 1) / n * n;
        shard += (k + n - 1) / n;
      }
      ASSERT_EQ(layout.numel(), psi);
      ASSERT_EQ(layout.padded(), padded);
      ASSERT_EQ(layout.shard(), shard);
      ASSERT_EQ(layout.shard() * n, layout.padded());
      ASSERT_EQ(layout.padding(), padded - psi);
      // owner[e] of every parameter element, from the pieces; -1 = nobody.
      std::vector<int> owner(static_cast<std::size_t>(layout.padded()), -1);
      std::vector<int> shard_hits(static_cast<std::size_t>(layout.shard()) * n, 0);
      for (int r = 0; r < n; ++r) {
        for (const auto& pc : layout.owned_pieces(r)) {
          const auto& slot = layout.slots()[pc.slot];
          const auto& seg = layout.segment(slot.segment);
          for (std::int64_t i = 0; i < pc.count; ++i) {
            const std::int64_t flat = slot.offset + pc.param_offset + i;
            ASSERT_EQ(owner[flat], -1);
            owner[flat] = r;
            // the element's place in rank r's shard buffer follows the rule in the header
            ASSERT_EQ(pc.shard_offset + i, seg.shard_offset + (flat - seg.offset - r * seg.shard));
            ++shard_hits[static_cast<std::size_t>(r * layout.shard() + pc.shard_offset + i)];
          }
        }
      }
      for (const auto& seg : layout.segments()) {
        for (std::int64_t e = 0; e < seg.padded; ++e) {
          const int expect = e < seg.numel ? static_cast<int>(e / seg.shard) : -1;
          ASSERT_EQ(owner[seg.offset + e], expect) << "n=" << n << " e=" << e;
        }
      }
      for (int h : shard_hits) ASSERT_LE(h, 1);
    }
  }
}

TEST(ParallelFlatLayout, RejectsBadGroup) {
  EXPECT_THROW(fw::FlatLayout({{{0, 4}}}, 0), fw::ConfigError);
  const fw::FlatLayout l({{{0, 4}}}, 2);
  EXPECT_THROW((void)l.owned_pieces(2), fw::ConfigError);
}

TEST(ParallelBucketPlanner, GreedyInOrderAndOversizedAlone) {
  const std::vector<std::int64_t> numels = {10, 20, 5, 100, 3, 3, 30};
  // 4-byte elements, 100-byte buckets: 10+20 -> 120 B > 100? 40+80 = 120 > 100: closes.
  const auto b = fw::plan_buckets(numels, 100, 4);
  const std::vector<std::vector<int>> expect = {{0}, {1, 2}, {3}, {4, 5}, {6}};
  EXPECT_EQ(b, expect);
  const auto one = fw::plan_buckets(numels, 0, 4);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].size(), numels.size());
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::int64_t> d(1, 50);
  for (int t = 0; t < 100; ++t) {
    std::vector<std::int64_t> v(static_cast<std::size_t>(1 + t % 17));
    for (auto& x : v) x = d(rng);
    const std::int64_t cap = 4 * d(rng);
    const auto bs = fw::plan_buckets(v, cap, 4);
    int next = 0;
    for (const auto& bucket : bs) {
      std::int64_t bytes = 0;
      for (int i : bucket) {
        ASSERT_EQ(i, next++);
        bytes += 4 * v[static_cast<std::size_t>(i)];
      }
      ASSERT_TRUE(bytes <= cap || bucket.size() == 1);
    }
    ASSERT_EQ(next, static_cast<int>(v.size()));
  }
}
