// checkpoint/crc32c.hpp and checkpoint/state_dir.hpp: the checksum against a bit-at-a-time
// reference, the directory format written by 1 and 3 ranks and read back in arbitrary ranges,
// the atomic commit under a kill at every phase, corrupt and truncated files, a failing rank.
#include "fourway/checkpoint/state_dir.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fourway/checkpoint/async_state_save.hpp"
#include "fourway/checkpoint/crc32c.hpp"
#include "fourway/comm/local_world.hpp"

namespace fw = fourway;
namespace fs = std::filesystem;

namespace {

// The definition: reflected CRC-32C, one bit at a time (independent of the table code).
std::uint32_t crc_reference(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int b = 0; b < 8; ++b) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

fs::path scratch(const std::string& name) {
  const auto dir =
      fs::temp_directory_path() / ("fourway_state_dir_" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Two global tensors: "a" of 10 x 7 and "b" of 33; value of element i of tensor t is a known
// function, so any reader can check any range without the writer.
float value(int t, std::int64_t i) { return static_cast<float>(t * 1000 + i) * 0.5f; }
const std::vector<fw::StateTensor> kTensors{{"a", {10, 7}}, {"b", {33}}};

/// Rank r of n holds the r-th of n near-equal parts of every tensor (the last may be empty).
std::vector<fw::StatePiece> pieces_of(int r, int n) {
  std::vector<fw::StatePiece> out;
  for (const auto& t : kTensors) {
    const std::int64_t part = (t.numel() + n - 1) / n;
    const std::int64_t lo = std::min(t.numel(), r * part), hi = std::min(t.numel(), lo + part);
    if (hi > lo) out.push_back({t.name, lo, hi - lo});
  }
  return out;
}

/// The global element of value j of piece p (run after run).
std::int64_t element_of(const fw::StatePiece& p, std::int64_t j) {
  return p.first + (j / p.count) * p.stride + j % p.count;
}

void push_values(fw::StateSink& sink, const std::vector<fw::StatePiece>& pieces) {
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const int t = pieces[k].tensor == "a" ? 0 : 1;
    std::vector<float> v;
    for (std::int64_t i = 0; i < pieces[k].values(); ++i) {
      v.push_back(value(t, element_of(pieces[k], i)));
    }
    sink.put(k, 0, std::span<const float>(v).first(v.size() / 2));  // two puts, in order
    sink.put(k, static_cast<std::int64_t>(v.size() / 2),
             std::span<const float>(v).subspan(v.size() / 2));
  }
}

std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fw::FlagGather solo() {
  return [](std::int64_t mine) { return std::vector<std::int64_t>{mine}; };
}

fs::path save_solo(const fs::path& root, std::int64_t step, int keep = 0,
                   std::function<void(fw::SavePhase)> hook = {}) {
  fw::StateSave s{root, step, kTensors, {{"note", "solo"}}, keep, std::move(hook)};
  const auto mine = pieces_of(0, 1);
  return fw::save_state_dir(0, 1, solo(), s, mine,
                            [&](fw::StateSink& sink) { push_values(sink, mine); });
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fw::CheckpointError& e) {
    return e.what();
  }
  return "no error";
}

void expect_reads_back(const fs::path& dir) {
  auto d = fw::StateDir::open(dir);
  for (int t = 0; t < 2; ++t) {
    const auto& tensor = kTensors[static_cast<std::size_t>(t)];
    for (auto [first, count] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {0, tensor.numel()}, {3, 20}, {tensor.numel() - 1, 1}, {5, 0}}) {
      std::vector<float> got(static_cast<std::size_t>(count), -1.0f);
      d.read(tensor.name, first, count, [&](std::int64_t off, std::span<const float> v) {
        std::copy(v.begin(), v.end(), got.begin() + off);
      });
      for (std::int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[static_cast<std::size_t>(i)], value(t, first + i))
            << tensor.name << " element " << first + i;
      }
    }
  }
}

}  // namespace

