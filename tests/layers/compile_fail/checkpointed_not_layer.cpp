// Checkpointed of a type that is not a layer must fail with a fourway: message.
#include "fourway/layers/checkpoint.hpp"
#include "fourway/layers/linear.hpp"

namespace fw = fourway;

struct NotALayer {
  using value_type = float;
  using backend_type = fw::Host;
  int forward(int) { return 0; }
};

#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using C = fw::Checkpointed<fw::Linear<float, fw::Host>>;
#else
using C = fw::Checkpointed<NotALayer>;
#endif
int main() { return sizeof(C) > 0 ? 0 : 1; }
