#include "fourway/mesh/policies.hpp"
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using P = fourway::ContextParallel<2>;
#else
using P = fourway::ContextParallel<0>;
#endif
int main() { return P::degree; }
