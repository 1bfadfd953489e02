// Sharded load and save: every rank reads and writes only the elements it owns, and the file is
// the one-rank file byte for byte, whatever the ZeRO stage and the number of ranks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "fourway/checkpoint/gpt2_checkpoint.hpp"
#include "fourway/models/gpt2.hpp"
#include "fourway/train/weights_save.hpp"
#include "parallel_harness.hpp"

namespace {

using harness::RunConfig;

std::filesystem::path scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("fourway_sharded_ckpt_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

std::vector<unsigned char> slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The one-rank reference file: an eager model (seed `seed`) saved by the one-process writer.
template <class T>
std::vector<unsigned char> one_rank_file(std::uint64_t seed) {
  fw::MemoryAccountant mem;
  fw::Context<fw::Host> ctx(mem);
  fw::models::Gpt<T, fw::Host> model(ctx, harness::tiny_gpt(), seed);
  fw::SafetensorsWriter w;
  fw::add_gpt2_tensors(ctx, model, w);
  return w.serialize();
}

struct Io {
  std::uint64_t bytes_read = 0;  // from `load`, this rank
};

/// On `ranks` ranks under `Stage`: a deferred model, optionally loaded from `load`, saved to
/// `save`. Returns each rank's bytes read.
template <class T, int Stage>
std::vector<Io> load_and_save(int ranks, const std::filesystem::path& load,
                              const std::filesystem::path& save) {
  using Model = fw::models::Gpt<T, fw::Host>;
  using S = fw::ShardedStrategy<Stage, Model, fw::Precision<T>, fw::Host, fw::LocalComm>;
  std::vector<Io> out(static_cast<std::size_t>(ranks));
  fw::launch<fw::LocalWorld>(ranks, [&](fw::World<fw::LocalWorld>& w) {
    fw::LocalComm dp = w.comm().split(0, w.rank(), "dp");
    Model model = Model::deferred(w.ctx(), harness::tiny_gpt(), harness::kSeed);
    fw::ShardedOptions so;
    so.bucket_bytes = 512;
    S strategy(w.ctx(), model, dp, harness::adamw(), so);
    if (!load.empty()) {
      const auto f = fw::SafetensorsReader::open(load);
      fw::load_gpt2_sharded(strategy, f);
      out[static_cast<std::size_t>(w.rank())].bytes_read = f.bytes_read();
    }
    (void)fw::save_gpt2_sharded(strategy, harness::tiny_gpt(), w.rank(),
                                fw::flag_gather(w.ctx(), dp), save);
  });
  return out;
}

template <class T>
std::vector<Io> load_and_save(int stage, int ranks, const std::filesystem::path& load,
                              const std::filesystem::path& save) {
  switch (stage) {
    case 0: return load_and_save<T, 0>(ranks, load, save);
    case 1: return load_and_save<T, 1>(ranks, load, save);
    case 2: return load_and_save<T, 2>(ranks, load, save);
    default: return load_and_save<T, 3>(ranks, load, save);
  }
}

}  // namespace

TEST(ParallelShardedCheckpoint, SaveAtInitIsTheOneRankFileOnEveryMesh) {
  const auto expected = one_rank_file<fw::bf16>(harness::kSeed);
  for (int stage = 0; stage < 4; ++stage) {
    for (int n : {1, 3, 8}) {
      const auto path = scratch("init.safetensors");
      std::filesystem::remove(path);
      (void)load_and_save<fw::bf16>(stage, n, {}, path);
      EXPECT_EQ(slurp(path), expected) << "stage " << stage << ", " << n << " ranks";
    }
  }
}

TEST(ParallelShardedCheckpoint, LoadThenSaveIsByteIdenticalAndEachRankReadsItsShare) {
  const auto source = scratch("source.safetensors");
  const auto expected = one_rank_file<fw::bf16>(777);  // not the models' own seed
  {
    std::ofstream out(source, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(expected.data()),
              static_cast<std::streamsize>(expected.size()));
  }
  const auto index = fw::SafetensorsFile::read(source);
  const std::uint64_t header = index.data_offset();
  const std::uint64_t data = expected.size() - header;
  const int units = harness::tiny_gpt().layers + 2;
  for (int stage = 0; stage < 4; ++stage) {
    for (int n : {1, 8}) {
      SCOPED_TRACE(::testing::Message() << "stage " << stage << ", " << n << " ranks");
      const auto saved = scratch("resaved.safetensors");
      std::filesystem::remove(saved);
      const auto io = load_and_save<fw::bf16>(stage, n, source, saved);
      EXPECT_EQ(slurp(saved), expected);
      for (std::size_t r = 0; r < io.size(); ++r) {
        if (stage == 0 || n == 1) {
          EXPECT_EQ(io[r].bytes_read, header + data);  // a replica reads everything, once
        } else if (stage == 3) {
          // 1/N of every unit, rounded up per unit
          EXPECT_LE(io[r].bytes_read, header + data / 8 + static_cast<std::uint64_t>(2 * units));
        } else {
          EXPECT_LE(io[r].bytes_read, header + data / 8 + 2 * 64);  // <= 64 buckets of 512 B
        }
      }
    }
  }
  // and from a one-rank file of another dtype: fp32 weights converted to bf16 on the way
  const auto fp32 = one_rank_file<float>(777);
  {
    std::ofstream out(source, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(fp32.data()),
              static_cast<std::streamsize>(fp32.size()));
  }
  const auto saved = scratch("converted.safetensors");
  (void)load_and_save<fw::bf16>(3, 8, source, saved);
  EXPECT_EQ(slurp(saved), expected);  // fp32 -> bf16 rounds as the bf16 model's own init did
}
