// Tests of include/fourway/train/tokenizer.hpp (and utf8.hpp, unicode_classes.hpp) against the
// references tools/make_bpe_golden.py wrote with Hugging Face `tokenizers` and `tiktoken`, which
// agreed on every case: tests/golden/bpe_tiny_v1/ (a 1024-merge byte-level BPE; docs/golden.md).
#include "fourway/train/tokenizer.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/program.hpp"

namespace fw = fourway;

namespace {

const std::filesystem::path dir = std::filesystem::path(FOURWAY_GOLDEN_DIR) / "bpe_tiny_v1";

std::filesystem::path scratch(const std::string& name) {
  return fw::test::scratch_path("fourway_tokenizer_test", name);
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  return out;
}

/// One line of reference.txt: `encode|ordinary NAME HEX : IDS`, `decode NAME IDS : HEX` or
/// `pieces NAME : HEX...` (texts hex-encoded).
struct Case {
  std::string kind, name, text;
  std::vector<std::int32_t> ids;
  std::vector<std::string> pieces;
};

std::vector<Case> reference(const std::string& kind) {
  std::ifstream in(dir / "reference.txt");
  std::vector<Case> cases;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    Case c;
    s >> c.kind >> c.name;
    if (c.kind != kind) continue;
    std::vector<std::string> left, right;
    bool after = false;
    for (std::string w; s >> w;) {
      if (w == ":") {
        after = true;
        continue;
      }
      (after ? right : left).push_back(w);
    }
    if (kind == "pieces") {
      for (const auto& w : right) c.pieces.push_back(unhex(w));
      for (const auto& p : c.pieces) c.text += p;
    } else {
      auto& id_words = kind == "decode" ? left : right;
      auto& hex_words = kind == "decode" ? right : left;
      for (const auto& w : id_words) c.ids.push_back(std::stoi(w));
      if (!hex_words.empty()) c.text = unhex(hex_words[0]);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

const fw::Tokenizer& from_json() {
  static const fw::Tokenizer t = fw::Tokenizer::from_tokenizer_json(dir / "tokenizer.json");
  return t;
}

const fw::Tokenizer& from_pair() {
  static const fw::Tokenizer t = fw::Tokenizer::from_files(dir / "vocab.json", dir / "merges.txt");
  return t;
}

/// Runs `f` and returns the message of the `E` it throws ("" and a failure if it throws none).
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace

TEST(Tokenizer, ReferenceHasEveryKindOfCase) {
  EXPECT_EQ(reference("encode").size(), 50u);
  EXPECT_EQ(reference("ordinary").size(), 50u);
  EXPECT_EQ(reference("pieces").size(), 50u);
  EXPECT_GT(reference("decode").size(), 400u);
}

TEST(Tokenizer, EncodeEqualsTokenizersAndTiktoken) {
  for (const auto* t : {&from_json(), &from_pair()}) {
    for (const auto& c : reference("encode")) EXPECT_EQ(t->encode(c.text), c.ids) << c.name;
  }
}

TEST(Tokenizer, EncodeOrdinaryTreatsSpecialTokensAsText) {
  int differ = 0;
  const auto ordinary = reference("ordinary");
  const auto special = reference("encode");
  for (std::size_t i = 0; i < ordinary.size(); ++i) {
    const auto& c = ordinary[i];
    for (const auto* t : {&from_json(), &from_pair()}) {
      EXPECT_EQ(t->encode_ordinary(c.text), c.ids) << c.name;
    }
    differ += c.ids != special[i].ids;
  }
  EXPECT_GE(differ, 5);  // the cases holding <|endoftext|>
}

TEST(Tokenizer, BothFileFormsReadTheSameTokenizer) {
  const auto& a = from_json();
  const auto& b = from_pair();
  ASSERT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.vocab_size(), 1281);
  EXPECT_EQ(a.merge_count(), 1024u);
  EXPECT_EQ(b.merge_count(), 1024u);
  for (std::int32_t id = 0; id < a.vocab_size(); ++id) {
    EXPECT_EQ(a.token_bytes(id), b.token_bytes(id)) << id;
  }
  EXPECT_EQ(a.special_id("<|endoftext|>"), 1280);
  EXPECT_EQ(b.special_id("<|endoftext|>"), 1280);
}

TEST(Tokenizer, MergesAsStringsInTokenizerJson) {
  // tokenizers before 0.20 (and GPT-2's published tokenizer.json) write each merge as "a b"
  std::ifstream vocab(dir / "vocab.json"), merges(dir / "merges.txt");
  std::stringstream v;
  v << vocab.rdbuf();
  std::string json = R"({"added_tokens":[{"id":1280,"content":"<|endoftext|>","special":true}],)"
                     R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false},)"
                     R"("model":{"type":"BPE","vocab":)" +
                     v.str() + R"(,"merges":[)";
  bool first = true;
  for (std::string line; std::getline(merges, line);) {
    if (line.rfind("#version", 0) == 0) continue;
    std::string quoted;
    for (char c : line)
      quoted += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    json += (first ? "\"" : ",\"") + quoted + "\"";
    first = false;
  }
  json += "]}}";
  const auto path = scratch("string_merges.json");
  write_file(path, json);
  const auto t = fw::Tokenizer::from_tokenizer_json(path);
  EXPECT_EQ(t.merge_count(), 1024u);
  for (const auto& c : reference("encode")) EXPECT_EQ(t.encode(c.text), c.ids) << c.name;
}

