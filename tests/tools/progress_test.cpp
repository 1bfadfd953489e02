#include "fourway/tools/progress.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace fw = fourway;

namespace {
std::string captured(bool interactive) {
  std::FILE* f = std::tmpfile();
  fw::tools::Progress p(4, interactive, f);
  for (int s = 1; s <= 4; ++s) {
    fw::StepRecord r;
    r.step = s;
    r.loss = 5.0 - s;
    r.grad_norm = 0.5;
    r.tokens_per_s = 25000;
    r.step_ms = 100;
    r.lr = 3e-4;
    if (s % 2 == 0) r.val_loss = 4.5 - s;  // evaluated every 2 steps
    p.update(r);
    if (s == 2) p.note("checkpoint saved");
  }
  p.finish();
  std::rewind(f);
  std::string out;
  for (int c; (c = std::fgetc(f)) != EOF;) out += static_cast<char>(c);
  std::fclose(f);
  return out;
}
}  // namespace

TEST(Progress, PlainLinesWhenNotATerminal) {
  const auto out = captured(false);
  EXPECT_NE(
      out.find(
          "step 1/4 | loss 4.000000 | grad_norm 0.5000 | lr 0.0003 | 25000 tokens/s | 100.0 ms\n"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("step 2/4 | loss 3.000000"), std::string::npos);
  EXPECT_NE(out.find("100.0 ms | val 2.500000\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("step 3/4 | loss 2.000000 | grad_norm 0.5000 | lr 0.0003 | 25000 tokens/s | "
                     "100.0 ms\n"),
            out.find("step 3/4"))
      << "no val on a step that did not evaluate";
  EXPECT_NE(out.find("\ncheckpoint saved\nstep 3/4"), std::string::npos);
  EXPECT_EQ(out.find('\r'), std::string::npos) << "no carriage returns in a log file";
}

TEST(Progress, RedrawnBarOnATerminal) {
  const auto out = captured(true);
  EXPECT_NE(out.find("\r\033[K[############............] 2/4 loss 3.0000"), std::string::npos)
      << out;
  EXPECT_NE(out.find("25.0k tok/s | val 0.500000 | eta"), std::string::npos) << out;
  EXPECT_NE(out.find("eta 0s"), std::string::npos);
  EXPECT_NE(out.find("\ncheckpoint saved\n"), std::string::npos)
      << "a note ends the bar line first";
  EXPECT_EQ(out.back(), '\n');
  EXPECT_FALSE(fw::tools::is_terminal(std::tmpfile()));
}
