// End-to-end tests of the fourway-data program (examples/data/fourway_data.cpp): it is run as
// users run it on texts whose token ids Hugging Face `tokenizers` and tiktoken gave
// (tests/golden/bpe_tiny_v1/reference.txt, tools/make_bpe_golden.py), and the llm.c files it
// writes are read back with fourway's TokenData reader.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fourway/train/token_data.hpp"
#include "support/program.hpp"

namespace fw = fourway;
namespace fs = std::filesystem;

namespace {

const std::string exe = FOURWAY_DATA_EXE;
const fs::path tokenizer_dir = fs::path(FOURWAY_GOLDEN_DIR) / "bpe_tiny_v1";
constexpr std::uint16_t eot = 1280;  // <|endoftext|> of bpe_tiny_v1

fs::path scratch(const std::string& name) {
  return fw::test::scratch_path("fourway_data_test", name);
}

fw::test::ProgramRun run(const std::string& args) {
  return fw::test::run_program(exe, args, "fourway_data_test");
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

/// The text and the reference ids of one `encode NAME HEX : IDS` line of reference.txt.
struct Encoded {
  std::string text;
  std::vector<std::uint16_t> ids;
};

Encoded reference(const std::string& name) {
  std::ifstream in(tokenizer_dir / "reference.txt");
  for (std::string line; std::getline(in, line);) {
    std::istringstream s(line);
    std::string kind, n, hex, colon;
    s >> kind >> n;
    if (kind != "encode" || n != name) continue;
    s >> hex >> colon;
    Encoded e;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
      e.text += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    }
    for (int id; s >> id;) e.ids.push_back(static_cast<std::uint16_t>(id));
    return e;
  }
  ADD_FAILURE() << "no reference case " << name;
  return {};
}

std::vector<std::uint16_t> tokens_of(const fs::path& file) {
  const auto d = fw::TokenData::read(file);
  return {d.tokens().begin(), d.tokens().end()};
}

/// Two documents (the multilingual text, the seeded jumble) in files a.txt, b.txt of a folder.
struct Corpus {
  fs::path folder, a, b;
  std::vector<std::uint16_t> stream;  // <|endoftext|> a <|endoftext|> b, reference ids
  std::vector<std::uint16_t> plain;   // a b
};

Corpus corpus() {
  Corpus c;
  c.folder = scratch("docs");
  fs::create_directories(c.folder);
  c.a = c.folder / "a.txt";
  c.b = c.folder / "b.txt";
  const auto ra = reference("text"), rb = reference("random");
  write_file(c.a, ra.text);
  write_file(c.b, rb.text);
  c.stream.push_back(eot);
  c.stream.insert(c.stream.end(), ra.ids.begin(), ra.ids.end());
  c.stream.push_back(eot);
  c.stream.insert(c.stream.end(), rb.ids.begin(), rb.ids.end());
  c.plain = ra.ids;
  c.plain.insert(c.plain.end(), rb.ids.begin(), rb.ids.end());
  return c;
}

std::vector<std::uint16_t> head(const std::vector<std::uint16_t>& v, std::size_t n) {
  return {v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n)};
}
std::vector<std::uint16_t> tail(const std::vector<std::uint16_t>& v, std::size_t n) {
  return {v.end() - static_cast<std::ptrdiff_t>(n), v.end()};
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST(FourwayData, SplitsTheTokensOfEveryFileIntoTrainAndValidation) {
  const auto c = corpus();
  const auto out = scratch("split/run");  // the folder does not exist yet
  const auto r = run("encode --tokenizer " + q(tokenizer_dir) + " --out " + q(out) +
                     " --val-fraction 0.25 " + q(c.a) + " " + q(c.b));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::size_t n = c.stream.size();
  const auto n_val = static_cast<std::size_t>(std::llround(0.25 * static_cast<double>(n)));
  const auto train = tokens_of(out.string() + "_train.bin");
  const auto val = tokens_of(out.string() + "_val.bin");
  EXPECT_EQ(train, head(c.stream, n - n_val));
  EXPECT_EQ(val, tail(c.stream, n_val));
  EXPECT_NE(
      r.out.find("read 2 files, " +
                 std::to_string(reference("text").text.size() + reference("random").text.size()) +
                 " bytes: " + std::to_string(n) + " tokens"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find("wrote " + out.string() + "_train.bin: " + std::to_string(n - n_val) + " tokens"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("_val.bin: " + std::to_string(n_val) + " tokens (the last 25.0%"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("<|endoftext|> (1280) before each file"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("next: fourway-train --data " + out.string() + "_train.bin --vocab 1281"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(FourwayData, AFolderIsItsFilesInNameOrder) {
  const auto c = corpus();
  const auto out = scratch("folder");
  const auto r = run("encode --tokenizer " + q(tokenizer_dir) + " --out " + q(out) +
                     " --val-tokens 10 " + q(c.folder));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(tokens_of(out.string() + "_train.bin"), head(c.stream, c.stream.size() - 10));
  EXPECT_EQ(tokens_of(out.string() + "_val.bin"), tail(c.stream, 10));
}

TEST(FourwayData, VocabAndMergesGiveTheSameFiles) {
  const auto c = corpus();
  const auto pair = scratch("pair");
  fs::create_directories(pair);
  for (const char* f : {"vocab.json", "merges.txt"}) {
    fs::copy_file(tokenizer_dir / f, pair / f, fs::copy_options::overwrite_existing);
  }
  const auto out = scratch("pair_out");
  const auto r = run("encode --tokenizer " + q(pair) + " --out " + q(out) + " --val-fraction 0 " +
                     q(c.a) + " " + q(c.b));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(tokens_of(out.string() + "_train.bin"), c.stream);
  EXPECT_FALSE(fs::exists(out.string() + "_val.bin"));
  EXPECT_NE(r.out.find("no validation file (--val-fraction 0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("merges.txt"), std::string::npos) << r.out;
}

TEST(FourwayData, NoEotConcatenatesTheDocuments) {
  const auto c = corpus();
  const auto out = scratch("no_eot");
  const auto r = run("encode --no-eot --tokenizer " + q(tokenizer_dir) + " --out " + q(out) +
                     " --val-tokens 0 " + q(c.a) + " " + q(c.b));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(tokens_of(out.string() + "_train.bin"), c.plain);
  EXPECT_EQ(r.out.find("before each file"), std::string::npos) << r.out;
}

// --tokenizer bytes: every byte its own id (the built-in corpus's encoding), any bytes, no
// <|endoftext|>; the next line names the validation file for fourway-train.
TEST(FourwayData, ByteIdsAreTheBytes) {
  const auto a = scratch("bytes_a.bin"), b = scratch("bytes_b.bin");
  std::string raw = "caf\xc3\xa9 ";
  raw += std::string("\xff\x00\x80 not UTF-8", 13);
  write_file(a, raw);
  write_file(b, "fourway");
  const auto out = scratch("bytes");
  const auto r =
      run("encode --tokenizer bytes --out " + q(out) + " --val-tokens 3 " + q(a) + " " + q(b));
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::uint16_t> want;
  for (const char ch : raw + "fourway") want.push_back(static_cast<unsigned char>(ch));
  EXPECT_EQ(tokens_of(out.string() + "_train.bin"), head(want, want.size() - 3));
  EXPECT_EQ(tokens_of(out.string() + "_val.bin"), tail(want, 3));
  EXPECT_NE(r.out.find("byte ids: 256 ids"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--vocab 256 --val-data " + out.string() + "_val.bin"), std::string::npos)
      << r.out;
}

TEST(FourwayData, HelpAndUsage) {
  auto r = run("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--val-fraction F"), std::string::npos) << r.out;
  r = run("");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("usage: fourway-data encode"), std::string::npos) << r.err;
  r = run("encode --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--tokenizer DIR"), std::string::npos) << r.out;
}

TEST(FourwayData, BadInputIsOneLineAndExitStatusOne) {
  const auto c = corpus();
  const auto bad_utf8 = scratch("latin1.txt");
  write_file(bad_utf8, "caf\xE9 au lait\n");  // Latin-1, not UTF-8
  const auto empty = scratch("empty.txt");
  write_file(empty, "");
  const auto no_tokenizer = scratch("no_tokenizer");
  fs::create_directories(no_tokenizer);
  const auto half = scratch("half_tokenizer");
  fs::create_directories(half);
  fs::copy_file(tokenizer_dir / "vocab.json", half / "vocab.json",
                fs::copy_options::overwrite_existing);
  const auto a_file = scratch("plain_file");
  write_file(a_file, "x");
  const auto taken = scratch("taken");
  fs::create_directories(taken.string() + "_train.bin");  // a folder where the file would go
  const auto tiny = scratch("tiny.txt");
  write_file(tiny, "Hi");
  const std::string tok = " --tokenizer " + q(tokenizer_dir);
  const std::string out = " --out " + q(scratch("bad_out"));
  struct Bad {
    std::string args, says;
  };
  const std::vector<Bad> bad = {
      {"encode" + tok + out + " " + q(bad_utf8),
       bad_utf8.string() + ": invalid UTF-8 at byte 3: 0x20 at byte 4 cannot continue the "
                           "character starting with 0xE9"},
      {"encode" + tok + out + " " + q(c.a) + " " + q(empty), empty.string() + " is empty"},
      {"encode --tokenizer " + q(no_tokenizer) + out + " " + q(c.a),
       "holds no tokenizer: expected tokenizer.json, or vocab.json + merges.txt"},
      {"encode --tokenizer " + q(half) + out + " " + q(c.a),
       (half / "merges.txt").string() + " is missing"},
      {"encode" + tok + out + " " + q(scratch("absent.txt")), "does not exist"},
      {"encode" + tok + " --out " + q(a_file / "sub" / "x") + " " + q(c.a),
       "cannot create the folder " + (a_file / "sub").string() + " of --out"},
      {"encode" + tok + " --out " + q(taken) + " " + q(c.a),
       "cannot create " + taken.string() +
           "_train.bin (a folder has that name); choose a "
           "writable --out"},
      {"encode" + tok + out + " " + q(tiny), "too few for a validation split of 0.1"},
      {"encode" + tok + out + " --val-tokens 100000 " + q(tiny), "leaves none for training"},
  };
  for (const auto& b : bad) {
    const auto r = run(b.args);
    EXPECT_EQ(r.status, 1) << b.args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.rfind("fourway-data: fourway: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << b.args << "\n" << r.err;
  }
}

TEST(FourwayData, BadUsageIsExitStatusTwo) {
  const auto c = corpus();
  const std::string tok = " --tokenizer " + q(tokenizer_dir) + " --out " + q(scratch("u"));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"decode" + tok, "usage: fourway-data encode"},
      {"encode" + tok, "no text to encode"},
      {"encode --out x " + q(c.a), "--tokenizer DIR is required"},
      {"encode" + tok + " --val-fraction 0.1 --val-tokens 5 " + q(c.a), "give one"},
      {"encode" + tok + " --val-fraction 1 " + q(c.a), "--val-fraction 1 must be in [0, 1)"},
      {"encode" + tok + " --val-fracton 0.2 " + q(c.a), "did you mean --val-fraction?"},
  };
  for (const auto& [args, says] : bad) {
    const auto r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << args << "\n" << r.err;
  }
}
