#include "fourway/core/error.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <type_traits>

namespace fw = fourway;

static_assert(std::is_base_of_v<std::runtime_error, fw::Error>);
static_assert(std::is_base_of_v<fw::Error, fw::ConfigError>);
static_assert(std::is_base_of_v<fw::Error, fw::ShapeError>);
static_assert(std::is_base_of_v<fw::Error, fw::DtypeError>);
static_assert(std::is_base_of_v<fw::Error, fw::OutOfMemory>);
static_assert(std::is_base_of_v<fw::Error, fw::DeviceError>);
static_assert(std::is_base_of_v<fw::Error, fw::CheckpointError>);
static_assert(std::is_base_of_v<fw::CommError, fw::CommTimeout>);
static_assert(std::is_base_of_v<fw::CommError, fw::CommMismatch>);
static_assert(!std::is_base_of_v<fw::ConfigError, fw::ShapeError>);

TEST(Error, CheckThrowsTheTypedErrorWithTheNumbers) {
  EXPECT_NO_THROW(fw::check<fw::ConfigError>(true, "unused"));
  try {
    const int world = 6;
    fw::check<fw::ConfigError>(world % 4 == 0, "fourway: world size ", world,
                               " is not a multiple of ", 4, "; use ", 8, " ranks");
    FAIL();
  } catch (const fw::ConfigError& e) {
    EXPECT_STREQ(e.what(), "fourway: world size 6 is not a multiple of 4; use 8 ranks");
  }
}

TEST(Error, SubclassesAreCaughtAsTheirBases) {
  EXPECT_THROW(throw fw::CommTimeout("t"), fw::CommError);
  EXPECT_THROW(throw fw::CommMismatch("m"), fw::Error);
  EXPECT_THROW(fw::check(false, "x"), fw::Error);
  EXPECT_THROW(fw::check<fw::CheckpointError>(false, "x"), std::runtime_error);
}

TEST(Error, CatJoinsStreamableParts) {
  EXPECT_EQ(fw::detail::cat("a", 1, ' ', 2.5, std::string("z")), "a1 2.5z");
  EXPECT_EQ(fw::detail::cat(), "");
}
