#include "fourway/checkpoint/sharded_io.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fourway/comm/local_world.hpp"

namespace fw = fourway;

namespace {

std::filesystem::path scratch(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("fourway_sharded_io_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

std::vector<unsigned char> slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::filesystem::path& p, const std::vector<unsigned char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

/// Three tensors of three dtypes with odd sizes, and the whole file the one-process writer makes.
struct Sample {
  std::vector<float> a = std::vector<float>(3 * 7);
  std::vector<fw::bf16> b = std::vector<fw::bf16>(13);
  std::vector<fw::fp16> c = std::vector<fw::fp16>(2 * 5);
  fw::SafetensorsWriter writer;
  Sample() {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    for (auto& x : a) x = nd(rng);
    for (auto& x : b) x = fw::convert<fw::bf16>(nd(rng));
    for (auto& x : c) x = fw::convert<fw::fp16>(nd(rng));
    writer.set_metadata("format", "pt");
    writer.add<float>("a", {3, 7}, a);
    writer.add<fw::bf16>("b", {13}, b);
    writer.add<fw::fp16>("c", {2, 5}, c);
  }
  [[nodiscard]] std::vector<fw::CollectiveTensor> tensors() const {
    return {{"a", fw::StDtype::F32, {3, 7}},
            {"b", fw::StDtype::BF16, {13}},
            {"c", fw::StDtype::F16, {2, 5}}};
  }
  [[nodiscard]] std::vector<unsigned char> bytes_of(std::size_t t) const {
    const auto* p = t == 0   ? reinterpret_cast<const unsigned char*>(a.data())
                    : t == 1 ? reinterpret_cast<const unsigned char*>(b.data())
                             : reinterpret_cast<const unsigned char*>(c.data());
    const std::size_t n = t == 0 ? a.size() * 4 : t == 1 ? b.size() * 2 : c.size() * 2;
    return {p, p + n};
  }
};

/// Rank r of n writes bytes [r*part, (r+1)*part) of every tensor (split mid-element on purpose
/// only at element boundaries: part is a multiple of the element size).
void write_share(const Sample& s, fw::PieceSink& sink, int r, int n) {
  const std::size_t esize[3] = {4, 2, 2};
  for (std::size_t t = 0; t < 3; ++t) {
    const auto all = s.bytes_of(t);
    const std::size_t elems = all.size() / esize[t];
    const std::size_t part =
        (elems + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n);
    const std::size_t lo = std::min(elems, part * static_cast<std::size_t>(r));
    const std::size_t hi = std::min(elems, lo + part);
    if (hi > lo) {
      sink.write(t, lo * esize[t],
                 std::span<const unsigned char>(all.data() + lo * esize[t], (hi - lo) * esize[t]));
    }
  }
}

}  // namespace

TEST(SafetensorsReader, ReadsElementRangesWithPositionedReadsAndCountsTheBytes) {
  const Sample s;
  const auto path = scratch("reader.safetensors");
  spit(path, s.writer.serialize());
  auto r = fw::SafetensorsReader::open(path);
  const auto whole = fw::SafetensorsFile::read(path);
  const std::uint64_t header = whole.data_offset();
  EXPECT_EQ(r.bytes_read(), header);  // only the length field and the header so far
  ASSERT_NE(r.find("a"), nullptr);
  // a (F32) as bf16, elements [4, 11): converted on the way
  std::vector<fw::bf16> got(7);
  r.read_elements(*r.find("a"), 4, 7, got.data());
  for (int i = 0; i < 7; ++i) EXPECT_EQ(got[i], fw::convert<fw::bf16>(s.a[4 + i]));
  EXPECT_EQ(r.bytes_read(), header + 7 * 4);
  std::vector<float> c(3);
  r.read_elements(*r.find("c"), 7, 3, c.data());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c[i], fw::convert<float>(s.c[7 + i]));
  EXPECT_EQ(r.bytes_read(), header + 7 * 4 + 3 * 2);
  EXPECT_THROW(r.read_elements(*r.find("b"), 10, 4, c.data()), fw::CheckpointError);
  EXPECT_TRUE(r.same_bytes(*r.find("a"), *r.find("a")));
  EXPECT_FALSE(r.same_bytes(*r.find("b"), *r.find("c")));
}

TEST(SafetensorsReader, AppliesTheStrictHeaderChecksOfTheWholeFileReader) {
  const Sample s;
  auto bytes = s.writer.serialize();
  const auto path = scratch("bad.safetensors");
  bytes.pop_back();  // the data buffer no longer holds the last tensor
  spit(path, bytes);
  std::string whole, positioned;
  try {
    (void)fw::SafetensorsFile::read(path);
  } catch (const fw::CheckpointError& e) {
    whole = e.what();
  }
  try {
    (void)fw::SafetensorsReader::open(path);
  } catch (const fw::CheckpointError& e) {
    positioned = e.what();
  }
  EXPECT_FALSE(whole.empty());
  EXPECT_EQ(positioned, whole);
  spit(path, {1, 2, 3});
  EXPECT_THROW((void)fw::SafetensorsReader::open(path), fw::CheckpointError);
  EXPECT_THROW((void)fw::SafetensorsReader::open(scratch("missing.safetensors")),
               fw::CheckpointError);
}

TEST(SafetensorsCollective, RanksWritingTheirPiecesMakeTheOneProcessFileByteForByte) {
  const Sample s;
  const auto expected = s.writer.serialize();
  for (int n : {1, 3, 8}) {
    const auto path = scratch("collective_" + std::to_string(n) + ".safetensors");
    std::filesystem::remove(path);
    fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
      (void)fw::write_safetensors_collective(
          w.rank(), fw::flag_gather(w.ctx(), w.comm()), path, {{"format", "pt"}}, s.tensors(),
          [&](fw::PieceSink& sink) { write_share(s, sink, w.rank(), n); });
    });
    EXPECT_EQ(slurp(path), expected) << n << " ranks";
    auto tmp = path;
    tmp += ".tmp";
    EXPECT_FALSE(std::filesystem::exists(tmp));
  }
}

