#include "fourway/train/corpus.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

namespace fw = fourway;

TEST(Corpus, ReadsTextFilesAsBytesInNameOrderSkippingLinks) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("fourway_corpus_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string a(3000, 'a'), b = "Zebra\xc3\xa9" + std::string(3000, 'b');
  std::ofstream(dir / "2-b") << b;
  std::ofstream(dir / "1-a") << a;
  std::filesystem::create_symlink(dir / "1-a", dir / "3-link");
  const auto d = fw::builtin_corpus(dir);
  const std::string expect = a + "\n\n" + b + "\n\n";
  ASSERT_EQ(d.size(), expect.size());
  for (std::size_t i = 0; i < expect.size(); ++i) {
    ASSERT_EQ(d.tokens()[i], static_cast<unsigned char>(expect[i])) << i;
  }
  EXPECT_LE(d.vocab_needed(), fw::corpus_vocab);
  std::filesystem::remove_all(dir);
}

TEST(Corpus, FallsBackToEmbeddedText) {
  const auto d = fw::builtin_corpus("/nonexistent/fourway");
  EXPECT_EQ(d.size(), fw::detail::embedded_corpus_text.size());
  EXPECT_EQ(d.tokens()[0], 'A');
  EXPECT_NE(d.source().find("embedded"), std::string::npos);
  // the system corpus, where present, is real text: mostly printable ASCII
  const auto sys = fw::builtin_corpus();
  std::size_t printable = 0;
  for (auto t : sys.tokens()) printable += (t >= 32 && t < 127) || t == '\n';
  EXPECT_GT(printable * 100, sys.size() * 95);
  EXPECT_GT(sys.size(), 2000u);
}
