#include "fourway/comm/local_world.hpp"

#include <gtest/gtest.h>

namespace fw = fourway;

TEST(LocalWorld, AllReduceSumsOverRanks) {
  fw::launch<fw::LocalWorld>(3, [](fw::World<fw::LocalWorld>& w) {
    std::vector<float> a(5, static_cast<float>(w.rank() + 1)), b(5);
    w.comm().all_reduce(a.data(), b.data(), 5, fw::ReduceOp::sum);
    for (float v : b) EXPECT_EQ(v, 6.0f);
  });
}
