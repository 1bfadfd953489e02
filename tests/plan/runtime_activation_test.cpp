#include "fourway/plan/runtime_activation.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace fp = fourway::plan;

namespace {
// The stash of one block as contracts.md / layers/ lay it out, one entry per tensor, in elements
// of the working type; the LayerNorm statistics and the attention's log-sum-exp are fp32 (4 B).
std::int64_t block_by_tensor(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                             std::int64_t w) {
  const std::vector<std::int64_t> working = {
      B * T * C,      // ln_1.y
      B * T * 3 * C,  // attn.c_attn.y (qkv)
      B * T * C,      // attn.y
      B * T * C,      // attn.c_proj.y
      B * T * C,      // r = x + attn
      B * T * C,      // ln_2.y
      B * T * 4 * C,  // mlp.c_fc.y
      B * T * 4 * C,  // mlp.gelu.y
      B * T * C,      // mlp.c_proj.y
      B * T * C,      // y
  };
  std::int64_t bytes = 0;
  for (auto n : working) bytes += n * w;
  // ln_1 and ln_2: mean and rstd; attn.lse, the flash attention's log-sum-exp per (b, head, t)
  return bytes + 4 * (B * T) * 4 + B * NH * T * 4;
}
}  // namespace

TEST(PlanFourwayActivation, BlockAndWholeModelByTensor) {
  for (auto p : {fp::Precision::fp32, fp::Precision::bf16}) {
    const std::int64_t w = p == fp::Precision::fp32 ? 4 : 2;
    const fp::GptActivationShape x{3, 17, 24, 4, 101, 5, p};
    EXPECT_EQ(fp::runtime_block_activation_bytes(x), block_by_tensor(3, 17, 24, 4, w));
    const std::int64_t emb = 3 * 17 * 24 * w;
    const std::int64_t head = 3 * 17 * 24 * w + 2 * 3 * 17 * 4 + 3 * 17 * 101 * w + 3 * 17 * 4;
    EXPECT_EQ(fp::runtime_activation_bytes(x, false),
              emb + 5 * block_by_tensor(3, 17, 24, 4, w) + head);
    EXPECT_EQ(fp::runtime_activation_bytes(x, true),
              emb + 5 * 3 * 17 * 24 * w + std::max(block_by_tensor(3, 17, 24, 4, w), head));
  }
}

// The fused classifier keeps no logits: the head is ln_f's stash and the per-token losses.
TEST(PlanFourwayActivation, FusedClassifierKeepsNoLogits) {
  for (auto p : {fp::Precision::fp32, fp::Precision::bf16}) {
    const std::int64_t w = p == fp::Precision::fp32 ? 4 : 2;
    fp::GptActivationShape x{3, 17, 24, 4, 101, 5, p};
    const std::int64_t kept = fp::runtime_head_activation_bytes(x);
    x.classifier_chunk = 7;
    EXPECT_EQ(fp::runtime_head_activation_bytes(x), 3 * 17 * 24 * w + 2 * 3 * 17 * 4 + 3 * 17 * 4);
    EXPECT_EQ(kept - fp::runtime_head_activation_bytes(x), 3 * 17 * 101 * w);
  }
}

TEST(PlanFourwayActivation, CheckpointingKeepsOneOutputPerBlock) {
  const fp::GptActivationShape x{4, 64, 128, 4, 512, 12, fp::Precision::fp32};
  const auto full = fp::runtime_activation_bytes(x, false);
  const auto ckpt = fp::runtime_activation_bytes(x, true);
  EXPECT_LT(ckpt, full / 4);  // 12 blocks of ~18 BTC shrink to one BTC each
  EXPECT_THROW((void)fp::runtime_activation_bytes(fp::GptActivationShape{}, false),
               fourway::ConfigError);
}
