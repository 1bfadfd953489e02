// MeshStrategy<M, ...> must not compile unless M is a fw::Mesh<...>: a bare policy is the mistake.
#include "fourway/comm/local_world.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/train/mesh_strategy.hpp"

namespace fw = fourway;
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using M = fw::Mesh<fw::Sharded<3>>;
#else
using M = fw::Sharded<3>;
#endif
using S = fw::MeshStrategy<M, fw::Precision<float>, fw::Host, fw::LocalComm>;
static_assert(sizeof(S) > 0);
int main() { return 0; }