TEST(Tokenizer, LoadPrefersTokenizerJsonAndFallsBackToThePair) {
  EXPECT_EQ(fw::Tokenizer::load(dir).source(), (dir / "tokenizer.json").string());
  const auto pair = scratch("pair");
  std::filesystem::create_directories(pair);
  for (const char* f : {"vocab.json", "merges.txt"}) {
    std::filesystem::copy_file(dir / f, pair / f,
                               std::filesystem::copy_options::overwrite_existing);
  }
  const auto t = fw::Tokenizer::load(pair);
  EXPECT_NE(t.source().find("merges.txt"), std::string::npos);
  EXPECT_EQ(fw::Tokenizer::load(pair / "vocab.json").source(), t.source());
  const auto text = reference("encode").front();
  EXPECT_EQ(t.encode(text.text), text.ids);
}

TEST(Tokenizer, DecodeOfEncodeIsTheText) {
  for (const auto* t : {&from_json(), &from_pair()}) {
    for (const auto& c : reference("encode")) EXPECT_EQ(t->decode(t->encode(c.text)), c.text);
    for (const auto& c : reference("ordinary")) {
      EXPECT_EQ(t->decode(t->encode_ordinary(c.text)), c.text);
    }
  }
}

TEST(Tokenizer, DecodeOfLicenceTextsRoundTrips) {
  // every text Debian ships in common-licenses, through the whole pipeline
  const std::filesystem::path folder = "/usr/share/common-licenses";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) GTEST_SKIP() << folder << " is missing";
  std::size_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(folder)) {
    if (!e.is_regular_file() || e.is_symlink()) continue;
    const std::string text = fw::test::slurp(e.path());
    EXPECT_EQ(from_json().decode(from_json().encode(text)), text) << e.path();
    bytes += text.size();
  }
  EXPECT_GT(bytes, 0u);
}

