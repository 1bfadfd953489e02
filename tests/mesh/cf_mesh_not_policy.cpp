#include "fourway/mesh/mesh.hpp"
namespace fw = fourway;
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using M = fw::Mesh<fw::DataParallel>;
#else
using M = fw::Mesh<int, fw::DataParallel>;
#endif
int main() { return M(4).tp(); }
