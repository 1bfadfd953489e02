// Precision<int> must fail with the policy's message; the control build uses Precision<bf16>.
#include "fourway/optim/precision.hpp"

namespace fw = fourway;
#if defined(FOURWAY_COMPILE_FAIL_CONTROL)
using P = fw::Precision<fw::bf16>;
#else
using P = fw::Precision<int>;
#endif
int main() { return static_cast<int>(P::bytes_per_param) - 16; }
