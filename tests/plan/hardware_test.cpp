#include "fourway/plan/hardware.hpp"

#include <gtest/gtest.h>

namespace fp = fourway::plan;

// The presets carry the datasheet figures cited in hardware.hpp.
TEST(PlanHardware, PresetsCarryTheDatasheetFigures) {
  const auto a100 = *fp::hardware_preset("a100-80g");
  EXPECT_EQ(a100.memory_gb, 80.0);
  EXPECT_EQ(a100.peak_tflops(fp::Precision::bf16), 312.0);
  EXPECT_EQ(a100.peak_tflops(fp::Precision::fp32), 19.5);
  EXPECT_EQ(a100.nvlink.bandwidth_gbs * 2, 600.0);      // the datasheet's bidirectional figure
  EXPECT_EQ(a100.infiniband.bandwidth_gbs * 8, 200.0);  // 200 Gb/s HDR per GPU
  const auto h100 = *fp::hardware_preset("h100");
  EXPECT_EQ(h100.peak_tflops(fp::Precision::fp16), 989.0);
  EXPECT_EQ(h100.nvlink.bandwidth_gbs * 2, 900.0);
  EXPECT_EQ(h100.infiniband.bandwidth_gbs * 8, 400.0);
  const auto h200 = *fp::hardware_preset("h200");
  EXPECT_EQ(h200.memory_gb, 141.0);
  EXPECT_EQ(h200.gpus_per_node, 8);
  EXPECT_FALSE(fp::hardware_preset("v100"));
}