TEST(Crc32c, MatchesTheStandardCheckValuesAndABitwiseReference) {
  EXPECT_EQ(fw::crc32c("123456789"), 0xE3069283u);  // the catalogue's check value
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(fw::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(fw::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(300);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (std::size_t off = 0; off < 9; ++off) {
    for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 63u, 64u, 200u}) {
      const std::uint32_t ref = crc_reference(buf.data() + off, n);
      EXPECT_EQ(fw::crc32c(buf.data() + off, n), ref) << off << "+" << n;
      EXPECT_EQ(~fw::detail::crc32c_portable(0xFFFFFFFFu, buf.data() + off, n), ref);
      fw::Crc32c inc;  // split anywhere: the same value
      inc.update(buf.data() + off, n / 3).update(buf.data() + off + n / 3, n - n / 3);
      EXPECT_EQ(inc.value(), ref);
    }
  }
}

TEST(StateDir, ThreeRanksWriteOneRankReadsAnyRangeAndTheIndexDescribesEverything) {
  const auto root = scratch("three");
  fw::launch<fw::LocalWorld>(3, [&](fw::World<fw::LocalWorld>& w) {
    fw::StateSave s{root, 7, kTensors, {{"mesh", "dp=3"}}, 0, {}};
    const auto mine = pieces_of(w.rank(), 3);
    const auto dir = fw::save_state_dir(w.rank(), 3, fw::flag_gather(w.ctx(), w.comm()), s, mine,
                                        [&](fw::StateSink& sink) { push_values(sink, mine); });
    EXPECT_EQ(dir, root / "step-00000007");
  });
  const auto dir = root / "step-00000007";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"index.json", "rank-00000.safetensors",
                                             "rank-00001.safetensors", "rank-00002.safetensors"}));
  const auto d = fw::StateDir::open(dir);
  EXPECT_EQ(d.index().step, 7);
  EXPECT_EQ(d.index().meta.at("mesh"), "dp=3");
  ASSERT_EQ(d.index().files.size(), 3u);
  EXPECT_EQ(d.index().files[1].slices.size(), 2u);
  EXPECT_EQ(d.index().files[1].slices[0].first, 24);  // ceil(70 / 3) = 24
  EXPECT_TRUE(d.verify_files().empty());
  expect_reads_back(dir);
  // A range inside one rank's slice reads that file only: less than a third of the data.
  auto d2 = fw::StateDir::open(dir);
  d2.read("a", 30, 5, [](std::int64_t, std::span<const float>) {});
  // rank 1's slice of "a" is [24, 48) and of "b" [11, 22): 35 floats of data, read: 24 + header
  const auto file1 = fs::file_size(dir / "rank-00001.safetensors");
  EXPECT_EQ(d2.bytes_read(), 24u * 4 + (file1 - 35u * 4));
  EXPECT_EQ(fw::latest_checkpoint(root), dir);
}

TEST(StateDir, KeepRemovesOlderCheckpointsOnlyAfterTheCommitAndStepsAreNeverOverwritten) {
  const auto root = scratch("keep");
  for (int step = 1; step <= 4; ++step) (void)save_solo(root, step * 10, 2);
  EXPECT_EQ(fw::committed_checkpoints(root),
            (std::vector<fs::path>{root / "step-00000030", root / "step-00000040"}));
  EXPECT_EQ(fs::exists(root / "step-00000010"), false);
  const auto msg = error_of([&] { (void)save_solo(root, 40); });
  EXPECT_NE(msg.find("already holds a committed checkpoint"), std::string::npos) << msg;
  expect_reads_back(root / "step-00000040");
}

TEST(StateDir, AKillAtEveryPhaseLeavesThePreviousCheckpointAndNoHalfOne) {
  for (auto phase : {fw::SavePhase::create, fw::SavePhase::write, fw::SavePhase::index,
                     fw::SavePhase::commit, fw::SavePhase::prune}) {
    SCOPED_TRACE(std::string(fw::save_phase_name(phase)));
    const auto root = scratch("kill");
    const auto previous = save_solo(root, 1, 1);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the child saves step 2 and dies just before `phase`
      try {
        (void)save_solo(root, 2, 1, [phase](fw::SavePhase p) {
          if (p == phase) ::_exit(42);
        });
      } catch (...) {
      }
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 42);
    const auto committed = fw::committed_checkpoints(root);
    if (phase == fw::SavePhase::prune) {  // died after the commit: both exist, both complete
      EXPECT_EQ(committed, (std::vector<fs::path>{previous, root / "step-00000002"}));
      expect_reads_back(root / "step-00000002");
    } else {
      EXPECT_EQ(committed, std::vector<fs::path>{previous});
      EXPECT_FALSE(fs::exists(root / "step-00000002"));
      EXPECT_NE(error_of([&] {
                  (void)fw::StateDir::open(root / ".step-00000002.tmp");
                }).find("is not a committed checkpoint"),
                std::string::npos);
    }
    expect_reads_back(previous);
    EXPECT_TRUE(fw::StateDir::open(previous).verify_files().empty());
    // The next save cleans the stale temporary directory up and commits.
    (void)save_solo(root, 3, 1);
    EXPECT_FALSE(fs::exists(root / ".step-00000002.tmp"));
    EXPECT_EQ(fw::committed_checkpoints(root), std::vector<fs::path>{root / "step-00000003"});
  }
}

