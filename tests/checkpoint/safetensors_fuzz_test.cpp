// Thousands of corrupted and truncated safetensors files: each must parse or throw
// CheckpointError, never crash or read out of bounds (this test runs under ASan in the asan
// preset).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "fourway/checkpoint/safetensors.hpp"

namespace fw = fourway;

namespace {

std::vector<unsigned char> valid_file() {
  fw::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  std::vector<float> a(6 * 5), b(3);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.25f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  w.add<float>("h.0.mlp.c_fc.weight", {6, 5}, a);
  w.add<float>("h.0.mlp.c_fc.bias", {3}, b);
  std::vector<fw::bf16> c(4, fw::bf16(1.0f));
  w.add<fw::bf16>("wte.weight", {2, 2}, c);
  return w.serialize();
}

// Returns 1 if parsed, 0 if rejected with CheckpointError; anything else fails the test.
int try_parse(std::vector<unsigned char> bytes) {
  try {
    const auto f = fw::SafetensorsFile::parse(std::move(bytes), "fuzz");
    double sum = 0;
    for (const auto& e : f.entries()) {
      try {
        for (float x : f.read<float>(e)) sum += static_cast<double>(x);
      } catch (const fw::CheckpointError&) {
      }
    }
    (void)sum;
    return 1;
  } catch (const fw::CheckpointError&) {
    return 0;
  }
}

}  // namespace

TEST(SafetensorsFuzz, EveryTruncationIsRejected) {
  const auto good = valid_file();
  ASSERT_EQ(try_parse(good), 1);
  for (std::size_t n = 0; n < good.size(); ++n) {
    EXPECT_EQ(try_parse(std::vector<unsigned char>(good.begin(),
                                                   good.begin() + static_cast<std::ptrdiff_t>(n))),
              0)
        << "truncated to " << n;
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_EQ(try_parse(longer), 0) << "a trailing byte";
}

TEST(SafetensorsFuzz, RandomByteFlipsNeverCrash) {
  const auto good = valid_file();
  const std::uint64_t header = good[0] | (std::uint64_t{good[1]} << 8);
  std::mt19937_64 rng(20240520);
  int accepted = 0, rejected = 0;
  for (int it = 0; it < 20000; ++it) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // mostly the length field and the JSON header, where the structure lives
      const std::size_t limit = (rng() % 8 == 0) ? b.size() : static_cast<std::size_t>(8 + header);
      const std::size_t pos = rng() % limit;
      switch (rng() % 3) {
        case 0: b[pos] = static_cast<unsigned char>(rng()); break;
        case 1: b[pos] ^= static_cast<unsigned char>(1u << (rng() % 8)); break;
        default: {
          static const char digits[] = "0123456789,[]{}\":- ";
          b[pos] = static_cast<unsigned char>(digits[rng() % (sizeof(digits) - 1)]);
        }
      }
    }
    if (rng() % 5 == 0) b.resize(rng() % (b.size() + 1));
    (try_parse(std::move(b)) ? accepted : rejected)++;
  }
  EXPECT_GT(rejected, 5000);
  RecordProperty("accepted", accepted);
}

TEST(SafetensorsFuzz, RandomHeadersNeverCrash) {
  std::mt19937_64 rng(17);
  static const char* pieces[] = {"{",
                                 "}",
                                 "[",
                                 "]",
                                 ",",
                                 ":",
                                 "\"dtype\"",
                                 "\"F32\"",
                                 "\"BF16\"",
                                 "\"shape\"",
                                 "\"data_offsets\"",
                                 "\"w\"",
                                 "\"__metadata__\"",
                                 "0",
                                 "4",
                                 "8",
                                 "18446744073709551615",
                                 "99999999999999999999999",
                                 "-1",
                                 "1e3",
                                 "\"\\u00e9\"",
                                 "\"\\ud800\"",
                                 "true",
                                 "null",
                                 " "};
  for (int it = 0; it < 10000; ++it) {
    std::string h = "{";
    const int n = static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) h += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    if (rng() % 2) h += "}";
    const std::size_t data = rng() % 32;
    std::vector<unsigned char> f(8 + h.size() + data, 0);
    const std::uint64_t len = h.size();
    for (int i = 0; i < 8; ++i)
      f[static_cast<std::size_t>(i)] = static_cast<unsigned char>(len >> (8 * i));
    std::memcpy(f.data() + 8, h.data(), h.size());
    (void)try_parse(std::move(f));
  }
  // a deeply nested header stops at the depth limit instead of overflowing the stack
  std::string deep(100000, '[');
  deep.insert(0, "{\"a\":");
  std::vector<unsigned char> f(8 + deep.size());
  for (int i = 0; i < 8; ++i)
    f[static_cast<std::size_t>(i)] = static_cast<unsigned char>(deep.size() >> (8 * i));
  std::memcpy(f.data() + 8, deep.data(), deep.size());
  EXPECT_EQ(try_parse(f), 0);
}
