// Handle<Traits>: an owned handle is destroyed exactly once, a borrowed one never — including the
// two ways NcclComm used to get it wrong (a borrowed stream assigned over an owned one; a child
// sharing its parent's stream).
#include "fourway/core/handle.hpp"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace fw = fourway;

namespace {

std::vector<int> destroyed;  // ids passed to destroy, in order

struct FakeTraits {
  using native_type = int;  // 0 = none
  static void destroy(int h) noexcept { destroyed.push_back(h); }
};
using H = fw::Handle<FakeTraits>;

class HandleTest : public ::testing::Test {
 protected:
  void SetUp() override { destroyed.clear(); }
};

TEST_F(HandleTest, OwnedIsDestroyedOnceBorrowedNever) {
  {
    H owned = H::owning(7);
    H borrowed = H::borrowed(8);
    EXPECT_TRUE(owned.owns());
    EXPECT_FALSE(borrowed.owns());
    EXPECT_EQ(owned.get(), 7);
    EXPECT_EQ(borrowed.get(), 8);
  }
  EXPECT_EQ(destroyed, std::vector<int>{7});
}

TEST_F(HandleTest, MovingTransfersOwnershipWithoutDestroying) {
  {
    H a = H::owning(3);
    H b = std::move(a);
    EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is the test
    EXPECT_FALSE(a.owns());
    EXPECT_TRUE(b.owns());
    EXPECT_TRUE(destroyed.empty());
  }
  EXPECT_EQ(destroyed, std::vector<int>{3});
}

// set_stream: the communicator's own stream is replaced by the caller's. The own one is destroyed
// at once; the caller's is never destroyed by the communicator.
TEST_F(HandleTest, AssigningABorrowedHandleOverAnOwnedOneDestroysOnlyTheOwned) {
  {
    H stream = H::owning(1);
    stream = H::borrowed(2);
    EXPECT_EQ(destroyed, std::vector<int>{1});
    EXPECT_EQ(stream.get(), 2);
    EXPECT_FALSE(stream.owns());
  }
  EXPECT_EQ(destroyed, std::vector<int>{1});
}

// split: a child that shares its parent's stream borrows it; the parent destroys it once.
TEST_F(HandleTest, ABorrowedCopyNeverOutlivesItsOwnerAsAnOwner) {
  {
    H parent = H::owning(5);
    {
      H child = parent.borrow();
      EXPECT_EQ(child.get(), 5);
      EXPECT_FALSE(child.owns());
    }
    EXPECT_TRUE(destroyed.empty());
  }
  EXPECT_EQ(destroyed, std::vector<int>{5});
}

TEST_F(HandleTest, ResetAndSelfMoveAndEmptyHandles) {
  H a = H::owning(9);
  H& alias = a;
  a = std::move(alias);
  EXPECT_TRUE(a.owns());
  EXPECT_TRUE(destroyed.empty());
  a.reset();
  EXPECT_EQ(destroyed, std::vector<int>{9});
  a.reset();
  EXPECT_EQ(destroyed, std::vector<int>{9});
  const H none = H::owning(0);  // "no object" is never owned, never destroyed
  EXPECT_FALSE(none.owns());
  EXPECT_TRUE(none.empty());
}

}  // namespace