TEST(StateDir, AFlippedBitNamesFileAndTensorATruncatedFileNamesTheFile) {
  const auto root = scratch("corrupt");
  const auto dir = save_solo(root, 5);
  const auto file = dir / "rank-00000.safetensors";
  const auto size = fs::file_size(file);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size - 9));  // inside the last tensor's values ("b")
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(size - 9));
    f.put(static_cast<char>(c ^ 0x10));
  }
  auto d = fw::StateDir::open(dir);
  auto ignore = [](std::int64_t, std::span<const float>) {};
  EXPECT_EQ(error_of([&] { d.read("a", 0, 70, ignore); }), "no error");  // "a" is intact
  const auto msg = error_of([&] { d.read("b", 0, 2, ignore); });
  EXPECT_NE(msg.find("checksum mismatch in " + file.string() + ", tensor \"b\""), std::string::npos)
      << msg;
  ASSERT_EQ(d.verify_files().size(), 1u);
  EXPECT_NE(d.verify_files()[0].find("CRC-32C"), std::string::npos);

  fs::resize_file(file, size - 100);
  auto t = fw::StateDir::open(dir);
  const auto cut = error_of([&] { t.read("a", 0, 1, ignore); });
  EXPECT_NE(cut.find(file.string() + " holds " + std::to_string(size - 100) + " B"),
            std::string::npos)
      << cut;
  EXPECT_NE(t.verify_files()[0].find("truncated"), std::string::npos);
}

TEST(StateDir, AFailureOnOneRankIsAnErrorOnEveryRankAndNothingIsCommitted) {
  const auto root = scratch("fail");
  std::vector<std::string> errors(3);
  fw::launch<fw::LocalWorld>(3, [&](fw::World<fw::LocalWorld>& w) {
    fw::StateSave s{root, 9, kTensors, {}, 0, {}};
    const auto mine = pieces_of(w.rank(), 3);
    errors[static_cast<std::size_t>(w.rank())] = error_of([&] {
      (void)fw::save_state_dir(w.rank(), 3, fw::flag_gather(w.ctx(), w.comm()), s, mine,
                               [&](fw::StateSink& sink) {
                                 if (w.rank() == 1) {
                                   throw std::runtime_error("No space left on device");
                                 }
                                 push_values(sink, mine);
                               });
    });
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("failed on rank(s) 1"), std::string::npos)
        << r << ": " << errors[static_cast<std::size_t>(r)];
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("nothing was committed"), std::string::npos);
  }
  EXPECT_NE(errors[1].find("No space left on device"), std::string::npos);
  EXPECT_TRUE(fw::committed_checkpoints(root).empty());
  EXPECT_FALSE(fs::exists(root / ".step-00000009.tmp"));
}

TEST(StateDir, ValuesPushedOutOfFileOrderGiveTheSameFileAndChecksums) {
  // The file's CRC-32C is computed while writing when the values come in file order (every
  // test above), and read back from the file when they do not: both must equal the re-read.
  const auto in_order = scratch("in_order"), mixed = scratch("mixed");
  (void)save_solo(in_order, 4);
  const auto mine = pieces_of(0, 1);
  fw::StateSave s{mixed, 4, kTensors, {{"note", "solo"}}, 0, {}};
  (void)fw::save_state_dir(0, 1, solo(), s, mine, [&](fw::StateSink& sink) {
    std::vector<std::vector<float>> v(mine.size());
    for (std::size_t k = 0; k < mine.size(); ++k) {
      for (std::int64_t i = 0; i < mine[k].count; ++i) {
        v[k].push_back(value(mine[k].tensor == "a" ? 0 : 1, mine[k].first + i));
      }
    }
    sink.put(1, 0, std::span<const float>(v[1]).first(5));  // "b" starts before "a"
    sink.put(0, 0, v[0]);
    sink.put(1, 5, std::span<const float>(v[1]).subspan(5));
  });
  for (const auto& root : {in_order, mixed}) {
    EXPECT_TRUE(fw::StateDir::open(root / "step-00000004").verify_files().empty()) << root;
  }
  EXPECT_EQ(file_text(mixed / "step-00000004" / "index.json"),
            file_text(in_order / "step-00000004" / "index.json"));
  expect_reads_back(mixed / "step-00000004");
}

