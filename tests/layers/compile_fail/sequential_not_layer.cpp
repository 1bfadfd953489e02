// Sequential of a type that is not a layer must fail with a fourway: message.
#include "fourway/layers/linear.hpp"
#include "fourway/layers/sequential.hpp"

namespace fw = fourway;

#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using S = fw::Sequential<fw::Linear<float, fw::Host>>;
#else
using S = fw::Sequential<fw::Linear<float, fw::Host>, int>;
#endif
S::Stash* stash = nullptr;
int main() { return sizeof(S) > 0 ? 0 : 1; }
