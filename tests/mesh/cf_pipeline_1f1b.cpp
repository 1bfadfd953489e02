#include "fourway/mesh/policies.hpp"
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using P = fourway::Pipeline<4, 4, fourway::OneFOneB>;
#else
using P = fourway::Pipeline<4, 2, fourway::OneFOneB>;
#endif
int main() { return P::stages; }