// Tensor-parallel slices are boxes: "a" (10 x 7) split by columns, [0, 3) on rank 0 and [3, 7) on
// ranks 1 (rows 0-4) and 2 (rows 5-9); "b" whole on rank 2. Every range reads back, interleaved
// rows included, and a range inside rank 2's box touches rank 2's file only.
TEST(StateDir, StridedSlicesOfThreeRanksReadBackAnyRange) {
  const auto root = scratch("strided");
  const std::vector<std::vector<fw::StatePiece>> mine{
      {{"a", 0, 3, 7, 10}}, {{"a", 3, 4, 7, 5}}, {{"b", 0, 33}, {"a", 38, 4, 7, 5}}};
  fw::launch<fw::LocalWorld>(3, [&](fw::World<fw::LocalWorld>& w) {
    fw::StateSave s{root, 3, kTensors, {}, 0, {}};
    const auto& m = mine[static_cast<std::size_t>(w.rank())];
    (void)fw::save_state_dir(w.rank(), 3, fw::flag_gather(w.ctx(), w.comm()), s, m,
                             [&](fw::StateSink& sink) { push_values(sink, m); });
  });
  const auto dir = root / "step-00000003";
  EXPECT_NE(file_text(dir / "index.json").find("[\"a\",3,4,"), std::string::npos);
  EXPECT_NE(file_text(dir / "index.json").find(",7,5]"), std::string::npos);
  auto d = fw::StateDir::open(dir);
  EXPECT_EQ(d.index().files[0].slices[0].rows, 10);
  EXPECT_TRUE(d.verify_files().empty());
  expect_reads_back(dir);
  auto d2 = fw::StateDir::open(dir);
  std::vector<float> got;
  d2.read("a", 5 * 7 + 4, 2, [&](std::int64_t, std::span<const float> v) {
    got.insert(got.end(), v.begin(), v.end());
  });
  EXPECT_EQ(got, (std::vector<float>{value(0, 39), value(0, 40)}));
  const auto file2 = fs::file_size(dir / "rank-00002.safetensors");
  EXPECT_EQ(d2.bytes_read(), file2 - 33u * 4);  // the header and rank 2's box of "a", verified
  // Boxes that overlap, or runs of a slice that overlap each other, are refused.
  fw::StateIndex x;
  x.tensors = {{"a", {10, 7}}};
  x.files = {{"rank-00000.safetensors", 1, 0, {{"a", 0, 3, 0, 7, 10}}},
             {"rank-00001.safetensors", 1, 0, {{"a", 2, 5, 0, 7, 10}}}};
  auto msg = error_of([&] { (void)fw::parse_state_index(fw::to_json(x), "idx"); });
  EXPECT_NE(msg.find("overlap at element 2"), std::string::npos) << msg;
  x.files[1].slices[0] = {"a", 3, 4, 0, 7, 10};
  EXPECT_EQ(error_of([&] { (void)fw::parse_state_index(fw::to_json(x), "idx"); }), "no error");
  x.files[1].slices[0] = {"a", 3, 4, 0, 3, 10};
  msg = error_of([&] { (void)fw::parse_state_index(fw::to_json(x), "idx"); });
  EXPECT_NE(msg.find("runs may not overlap"), std::string::npos) << msg;
}

