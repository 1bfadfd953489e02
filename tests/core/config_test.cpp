#include "fourway/config.hpp"

#include <gtest/gtest.h>

namespace fw = fourway;

// This file is compiled by the host compiler and linked only against fourway::fourway, so no
// CUDA spelling and no capability may leak in.
#if defined(FOURWAY_CUDA_COMPILATION) || defined(FOURWAY_DEVICE_CODE)
#error "fourway: FOURWAY_CUDA_COMPILATION must not be defined in a host-compiler build"
#endif
static_assert(FOURWAY_HAS_CUDA == 0 && FOURWAY_HAS_NCCL == 0 && FOURWAY_HAS_MPI == 0 &&
              FOURWAY_HAS_CBLAS == 0);

FOURWAY_HOST_DEVICE constexpr int twice(int x) { return 2 * x; }
FOURWAY_HOST inline int thrice(int x) { return 3 * x; }

TEST(Config, AnnotationsVanishInHostBuilds) {
  static_assert(twice(21) == 42);
  EXPECT_EQ(thrice(3), 9);
}

TEST(Config, VersionMatchesTheCMakeProject) {
  EXPECT_EQ(FOURWAY_VERSION_MAJOR, FOURWAY_TEST_PROJECT_VERSION_MAJOR);
  EXPECT_EQ(FOURWAY_VERSION_MINOR, FOURWAY_TEST_PROJECT_VERSION_MINOR);
  EXPECT_EQ(FOURWAY_VERSION_PATCH, FOURWAY_TEST_PROJECT_VERSION_PATCH);
}

TEST(Config, DynamicIsNegative) { EXPECT_LT(fw::dynamic, 0); }
