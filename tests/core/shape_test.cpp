#include "fourway/core/shape.hpp"

#include <gtest/gtest.h>

#include <string>

namespace fw = fourway;

TEST(Shape, ExtentsNumelAndRowMajorStrides) {
  const fw::Shape s{2, 3, 5, 7};
  EXPECT_EQ(s.rank(), 4);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s[3], 7);
  EXPECT_EQ(s.numel(), 210);
  EXPECT_EQ(s.stride(0), 105);
  EXPECT_EQ(s.stride(1), 35);
  EXPECT_EQ(s.stride(2), 7);
  EXPECT_EQ(s.stride(3), 1);
  EXPECT_EQ(s.str(), "(2, 3, 5, 7)");
}

TEST(Shape, ScalarAndZeroExtents) {
  const fw::Shape scalar{};
  EXPECT_EQ(scalar.rank(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.str(), "()");
  const fw::Shape z{4, 0, 3};
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.stride(0), 0);
}

TEST(Shape, EqualityComparesRankAndExtents) {
  EXPECT_EQ(fw::Shape({2, 3}), fw::Shape({2, 3}));
  EXPECT_NE(fw::Shape({2, 3}), fw::Shape({3, 2}));
  EXPECT_NE(fw::Shape({6}), fw::Shape({6, 1}));
}

TEST(Shape, IsConstexpr) {
  constexpr fw::Shape s{4, 8, 16};
  static_assert(s.numel() == 512 && s.stride(0) == 128 && s.rank() == 3);
  SUCCEED();
}

TEST(Shape, RejectsTooManyDimsAndNegativeExtents) {
  try {
    const fw::Shape s{1, 2, 3, 4, 5, 6, 7};
    FAIL() << s.str();
  } catch (const fw::ShapeError& e) {
    EXPECT_STREQ(e.what(), "fourway: a Shape holds at most 6 dims, got 7");
  }
  try {
    const fw::Shape s{3, -2};
    FAIL() << s.str();
  } catch (const fw::ShapeError& e) {
    EXPECT_STREQ(e.what(), "fourway: negative extent -2 in a Shape");
  }
  const fw::Shape six{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(six.rank(), fw::Shape::max_rank);
}