TEST(Tokenizer, DecodeEqualsTokenizersOnPiecesOfCharacters) {
  int replaced = 0;
  for (const auto& c : reference("decode")) {
    EXPECT_EQ(from_json().decode(c.ids), c.text) << c.name;
    replaced += c.text.find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_GT(replaced, 50);  // tokens that start or end inside a character
}

TEST(Tokenizer, DecodeStreamJoinsToDecode) {
  // one token at a time, as a sampler prints them: every piece is whole characters and the
  // pieces joined are the reference decode (U+FFFD only where the ids end inside a character)
  for (const auto& c : reference("decode")) {
    fw::DecodeStream stream(from_json());
    std::string joined;
    for (const auto id : c.ids) {
      const std::string piece = stream.push(id);
      EXPECT_NO_THROW(fw::validate_utf8(piece)) << c.name;
      joined += piece;
    }
    joined += stream.finish();
    EXPECT_EQ(joined, c.text) << c.name;
  }
  const auto text = reference("encode").front();
  fw::DecodeStream stream(from_json());
  std::string joined;
  for (const auto id : text.ids) joined += stream.push(id);
  EXPECT_EQ(joined + stream.finish(), text.text);
}

TEST(Tokenizer, TokenBytesAreRawBytes) {
  const auto& t = from_json();
  EXPECT_EQ(t.token_bytes(1280), "<|endoftext|>");
  std::string all;
  const auto text = reference("encode").front();
  for (const auto id : text.ids) all += t.token_bytes(id);
  EXPECT_EQ(all, text.text);
  EXPECT_EQ(t.decode_bytes(text.ids), text.text);
}

TEST(Tokenizer, PreTokenizeEqualsGpt2sRegex) {
  // the pieces of Python's `regex` module, which GPT-2's encoder.py splits with: pieces that BPE
  // happens to encode alike (U+001F as space or not, with no merge of it) still differ here
  for (const auto& c : reference("pieces")) {
    const auto got = fw::Tokenizer::pre_tokenize(c.text);
    EXPECT_EQ(std::vector<std::string>(got.begin(), got.end()), c.pieces) << c.name;
  }
}

TEST(TokenizerErrors, InvalidUtf8NamesTheByteOffset) {
  struct Bad {
    std::string text;
    std::size_t offset;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {"ab\xFF"
       "cd",
       2, "0xFF cannot start"},
      {"ok \xE4\xB8", 3, "cut off by the end"},
      {"\xC0\xAF", 0, "0xC0 cannot start"},                       // overlong '/'
      {"12\xED\xA0\x80", 2, "0xA0 at byte 3 cannot continue"},    // a surrogate
      {"\xF4\x90\x80\x80", 0, "0x90 at byte 1 cannot continue"},  // past U+10FFFF
      {"a\x80", 1, "0x80 cannot start"},
      {"\xE0\x80\x80", 0, "0x80 at byte 1 cannot continue"},  // overlong
  };
  for (const auto& b : bad) {
    for (const bool special : {true, false}) {
      try {
        (void)(special ? from_json().encode(b.text) : from_json().encode_ordinary(b.text));
        ADD_FAILURE() << "no error for offset " << b.offset;
      } catch (const fw::TextError& e) {
        EXPECT_EQ(e.offset(), b.offset);
        const std::string what = e.what();
        EXPECT_NE(what.find("invalid UTF-8 at byte " + std::to_string(b.offset)), std::string::npos)
            << what;
        EXPECT_NE(what.find(b.says), std::string::npos) << what;
        EXPECT_NE(what.find("iconv"), std::string::npos) << what;
      }
    }
  }
}

TEST(TokenizerErrors, MissingFilesAreNamed) {
  const auto none = scratch("none");
  std::filesystem::create_directories(none);
  auto msg = error_of<fw::TokenizerFileError>([&] { (void)fw::Tokenizer::load(none); });
  EXPECT_NE(msg.find("holds no tokenizer: expected tokenizer.json, or vocab.json + merges.txt"),
            std::string::npos)
      << msg;
  msg = error_of<fw::TokenizerFileError>([&] { (void)fw::Tokenizer::load(none / "nope"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  const auto half = scratch("half");
  std::filesystem::create_directories(half);
  std::filesystem::copy_file(dir / "vocab.json", half / "vocab.json",
                             std::filesystem::copy_options::overwrite_existing);
  msg = error_of<fw::TokenizerFileError>([&] { (void)fw::Tokenizer::load(half); });
  EXPECT_NE(msg.find((half / "merges.txt").string() + " is missing"), std::string::npos) << msg;
  msg = error_of<fw::TokenizerFileError>(
      [&] { (void)fw::Tokenizer::from_files(half / "vocab.json", half / "merges.txt"); });
  EXPECT_NE(msg.find("expected a merges.txt"), std::string::npos) << msg;
  // a TokenizerFileError is a CheckpointError, as for every other file fourway reads
  EXPECT_THROW((void)fw::Tokenizer::from_tokenizer_json(none / "tokenizer.json"),
               fw::CheckpointError);
}

TEST(TokenizerErrors, MalformedFilesSayWhereAndWhat) {
  const std::string pre = R"({"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false},)";
  const std::string model = R"("model":{"type":"BPE","vocab":{"a":0},"merges":[]}})";
  struct Bad {
    std::string json, says;
  };
  const std::vector<Bad> bad = {
      {R"({"model":{"vocab":{"a":0)", "expected ',' or '}' at line 1, column 25"},
      {"{\n\"model\": [}", "expected an object at line 2, column 10"},
      {"not json", "expected an object at line 1, column 1"},
      {pre + R"("model":{"vocab":{"a":-3}}})", "integer -3 outside [0, 16777215]"},
      {pre + R"("model":{"vocab":{"a":1.5}}})", "expected an integer"},
      {pre + R"("normalizer":{"type":"NFC"},)" + model, "\"normalizer\" must be null"},
      {R"({"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":true},)" + model,
       "add_prefix_space must be false"},
      {R"({"pre_tokenizer":{"type":"Metaspace"},)" + model, "type \"Metaspace\" is not GPT-2's"},
      {pre + R"("model":{"type":"WordPiece"}})", "model type is not \"BPE\""},
      {pre + R"("model":{"dropout":0.1}})", "model.dropout must be null"},
      {pre + R"("model":{"byte_fallback":true}})", "model.byte_fallback must be false"},
      {pre + R"("model":{"merges":[["a","b","c"]]}})", "more than two tokens"},
      {pre + R"("model":{"merges":["ab"]}})", "\"ab\" is not two tokens"},
      {pre + R"("model":{"vocab":{"\u12"}}})", "invalid \\u escape"},
      {pre + R"("model":{"vocab":{"\ud800":1}}})", "high surrogate without its low half"},
      {pre + R"("model":{"vocab":{"\udc00":1}}})", "low surrogate without its high half"},
      {pre + R"("model":{"vocab":{"\q":1}}})", "invalid escape in a string"},
      {pre + "\"model\":{\"vocab\":{\"a\tb\":1}}}",
       "control character inside a string at line 1, column 84"},
      {pre + R"("model":{"vocab":{"abc)", "unterminated string"},
      {pre + R"("added_tokens":[{"id":5,"content":"<x>","lstrip":true}],)" + model,
       "\"lstrip\" is not supported"},
      {pre + R"("post_processor":{"type":"TemplateProcessing"},)" + model,
       "post_processor type \"TemplateProcessing\""},
      {pre + model + " x", "unexpected text after the JSON document"},
      {pre + R"("version":"1.0"})", "no \"model\" object"},
      {"{" + model, "no \"pre_tokenizer\" (GPT-2's is ByteLevel)"},
      {R"({"pre_tokenizer":null,)" + model, "\"pre_tokenizer\" must be a ByteLevel object"},
      {pre + model, "no token for byte 0x00; a byte-level BPE vocabulary has all 256"},
      {pre + R"("model":{"vocab":{"\u00e9t\u3000":0}}})", "is not spelled in GPT-2's byte-level"},
  };
  const auto path = scratch("bad_tokenizer.json");
  for (const auto& b : bad) {
    write_file(path, b.json);
    const auto msg =
        error_of<fw::TokenizerFileError>([&] { (void)fw::Tokenizer::from_tokenizer_json(path); });
    EXPECT_NE(msg.find(b.says), std::string::npos) << b.json << "\n" << msg;
    EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
  }
  write_file(path, "{\"model\":{\"vocab\":{\"\xFF\":0}}}");
  const auto msg =
      error_of<fw::TokenizerFileError>([&] { (void)fw::Tokenizer::from_tokenizer_json(path); });
  EXPECT_NE(msg.find("invalid UTF-8 at byte 20"), std::string::npos) << msg;
}

TEST(TokenizerErrors, MalformedMergesNameTheLine) {
  const auto folder = scratch("bad_merges");
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(dir / "vocab.json", folder / "vocab.json",
                             std::filesystem::copy_options::overwrite_existing);
  const auto merges = folder / "merges.txt";
  const auto load = [&] { (void)fw::Tokenizer::load(folder); };
  write_file(merges, "#version: 0.2\nĠ t\nĠt\n");
  auto msg = error_of<fw::TokenizerFileError>(load);
  EXPECT_NE(msg.find(merges.string() + " line 3: \"Ġt\" is not a merge"), std::string::npos) << msg;
  write_file(merges, "#version: 0.2\nĠ t\nq ≈\n");
  msg = error_of<fw::TokenizerFileError>(load);
  EXPECT_NE(msg.find("merge \"q ≈\" (" + merges.string() + " line 3) uses \"≈\", which is not in"),
            std::string::npos)
      << msg;
  write_file(merges, "#version: 0.2\nx y z\n");
  msg = error_of<fw::TokenizerFileError>(load);
  EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
}

TEST(TokenizerErrors, DecodeRefusesIdsItDoesNotHave) {
  const auto& t = from_json();
  for (const std::int32_t id : {-1, 1281, 1 << 20}) {
    std::vector<std::int32_t> ids = {5, id};
    const auto msg = error_of<fw::TokenIdError>([&] { (void)t.decode(ids); });
    EXPECT_NE(
        msg.find("token id " + std::to_string(id) + " is outside the tokenizer's ids 0..1280"),
        std::string::npos)
        << msg;
    EXPECT_THROW((void)t.token_bytes(id), fw::TokenIdError);
    fw::DecodeStream stream(t);
    EXPECT_THROW((void)stream.push(id), fw::TokenIdError);
  }
  // an id inside the range that no token has
  const auto path = scratch("gap.json");
  std::stringstream v;
  v << std::ifstream(dir / "vocab.json").rdbuf();
  std::string text = v.str();
  text.replace(text.rfind("1280}"), 5, "1300}");  // <|endoftext|> moved to 1300: 1280..1299 empty
  write_file(path, text);
  const auto g = fw::Tokenizer::from_files(path, dir / "merges.txt");
  EXPECT_EQ(g.vocab_size(), 1301);
  const auto msg = error_of<fw::TokenIdError>([&] { (void)g.token_bytes(1290); });
  EXPECT_NE(msg.find("no token has id 1290"), std::string::npos) << msg;
}
