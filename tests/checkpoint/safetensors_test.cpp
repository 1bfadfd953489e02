#include "fourway/checkpoint/safetensors.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>

namespace fw = fourway;

namespace {

std::vector<unsigned char> raw_file(const std::string& header, std::size_t data_bytes) {
  std::vector<unsigned char> f(8 + header.size() + data_bytes, 0);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    f[static_cast<std::size_t>(i)] = static_cast<unsigned char>(n >> (8 * i));
  std::memcpy(f.data() + 8, header.data(), header.size());
  for (std::size_t i = 0; i < data_bytes; ++i)
    f[8 + header.size() + i] = static_cast<unsigned char>(i * 7 + 1);
  return f;
}

std::string error_of(const std::vector<unsigned char>& bytes) {
  try {
    (void)fw::SafetensorsFile::parse(bytes, "t.safetensors");
  } catch (const fw::CheckpointError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, RoundTripKeepsBitsShapesAndMetadata) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> a(3 * 5);
  for (auto& x : a) x = nd(rng);
  std::vector<fw::bf16> b(7);
  for (auto& x : b) x = fw::bf16(nd(rng));
  std::vector<fw::fp16> c(2 * 3 * 1);
  for (auto& x : c) x = fw::fp16(nd(rng));

  fw::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("quote\"key", "line\nbreak");
  w.add<float>("h.0.attn.c_attn.weight", {3, 5}, a);
  w.add<fw::bf16>("b", {7}, b);
  w.add<fw::fp16>("c", {2, 3, 1}, c);
  w.add<float>("empty", {0, 4}, std::span<const float>());
  const auto bytes = w.serialize();
  const std::uint64_t n = bytes[0] | (std::uint64_t{bytes[1]} << 8);
  EXPECT_EQ(n % 8, 0u) << "the data buffer starts 8-aligned";

  const auto f = fw::SafetensorsFile::parse(bytes);
  ASSERT_EQ(f.entries().size(), 4u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("quote\"key"), "line\nbreak");
  const auto& ea = f.at("h.0.attn.c_attn.weight");
  EXPECT_EQ(ea.dtype, fw::StDtype::F32);
  EXPECT_EQ(ea.shape, (std::vector<std::int64_t>{3, 5}));
  const auto ra = f.read<float>(ea);
  EXPECT_EQ(std::memcmp(ra.data(), a.data(), a.size() * 4), 0);
  const auto rb = f.read<fw::bf16>(f.at("b"));
  EXPECT_EQ(std::memcmp(rb.data(), b.data(), b.size() * 2), 0);
  const auto rc = f.read<fw::fp16>(f.at("c"));
  EXPECT_EQ(std::memcmp(rc.data(), c.data(), c.size() * 2), 0);
  EXPECT_EQ(f.at("empty").numel(), 0);
  // serialising what was read gives the same bytes
  fw::SafetensorsWriter w2;
  w2.set_metadata("format", "pt");
  w2.set_metadata("quote\"key", "line\nbreak");
  for (const auto& e : f.entries()) w2.add(e.name, e.dtype, e.shape, f.bytes(e));
  EXPECT_EQ(w2.serialize(), bytes);
}

TEST(Safetensors, ConvertsHalfAndBfloatToFloat) {
  // fp16 0x3c00 = 1, 0xc000 = -2, 0x0001 = 2^-24; bf16 0x3f80 = 1, 0x4049 = 3.140625
  const std::vector<std::uint16_t> h = {0x3c00, 0xc000, 0x0001};
  const std::vector<std::uint16_t> b = {0x3f80, 0x4049};
  fw::SafetensorsWriter w;
  w.add(std::string("h"), fw::StDtype::F16, {3},
        std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(h.data()), 6));
  w.add(std::string("b"), fw::StDtype::BF16, {2},
        std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(b.data()), 4));
  const std::vector<double> d = {0.1, -1e30};
  w.add<double>("d", {2}, d);
  const auto f = fw::SafetensorsFile::parse(w.serialize());
  EXPECT_EQ(f.read<float>(f.at("h")), (std::vector<float>{1.0f, -2.0f, 0x1p-24f}));
  EXPECT_EQ(f.read<float>(f.at("b")), (std::vector<float>{1.0f, 3.140625f}));
  EXPECT_EQ(f.read<float>(f.at("d")), (std::vector<float>{0.1f, -1e30f}));
}

TEST(Safetensors, AcceptsHandWrittenHeaderWithPaddingAndAnyOrder) {
  const std::string h =
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}, "a" : {"shape":[],"dtype":"I32","data_offsets":[0,4]}}   )";
  const auto f = fw::SafetensorsFile::parse(raw_file(h, 12));
  EXPECT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.at("a").numel(), 1);
  EXPECT_EQ(f.at("b").begin, 4u);
}

