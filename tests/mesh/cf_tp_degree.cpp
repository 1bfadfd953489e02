#include "fourway/mesh/policies.hpp"
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using P = fourway::TensorParallel<1>;
#else
using P = fourway::TensorParallel<0>;
#endif
int main() { return P::degree; }
