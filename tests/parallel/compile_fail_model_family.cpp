// MeshStrategy<M, P, B, Comm, Config> needs a fw::model_family<Config>: a configuration type the
// runtime does not know (no specialisation) is the mistake.
#include "fourway/comm/local_world.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/train/mesh_strategy.hpp"

namespace fw = fourway;
struct MyModelConfig {
  int layers = 2;
};
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using Config = fw::models::GptConfig;
#else
using Config = MyModelConfig;
#endif
using S = fw::MeshStrategy<fw::Mesh<fw::Sharded<1>>, fw::Precision<float>, fw::Host, fw::LocalComm,
                           Config>;
static_assert(sizeof(S) > 0);
int main() { return 0; }
