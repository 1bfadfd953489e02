// The README's first program: a GPT-2 trained on 4 ranks (threads of this process) under
// Sharded<3> (ZeRO-3 / FSDP) in bf16 with fp32 master weights, on the built-in corpus. The same
// loss curve comes out of 1 rank or any other data-parallel mesh.
#include <cstdio>

#include "fourway/fourway.hpp"

namespace fw = fourway;

int main() {
  using Model = fw::models::Gpt<fw::bf16, fw::Host>;
  using Strategy = fw::data_parallel_strategy_t<fw::Sharded<3>, Model, fw::Precision<fw::bf16>,
                                                fw::Host, fw::LocalComm>;
  fw::models::GptConfig config;
  config.layers = 2;
  config.heads = 4;
  config.dim = 64;
  config.vocab = 256;  // the built-in corpus is byte tokens
  config.max_seq = 32;
  const std::int64_t B = 8, T = 32;  // the global batch: 8 sequences of 32 tokens

  const fw::TokenData corpus = fw::builtin_corpus();
  fw::launch<fw::LocalWorld>(4, [&](fw::World<fw::LocalWorld>& world) {
    Model model(world.ctx(), config, /*seed=*/1337);
    fw::AdamWConfig adamw;
    adamw.lr = 3e-3f;
    fw::Trainer<Strategy> trainer(fw::TrainerOptions{}, world.ctx(), model, world.comm(),
                                  fw::AdamW(adamw));
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
