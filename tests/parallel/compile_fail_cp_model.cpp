// A ContextParallel mesh needs a rank model that takes a fw::SequenceShard
// (`bind_sequence_shard`, docs/context-parallel.md): a decoder whose block's attention cannot
// follow a split sequence (here the Llama example's block with that member taken away) offers
// none, and building the strategy for it is the mistake.
#include "../../examples/llama/llama.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/train/mesh_strategy.hpp"

namespace fw = fourway;

template <class T, class B, class Comm>
struct BlockWithoutShard : llama::Block<T, B, Comm> {
  using llama::Block<T, B, Comm>::Block;
  void bind_sequence_shard(fw::SequenceShard<T, B>*) = delete;
};
struct FixedConfig : llama::Config {};
template <>
struct fourway::model_family<FixedConfig>
    : fourway::decoder_family<FixedConfig, llama::Embed, BlockWithoutShard, llama::Head> {};

using M = fw::Mesh<fw::ContextParallel<2>, fw::DataParallel>;
#ifdef FOURWAY_COMPILE_FAIL_CONTROL
using Config = llama::Config;
#else
using Config = FixedConfig;
#endif
using S = fw::MeshStrategy<M, fw::Precision<float>, fw::Host, fw::LocalComm, Config>;
void build(const fw::Context<fw::Host>& ctx, const M& mesh, fw::MeshGroups<fw::LocalComm>& groups,
           const Config& cfg) {
  S s(ctx, mesh, groups, cfg, 1);
  (void)s;
}
int main() { return 0; }
