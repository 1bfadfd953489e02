#include "fourway/mesh/mesh.hpp"
namespace fw = fourway;
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using M = fw::Mesh<fw::TensorParallel<2>, fw::Sharded<2>>;
#else
using M = fw::Mesh<fw::TensorParallel<2>, fw::DataParallel, fw::Sharded<2>>;
#endif
int main() { return M(4).tp(); }