TEST(StateDir, AnIndexWithAHoleOrAnOverlapIsRefused) {
  fw::StateIndex x;
  x.tensors = {{"a", {10}}};
  x.files = {{"rank-00000.safetensors", 1, 0, {{"a", 0, 4, 0}}},
             {"rank-00001.safetensors", 1, 0, {{"a", 5, 5, 0}}}};
  auto msg = error_of([&] { (void)fw::parse_state_index(fw::to_json(x), "idx"); });
  EXPECT_NE(msg.find("the slices of \"a\" leave a hole at element 4"), std::string::npos) << msg;
  x.files[1].slices[0] = {"a", 3, 7, 0};
  msg = error_of([&] { (void)fw::parse_state_index(fw::to_json(x), "idx"); });
  EXPECT_NE(msg.find("overlap at element 3"), std::string::npos) << msg;
  x.files[1].slices[0] = {"a", 4, 6, 0};
  EXPECT_EQ(error_of([&] { (void)fw::parse_state_index(fw::to_json(x), "idx"); }), "no error");
  x.files[1].name = "../escape";
  msg = error_of([&] { (void)fw::parse_state_index(fw::to_json(x), "idx"); });
  EXPECT_NE(msg.find("may not leave the directory"), std::string::npos) << msg;
}

namespace {
/// Fills `snap` with rank r's values (the same function push_values writes).
void fill_snapshot(fw::StateSnapshot& snap, const std::vector<fw::StatePiece>& pieces) {
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const int t = pieces[k].tensor == "a" ? 0 : 1;
    std::vector<float> v;
    for (std::int64_t i = 0; i < pieces[k].count; ++i) v.push_back(value(t, pieces[k].first + i));
    snap.put(k, 0, v);
  }
}

}  // namespace

TEST(AsyncStateSave, WritesInTheBackgroundAndCommitsTheSameBytesAsTheSynchronousSave) {
  const auto sync_root = scratch("async_sync"), async_root = scratch("async");
  std::atomic<bool> release{false};
  std::vector<int> polled(3, -1);
  fw::launch<fw::LocalWorld>(3, [&](fw::World<fw::LocalWorld>& w) {
    const auto flags = fw::flag_gather(w.ctx(), w.comm());
    const auto mine = pieces_of(w.rank(), 3);
    (void)fw::save_state_dir(w.rank(), 3, flags, fw::StateSave{sync_root, 7, kTensors, {}, 0, {}},
                             mine, [&](fw::StateSink& sink) { push_values(sink, mine); });
    fw::AsyncStateSave pending;
    fill_snapshot(pending.snapshot(mine), mine);
    // Rank 2's write waits until every rank polled once: the first poll sees it unfinished.
    fw::StateSave s{async_root, 7, kTensors, {}, 0, [&](fw::SavePhase p) {
                      if (p == fw::SavePhase::write && w.rank() == 2) {
                        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                      }
                    }};
    pending.start(w.rank(), 3, flags, s);
    EXPECT_TRUE(pending.in_flight());
    const auto early = pending.poll(flags);
    polled[static_cast<std::size_t>(w.rank())] = early.has_value() ? 1 : 0;
    w.comm().barrier();
    EXPECT_TRUE(fw::committed_checkpoints(async_root).empty());  // not yet committed
    w.comm().barrier();
    release = true;
    const auto dir = pending.wait(flags);
    ASSERT_TRUE(dir.has_value());
    EXPECT_EQ(*dir, async_root / "step-00000007");
    EXPECT_FALSE(pending.in_flight());
    EXPECT_FALSE(pending.wait(flags).has_value());  // nothing in flight: no collective, nothing
  });
  EXPECT_EQ(polled, (std::vector<int>{0, 0, 0}));
  for (const char* f : {"index.json", "rank-00000.safetensors", "rank-00001.safetensors",
                        "rank-00002.safetensors"}) {
    EXPECT_EQ(file_text(async_root / "step-00000007" / f),
              file_text(sync_root / "step-00000007" / f))
        << f;
  }
  expect_reads_back(async_root / "step-00000007");
  EXPECT_FALSE(fs::exists(async_root / ".step-00000007.tmp"));
}

