// The peer-access plan of a LocalWorld group on several GPUs (comm/peer_access.hpp): which GPUs a
// rank enables, and the DeviceError naming both GPUs when one cannot be reached.
#include "fourway/comm/peer_access.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fw = fourway;

namespace {

TEST(PeerAccess, OneGpuNeedsNothing) {
  const auto never = [](int, int) { return false; };
  EXPECT_TRUE(fw::peer_access_plan(0, {0, 0, 0, 0}, never, "group 'dp'").empty());
  EXPECT_TRUE(fw::peer_access_plan(2, {2, -1}, never, "group 'dp'").empty());  // -1: not device
}

TEST(PeerAccess, EveryOtherGpuOnceSorted) {
  std::vector<std::pair<int, int>> asked;
  const auto all = [&](int from, int to) {
    asked.emplace_back(from, to);
    return true;
  };
  EXPECT_EQ(fw::peer_access_plan(1, {3, 1, 0, 3, 0}, all, "group 'dp'"), (std::vector<int>{0, 3}));
  EXPECT_EQ(asked, (std::vector<std::pair<int, int>>{{1, 3}, {1, 0}}));
}

TEST(PeerAccess, AnUnreachableGpuIsRefusedNamingBoth) {
  const auto only_even = [](int, int to) { return to % 2 == 0; };
  try {
    (void)fw::peer_access_plan(0, {0, 2, 3}, only_even, "group 'world' (4 ranks)");
    FAIL() << "expected DeviceError";
  } catch (const fw::DeviceError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("group 'world' (4 ranks) has ranks on GPU 0 and GPU 3"), std::string::npos)
        << m;
    EXPECT_NE(m.find("GPU 0 cannot access GPU 3's memory"), std::string::npos) << m;
    EXPECT_NE(m.find("NcclWorld"), std::string::npos) << m;
  }
}

}  // namespace
