// A ContextParallel mesh needs a rank model that takes a fw::SequenceShard
// (`bind_sequence_shard`, docs/context-parallel.md): the Llama example's has none yet (its rotary
// positions do not follow a split sequence), and building the strategy for it is the mistake.
#include "../../examples/llama/llama.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/train/mesh_strategy.hpp"

namespace fw = fourway;
using M = fw::Mesh<fw::ContextParallel<2>, fw::DataParallel>;
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using Config = fw::models::GptConfig;
#else
using Config = llama::Config;
#endif
using S = fw::MeshStrategy<M, fw::Precision<float>, fw::Host, fw::LocalComm, Config>;
void build(const fw::Context<fw::Host>& ctx, const M& mesh, fw::MeshGroups<fw::LocalComm>& groups,
           const Config& cfg) {
  S s(ctx, mesh, groups, cfg, 1);
  (void)s;
}
int main() { return 0; }