TEST(AsyncStateSave, ABackgroundWriteErrorOnOneRankIsRaisedOnEveryRankAndNothingIsCommitted) {
  const auto root = scratch("async_fail");
  std::vector<std::string> errors(3);
  fw::launch<fw::LocalWorld>(3, [&](fw::World<fw::LocalWorld>& w) {
    const auto flags = fw::flag_gather(w.ctx(), w.comm());
    const auto mine = pieces_of(w.rank(), 3);
    fw::AsyncStateSave pending;
    fill_snapshot(pending.snapshot(mine), mine);
    const auto training_thread = std::this_thread::get_id();
    fw::StateSave s{root, 9, kTensors, {}, 0, [&](fw::SavePhase p) {
                      if (p == fw::SavePhase::write && w.rank() == 1) {
                        EXPECT_NE(std::this_thread::get_id(), training_thread);  // background
                        throw std::runtime_error("No space left on device");
                      }
                    }};
    pending.start(w.rank(), 3, flags, s);
    errors[static_cast<std::size_t>(w.rank())] = error_of([&] { (void)pending.wait(flags); });
    EXPECT_FALSE(pending.in_flight());
  });
  for (int r = 0; r < 3; ++r) {
    const auto& e = errors[static_cast<std::size_t>(r)];
    EXPECT_NE(e.find("writing the state files of " + (root / "step-00000009").string() +
                     " failed on rank(s) 1"),
              std::string::npos)
        << r << ": " << e;
    EXPECT_NE(e.find("nothing was committed"), std::string::npos) << e;
  }
  EXPECT_NE(errors[1].find("No space left on device"), std::string::npos) << errors[1];
  EXPECT_TRUE(fw::committed_checkpoints(root).empty());
  EXPECT_FALSE(fs::exists(root / ".step-00000009.tmp"));
}

TEST(AsyncStateSave, OneSaveInFlightAndKeepPrunesOnlyAfterTheCommit) {
  const auto root = scratch("async_keep");
  fw::AsyncStateSave pending;
  const auto mine = pieces_of(0, 1);
  std::vector<std::string> seen;  // step : committed checkpoints when its prune phase began
  for (int step = 1; step <= 3; ++step) {
    // the previous save commits first (nothing the first time)
    EXPECT_EQ(pending.wait(solo()).has_value(), step > 1);
    fill_snapshot(pending.snapshot(mine), mine);
    fw::StateSave s{root, step, kTensors, {}, 1, [&, step](fw::SavePhase p) {
                      if (p != fw::SavePhase::prune) return;
                      seen.push_back(std::to_string(step) + ":" +
                                     std::to_string(fw::committed_checkpoints(root).size()));
                    }};
    pending.start(0, 1, solo(), s);
    // While a save is in flight its snapshot is being written: a new one is refused.
    const auto msg = error_of([&] { (void)pending.snapshot(mine); });
    EXPECT_NE(msg.find("still being written; wait() for it"), std::string::npos) << msg;
  }
  EXPECT_EQ(fw::committed_checkpoints(root), std::vector<fs::path>{root / "step-00000002"});
  ASSERT_TRUE(pending.wait(solo()).has_value());
  EXPECT_EQ(fw::committed_checkpoints(root), std::vector<fs::path>{root / "step-00000003"});
  // Before each prune, the new checkpoint was already committed next to the kept one.
  EXPECT_EQ(seen, (std::vector<std::string>{"1:1", "2:2", "3:2"}));
  expect_reads_back(root / "step-00000003");
}

#ifdef FOURWAY_CKPT_EXE
#include "support/program.hpp"

TEST(FourwayCkpt, InfoPrintsStepMetaTensorsAndChecksumsAndFailsOnACorruptFile) {
  const auto root = scratch("ckpt_info");
  const auto dir = save_solo(root, 12);
  const auto info = [&](const std::string& path) {
    return fw::test::run_program(FOURWAY_CKPT_EXE, "info '" + path + "'", "fourway_ckpt_test");
  };
  auto r = info(root.string());  // a root: the newest checkpoint under it
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint " + dir.string() + "\nstep 12, format version " +
                       std::to_string(fw::state_dir_format_version)),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("note                   solo"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 tensors, 103 elements (F32)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(10, 7)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checksums: ok"), std::string::npos) << r.out;
  {
    std::fstream f(dir / "rank-00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  r = info(dir.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("BAD"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("rank-00000.safetensors: CRC-32C"), std::string::npos) << r.err;
  r = info((root / "nothing").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("holds no committed checkpoint"), std::string::npos) << r.err;
  r = fw::test::run_program(FOURWAY_CKPT_EXE, "show x", "fourway_ckpt_test");
  EXPECT_EQ(r.status, 2);
}
#endif
