#include "fourway/mesh/policies.hpp"
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using P = fourway::Sharded<3>;
#else
using P = fourway::Sharded<4>;
#endif
int main() { return P::stage; }
