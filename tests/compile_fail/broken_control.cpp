// Fails with the pinned message, but the control build fails too (for another reason): the
// harness must report a failure, since the pinned message may not be the only error.
#include "fourway/config.hpp"

static_assert(sizeof(int) == 0, "fourway: compile-fail harness self-test");
#if defined(FOURWAY_COMPILE_FAIL_CONTROL)
int main() { return undeclared_name; }
#else
int main() { return 0; }
#endif