TEST(Safetensors, EveryViolationIsACheckpointErrorNamingTensorAndNumbers) {
  struct Case {
    std::string header;
    std::size_t data;
    std::vector<std::string> expect;
  };
  std::string long_shape = "1";
  for (int i = 1; i < 100; ++i) long_shape += ",1";
  const std::vector<Case> cases = {
      {R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
       20,
       {"\"w\"", "(2, 3)", "24 B", "[0, 20]", "20 B"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
       16,
       {"gap of 4 B", "\"w\"", "\"v\""}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12,
       {"\"v\"", "overlaps \"w\"", "ends at 8"}},
      {R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       8,
       {"\"w\"", "overflows the data buffer of 8 B"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       11,
       {"3 trailing bytes", "11 B"}},
      {R"({"w":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8, {"\"w\"", "F31"}},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, {"\"w\"", "-2"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, {"\"w\"", "[8, 0]"}},
      {R"({"w":{"dtype":"F32","shape":[2]}})", 8, {"\"w\"", "data_offsets"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8, {"\"w\"", "\"x\""}},
      {R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
       8,
       {"\"w\"", "overflows"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       16,
       {"duplicate key \"w\""}},
      {R"({"__metadata__":{"k":3}})", 0, {"__metadata__", "\"k\""}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, {"malformed"}},
      {R"([1,2])", 0, {"must start with '{'"}},
      {R"({"w":{"dtype":"F32","shape":[)" + long_shape + R"(],"data_offsets":[0,4]}})",
       4,
       {"array longer than 64"}},
  };
  for (const auto& c : cases) {
    const auto msg = error_of(raw_file(c.header, c.data));
    ASSERT_FALSE(msg.empty()) << "accepted: " << c.header;
    EXPECT_NE(msg.find("t.safetensors"), std::string::npos) << msg;
    for (const auto& e : c.expect)
      EXPECT_NE(msg.find(e), std::string::npos) << e << " not in: " << msg;
  }
}

TEST(Safetensors, HeaderLengthIsCappedAndBoundsChecked) {
  std::vector<unsigned char> f(16, ' ');
  const std::uint64_t huge = 200'000'000;
  for (int i = 0; i < 8; ++i)
    f[static_cast<std::size_t>(i)] = static_cast<unsigned char>(huge >> (8 * i));
  EXPECT_NE(error_of(f).find("exceeds the cap of 100000000 B"), std::string::npos) << error_of(f);
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = 0;
  f[0] = 9;
  EXPECT_NE(error_of(f).find("header length 9 B exceeds the 8 B"), std::string::npos)
      << error_of(f);
  EXPECT_NE(error_of({1, 2, 3}).find("too short"), std::string::npos);
  auto bad = raw_file("{\"\xff\":1}", 0);
  EXPECT_NE(error_of(bad).find("UTF-8"), std::string::npos);
}

TEST(Safetensors, ReadIntoChecksSizeAndDtype) {
  fw::SafetensorsWriter w;
  const std::vector<std::int32_t> i = {1, 2, 3};
  w.add<std::int32_t>("ids", {3}, i);
  const auto f = fw::SafetensorsFile::parse(w.serialize());
  std::vector<float> out(3);
  EXPECT_THROW(f.read_into<float>(f.at("ids"), out), fw::CheckpointError);
  EXPECT_THROW((void)f.at("missing"), fw::CheckpointError);
  fw::SafetensorsWriter w2;
  EXPECT_THROW(w2.add<float>("x", {2}, std::span<const float>(out)), fw::CheckpointError);
  w2.add<float>("x", {3}, std::span<const float>(out));
  EXPECT_THROW(w2.add<float>("x", {3}, std::span<const float>(out)), fw::CheckpointError);
}

TEST(Safetensors, FileWriteAndReadAndMissingFile) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("fourway_st_test.safetensors_" + std::to_string(::getpid()));
  fw::SafetensorsWriter w;
  const std::vector<float> v = {1.5f, -2.25f};
  w.add<float>("v", {2}, v);
  w.write(path);
  const auto f = fw::SafetensorsFile::read(path);
  EXPECT_EQ(f.read<float>(f.at("v")), v);
  std::filesystem::remove(path);
  try {
    (void)fw::SafetensorsFile::read(path);
    FAIL() << "missing file accepted";
  } catch (const fw::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("fourway_st_test.safetensors"), std::string::npos);
  }
}
