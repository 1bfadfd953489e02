// MeshStrategy<M, P, B, Comm> without a Config trains GPT-2, which train/ does not name: the
// family registers itself as the default in fourway/models/gpt2.hpp. Naming the strategy with
// train/mesh_strategy.hpp alone is the mistake; the message says which header to include.
#include "fourway/comm/local_world.hpp"
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
#include "fourway/models/gpt2.hpp"
#endif
#include "fourway/train/mesh_strategy.hpp"

namespace fw = fourway;
using S = fw::MeshStrategy<fw::Mesh<fw::Sharded<1>>, fw::Precision<float>, fw::Host, fw::LocalComm>;
static_assert(sizeof(S) > 0);
int main() { return 0; }
