#include "fourway/train/token_data.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <numeric>

namespace fw = fourway;

namespace {
std::filesystem::path tmp(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("fourway_tok_" + std::to_string(::getpid()) + "_" + name);
}
void write_bytes(const std::filesystem::path& p, const std::vector<unsigned char>& b) {
  std::ofstream o(p, std::ios::binary);
  o.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
std::string error_reading(const std::filesystem::path& p) {
  try {
    (void)fw::TokenData::read(p);
  } catch (const fw::CheckpointError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(TokenData, WritesLlmcLayoutAndReadsItBack) {
  std::vector<std::uint16_t> t = {0, 1, 65535, 300, 7};
  const auto p = tmp("rt.bin");
  fw::TokenData::write(p, t);
  const auto bytes = fw::detail::read_whole_file(p, "test");
  ASSERT_EQ(bytes.size(), 1024u + 10u);
  // magic 20240520 = 0x0134D888 little-endian, version 1, count 5
  EXPECT_EQ(bytes[0], 0x88);
  EXPECT_EQ(bytes[1], 0xD8);
  EXPECT_EQ(bytes[2], 0x34);
  EXPECT_EQ(bytes[3], 0x01);
  EXPECT_EQ(bytes[4], 1);
  EXPECT_EQ(bytes[8], 5);
  EXPECT_EQ(bytes[1024 + 4], 0xFF);  // 65535 low byte
  EXPECT_EQ(bytes[1024 + 6], 300 & 0xFF);
  EXPECT_EQ(bytes[1024 + 7], 300 >> 8);
  const auto d = fw::TokenData::read(p);
  EXPECT_EQ(std::vector<std::uint16_t>(d.tokens().begin(), d.tokens().end()), t);
  EXPECT_EQ(d.vocab_needed(), 65536);
  std::filesystem::remove(p);
}

TEST(TokenData, RejectsBadFilesWithTheNumbers) {
  const auto p = tmp("bad.bin");
  fw::TokenData::write(p, std::vector<std::uint16_t>{1, 2, 3});
  auto good = fw::detail::read_whole_file(p, "test");

  auto b = good;
  b[0] = 0;
  write_bytes(p, b);
  EXPECT_NE(error_reading(p).find("magic number"), std::string::npos) << error_reading(p);
  b = good;
  b[4] = 2;
  write_bytes(p, b);
  EXPECT_NE(error_reading(p).find("version 2"), std::string::npos) << error_reading(p);
  b = good;
  b.pop_back();
  write_bytes(p, b);
  EXPECT_NE(error_reading(p).find("header says 3 tokens (1030 B) but the file has 1029 B"),
            std::string::npos)
      << error_reading(p);
  b.resize(100);
  write_bytes(p, b);
  EXPECT_NE(error_reading(p).find("less than the 1024 B header"), std::string::npos);
  std::filesystem::remove(p);
  EXPECT_NE(error_reading(p).find("no such regular file"), std::string::npos);
}

TEST(TokenLoader, SequentialBatchesShiftedTargetsAndLlmcWrap) {
  std::vector<std::uint16_t> t(21);
  std::iota(t.begin(), t.end(), std::uint16_t{100});
  const fw::TokenData d(t);
  fw::TokenLoader loader(d, /*B=*/2, /*T=*/3, /*vocab=*/200);
  // (21 - 1) / (2 * 3) = 3 whole batches; batch 3 is batch 0 again (tokens 18..20 never used)
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  const std::vector<std::vector<std::int32_t>> inputs = {{100, 101, 102, 103, 104, 105},
                                                         {106, 107, 108, 109, 110, 111},
                                                         {112, 113, 114, 115, 116, 117}};
  for (int k = 0; k < 7; ++k) {
    const auto b = loader.next();
    EXPECT_EQ(b.B, 2);
    EXPECT_EQ(b.T, 3);
    EXPECT_EQ(b.inputs, inputs[static_cast<std::size_t>(k % 3)]) << "batch " << k;
    std::vector<std::int32_t> tg = inputs[static_cast<std::size_t>(k % 3)];
    for (auto& x : tg) ++x;
    EXPECT_EQ(b.targets, tg) << "batch " << k;
  }
}

TEST(TokenLoader, ExactFitHasOneBatchAndTooFewTokensOrLargeIdsAreConfigErrors) {
  std::vector<std::uint16_t> t(7, 5);
  t[6] = 9;
  const fw::TokenData d(t, "seven.bin");
  EXPECT_EQ(fw::TokenLoader(d, 2, 3, 10).batches_per_epoch(), 1);
  try {
    fw::TokenLoader(d, 2, 4, 10);
    FAIL();
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("seven.bin holds 7 tokens; a batch of 2 x 4 needs 9"),
              std::string::npos)
        << e.what();
  }
  try {
    fw::TokenLoader(d, 2, 3, 9);
    FAIL();
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 9 but the model's vocabulary has 9"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(fw::TokenLoader(d, 0, 3, 10), fw::ConfigError);
}
