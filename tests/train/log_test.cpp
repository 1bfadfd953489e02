#include "fourway/train/log.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <sstream>

namespace fw = fourway;

TEST(JsonLog, OneObjectPerStepWithMemoryOfEveryRank) {
  fw::MemoryAccountant r0(0), r1(1);
  r0.on_alloc(fw::MemTag::weights, 100);
  r0.on_alloc(fw::MemTag::activations, 40);
  r0.on_free(fw::MemTag::activations, 40);
  r1.on_alloc(fw::MemTag::grads, 7);
  fw::StepRecord r;
  r.step = 3;
  r.loss = 2.718281828459045;
  r.grad_norm = NAN;
  r.tokens_per_s = 1234.5;
  r.step_ms = 0.25;
  r.lr = 1e-4;
  const auto path = std::filesystem::temp_directory_path() /
                    ("fourway_log_test.jsonl_" + std::to_string(::getpid()));
  {
    fw::JsonLog log(path);
    log.write(r, {&r0, &r1});
    r.step = 4;
    r.skipped = true;
    r.val_loss = 3.25;  // this step evaluated --val-data
    log.write(r, {&r0});
  }
  std::ifstream in(path);
  std::string l1, l2, l3;
  std::getline(in, l1);
  std::getline(in, l2);
  EXPECT_FALSE(std::getline(in, l3));
  EXPECT_EQ(
      l1.rfind("{\"step\":3,\"loss\":2.71828183,\"grad_norm\":null,\"tokens_per_s\":1234.5,", 0),
      0u)
      << l1;
  EXPECT_NE(l1.find("\"skipped\":false"), std::string::npos);
  EXPECT_NE(l1.find("\"memory\":[{\"rank\":0,"), std::string::npos);
  EXPECT_NE(l1.find("\"peak\":{\"weights\":100,\"grads\":0,\"master_weights\":0,\"optimizer_"
                    "state\":0,\"activations\":40"),
            std::string::npos)
      << l1;
  EXPECT_NE(l1.find("{\"rank\":1,"), std::string::npos);
  EXPECT_EQ(l1.back(), '}');
  EXPECT_NE(l2.find("\"step\":4"), std::string::npos);
  EXPECT_NE(l2.find("\"skipped\":true"), std::string::npos);
  EXPECT_EQ(l1.find("val_loss"), std::string::npos) << "step 3 did not evaluate";
  EXPECT_NE(l2.find(",\"val_loss\":3.25,\"memory\":["), std::string::npos) << l2;
  EXPECT_EQ(l2.find("\"rank\":1"), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_THROW(fw::JsonLog("/nonexistent/dir/x.jsonl"), fw::ConfigError);
}
