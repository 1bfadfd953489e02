// The README's first program: a GPT-2 trained on 8 ranks (threads of this process) whose training
// setup is one type, the 3D mesh: every layer split over 2 tensor-parallel ranks, the model cut
// into 2 pipeline stages running 1F1B over 2 micro-batches, and 2 replicas with ZeRO-1 across
// them, in bf16 with fp32 master weights, on the built-in corpus. Any other mesh of the same model
// (one rank included: fw::Mesh<>) gives the same loss curve within bf16's rounding.
#include <cstdio>

#include "fourway/fourway.hpp"

namespace fw = fourway;

int main() {
  using Mesh = fw::Mesh<fw::TensorParallel<2>, fw::Pipeline<2, 2>, fw::Sharded<1>>;
  using Strategy = fw::MeshStrategy<Mesh, fw::Precision<fw::bf16>, fw::Host, fw::LocalComm>;
  fw::models::GptConfig config;
  config.layers = 2;
  config.heads = 4;
  config.dim = 64;
  config.vocab = 256;  // the built-in corpus is byte tokens
  config.max_seq = 32;
  const std::int64_t B = 8, T = 32;  // the global batch: 8 sequences of 32 tokens

  const fw::TokenData corpus = fw::builtin_corpus();
  fw::launch<fw::LocalWorld>(8, [&](fw::World<fw::LocalWorld>& world) {
    const Mesh mesh(world.size());  // tp 2 x pp 2 x dp 2 = 8 ranks: the type fixes every degree
    fw::MeshGroups<fw::LocalComm> groups(mesh, world.comm());
    fw::AdamWConfig adamw;
    adamw.lr = 3e-3f;
    fw::TrainerOptions options;
    options.micro_batches = 2;  // the Pipeline's M
    fw::Trainer<Strategy> trainer(options, world.ctx(), mesh, groups, config, /*seed=*/1337,
                                  fw::MeshOptions{}, fw::AdamW(adamw));
    fw::TokenLoader loader(corpus, B, T, config.vocab);
    for (int step = 0; step < 20; ++step) {
      const fw::SequenceBatch b = loader.next();
      const float loss = trainer.step(fw::Batch{b.inputs, b.targets, B, T});
      if (world.rank() == 0) std::printf("step %2d  loss %.4f\n", step, loss);
    }
    if (world.rank() == 0) std::printf("%s", world.memory().table().c_str());
  });
  return 0;
}
