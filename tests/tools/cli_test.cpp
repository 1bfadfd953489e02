#include "fourway/tools/cli.hpp"

#include <gtest/gtest.h>

namespace fw = fourway;

namespace {
struct Flags {
  int steps = 10;
  float lr = 3e-4f;
  std::uint64_t seed = 1;
  std::string path;
  std::string precision = "fp32";
  bool ckpt = false;
};
fw::tools::ArgParser parser(Flags& f) {
  fw::tools::ArgParser p("prog", "summary");
  p.add("steps", &f.steps, "N", "steps")
      .add("lr", &f.lr, "LR", "learning rate")
      .add("seed", &f.seed, "S", "seed")
      .add("path", &f.path, "FILE", "a file")
      .add_choice("precision", &f.precision, {"fp32", "bf16"}, "precision")
      .add_switch("checkpoint", &f.ckpt, "checkpointing");
  return p;
}
std::string error_of(std::vector<const char*> args) {
  Flags f;
  auto p = parser(f);
  args.insert(args.begin(), "prog");
  try {
    p.parse(static_cast<int>(args.size()), args.data());
  } catch (const fw::ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ArgParser, ParsesBothFormsSwitchesAndChoices) {
  Flags f;
  auto p = parser(f);
  const char* argv[] = {
      "prog",         "--steps",          "7",      "--lr=0.5e-3",         "--path", "a b.bin",
      "--checkpoint", "--precision=bf16", "--seed", "18446744073709551615"};
  ASSERT_TRUE(p.parse(10, argv));
  EXPECT_EQ(f.steps, 7);
  EXPECT_FLOAT_EQ(f.lr, 0.5e-3f);
  EXPECT_EQ(f.path, "a b.bin");
  EXPECT_TRUE(f.ckpt);
  EXPECT_EQ(f.precision, "bf16");
  EXPECT_EQ(f.seed, 18446744073709551615ull);
  EXPECT_TRUE(p.given("lr"));
  EXPECT_FALSE(p.given("nope"));
  Flags g;
  auto q = parser(g);
  const char* help[] = {"prog", "--steps", "3", "--help"};
  EXPECT_FALSE(q.parse(4, help));
  const auto h = q.help();
  EXPECT_NE(h.find("--steps N"), std::string::npos);
  EXPECT_NE(h.find("[10]"), std::string::npos) << "defaults are shown";
  EXPECT_NE(h.find("--precision fp32|bf16"), std::string::npos);
}

TEST(ArgParser, RejectsWhatItCannotUseWithTheFlagNamed) {
  EXPECT_NE(error_of({"--step", "3"}).find("unknown flag --step; did you mean --steps?"),
            std::string::npos);
  EXPECT_NE(error_of({"--lr-max", "3"}).find("did you mean --lr?"), std::string::npos);
  EXPECT_NE(error_of({"--zzzzzzzz"}).find("unknown flag --zzzzzzzz (see prog --help)"),
            std::string::npos);
  EXPECT_NE(error_of({"--steps"}).find("--steps needs a value (N)"), std::string::npos);
  EXPECT_NE(error_of({"--steps", "--lr", "1"}).find("--steps needs a value"), std::string::npos);
  EXPECT_NE(error_of({"--steps", "3x"}).find("--steps expects an integer, got '3x'"),
            std::string::npos);
  EXPECT_NE(error_of({"--steps", "99999999999"}).find("expects an integer"), std::string::npos);
  EXPECT_NE(error_of({"--seed", "-1"}).find("expects an integer"), std::string::npos);
  EXPECT_NE(error_of({"--lr", "inf"}).find("--lr must be finite"), std::string::npos);
  EXPECT_NE(error_of({"--lr", ""}).find("--lr expects a number"), std::string::npos);
  EXPECT_NE(error_of({"--precision", "fp64"}).find("one of fp32, bf16, got 'fp64'"),
            std::string::npos);
  EXPECT_NE(error_of({"--checkpoint=yes"}).find("--checkpoint takes no value"), std::string::npos);
  EXPECT_NE(error_of({"--steps", "1", "--steps", "2"}).find("--steps given twice"),
            std::string::npos);
  EXPECT_NE(error_of({"-x"}).find("unexpected argument '-x'"), std::string::npos);
  EXPECT_NE(error_of({"--path="}).find("--path needs a non-empty value"), std::string::npos);
}
