// Fails with the pinned message unless FOURWAY_COMPILE_FAIL_CONTROL is defined.
#include "fourway/config.hpp"

template <int N>
struct NeedsEven {
  static_assert(N % 2 == 0, "fourway: compile-fail harness self-test");
};
template <int N>
struct NeedsEvenNamed {
  static_assert(N % 2 == 0, "fourway: compile-fail harness self-test with N = 3");
};

#if defined(FOURWAY_COMPILE_FAIL_CONTROL)
constexpr int n = 2;
#elif defined(FOURWAY_SELF_TEST_N)
constexpr int n = FOURWAY_SELF_TEST_N;
#else
constexpr int n = 1;
#endif

#if defined(FOURWAY_SELF_TEST_WITH_N)
template struct NeedsEvenNamed<n>;
#else
template struct NeedsEven<n>;
#endif

int main() { return 0; }