TEST(SafetensorsCollective, ARankFailingMidSaveLeavesNoFileAndAnErrorOnEveryRank) {
  const Sample s;
  const auto path = scratch("failed.safetensors");
  std::filesystem::remove(path);
  constexpr int n = 4;
  std::vector<std::string> errors(n);
  fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
    try {
      (void)fw::write_safetensors_collective(
          w.rank(), fw::flag_gather(w.ctx(), w.comm()), path, {{"format", "pt"}}, s.tensors(),
          [&](fw::PieceSink& sink) {
            write_share(s, sink, w.rank(), n);
            if (w.rank() == 2) throw fw::CheckpointError("injected: disk full on rank 2");
          });
    } catch (const fw::CheckpointError& e) {
      errors[static_cast<std::size_t>(w.rank())] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("failed on rank(s) 2"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
  }
  EXPECT_NE(errors[2].find("injected: disk full"), std::string::npos) << errors[2];
  EXPECT_FALSE(std::filesystem::exists(path));
  auto tmp = path;
  tmp += ".tmp";
  EXPECT_FALSE(std::filesystem::exists(tmp));
  // an existing file under the final name is never replaced by a failed save
  spit(path, {42});
  fw::launch<fw::LocalWorld>(2, [&](fw::World<fw::LocalWorld>& w) {
    EXPECT_THROW((void)fw::write_safetensors_collective(
                     w.rank(), fw::flag_gather(w.ctx(), w.comm()), path, {}, s.tensors(),
                     [&](fw::PieceSink& sink) {
                       if (w.rank() == 1) sink.write(0, 1000, std::span<const unsigned char>());
                       sink.write(9, 0, std::span<const unsigned char>());
                     }),
                 fw::CheckpointError);
  });
  EXPECT_EQ(slurp(path), std::vector<unsigned char>{42});
}
