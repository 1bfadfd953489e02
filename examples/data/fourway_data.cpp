// fourway-data: from UTF-8 text to llm.c token files, through GPT-2's byte-level BPE, without
// Python.
//
//   fourway-data encode --tokenizer DIR --out PREFIX [--val-fraction F | --val-tokens N]
//                       [--no-eot] TEXT...
//
// TEXT: a text file, or a folder (its regular files in name order, symbolic links skipped).
// Each file is one document: encoded with the tokenizer of DIR (tokenizer.json, else vocab.json +
// merges.txt; `<|endoftext|>` in the text is the special token) and preceded by `<|endoftext|>`
// when the tokenizer has it, as llm.c's data scripts delimit documents (--no-eot: not). The
// token stream of all files, in order, is split on a token boundary: the last F of the tokens
// (rounded to the nearest token; --val-tokens: the last N) go to PREFIX_val.bin, the rest to
// PREFIX_train.bin, both in llm.c's format (include/fourway/train/token_data.hpp).
// `--tokenizer bytes` encodes each byte as its own id (vocabulary 256, no `<|endoftext|>`, any
// bytes accepted): the built-in corpus's encoding, for a character-level model.
// Exit status: 0 written; 1 bad input (text that is not UTF-8, an empty or missing text, a
// missing or malformed tokenizer, an output that cannot be written), one line on stderr; 2 bad
// usage. See docs/train.md, "From text to a run".
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/tools/cli.hpp"
#include "fourway/train/token_data.hpp"
#include "fourway/train/tokenizer.hpp"

namespace fw = fourway;
namespace fs = std::filesystem;

namespace {

constexpr const char* usage =
    "usage: fourway-data encode --tokenizer DIR --out PREFIX [--val-fraction F | --val-tokens N] "
    "[--no-eot] TEXT...";

struct Options {
  std::string tokenizer, out;
  double val_fraction = 0.1;
  std::int64_t val_tokens = 0;
  bool no_eot = false;
  std::vector<std::string> texts;
};

fw::tools::ArgParser make_parser(Options& o) {
  fw::tools::ArgParser p(
      "fourway-data encode",
      "then TEXT...: UTF-8 text files, or folders of them (their regular files in name "
      "order). Writes llm.c token files PREFIX_train.bin and PREFIX_val.bin, "
      "encoded with a GPT-2 byte-level BPE tokenizer (docs/train.md).");
  p.add("tokenizer", &o.tokenizer, "DIR",
        "Hugging Face's tokenizer files: a folder with tokenizer.json or vocab.json + merges.txt "
        "(the word bytes: byte ids 0-255, the built-in corpus's encoding)")
      .add("out", &o.out, "PREFIX", "write PREFIX_train.bin and PREFIX_val.bin")
      .add("val-fraction", &o.val_fraction, "F",
           "the last F of the tokens go to PREFIX_val.bin (0: no validation file)")
      .add("val-tokens", &o.val_tokens, "N", "the last N tokens go to PREFIX_val.bin instead")
      .add_switch("no-eot", &o.no_eot, "no <|endoftext|> before each file");
  return p;
}

/// Parses argv[2..]: flags (through the parser) first or mixed with the TEXT arguments, which are
/// every word that is neither a flag nor a flag's value.
bool parse(int argc, char** argv, Options& o, fw::tools::ArgParser& p) {
  std::vector<const char*> flags = {"fourway-data encode"};
  for (int i = 2; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.substr(0, 2) != "--" && a != "-h") {
      o.texts.emplace_back(a);
      continue;
    }
    flags.push_back(argv[i]);
    const bool takes_value =
        a != "--no-eot" && a != "--help" && a != "-h" && a.find('=') == std::string_view::npos;
    if (takes_value && i + 1 < argc) flags.push_back(argv[++i]);
  }
  if (!p.parse(static_cast<int>(flags.size()), flags.data())) return false;
  fw::check<fw::ConfigError>(!o.tokenizer.empty(), "fourway: --tokenizer DIR is required (", usage,
                             ")");
  fw::check<fw::ConfigError>(!o.out.empty(), "fourway: --out PREFIX is required (", usage, ")");
  fw::check<fw::ConfigError>(!o.texts.empty(),
                             "fourway: no text to encode: name text files or "
                             "folders after the flags (",
                             usage, ")");
  fw::check<fw::ConfigError>(!(p.given("val-fraction") && p.given("val-tokens")),
                             "fourway: --val-fraction and --val-tokens both choose the validation "
                             "split; give one");
  fw::check<fw::ConfigError>(o.val_fraction >= 0 && o.val_fraction < 1, "fourway: --val-fraction ",
                             o.val_fraction, " must be in [0, 1)");
  fw::check<fw::ConfigError>(o.val_tokens >= 0, "fourway: --val-tokens ", o.val_tokens,
                             " must be >= 0");
  if (!p.given("val-tokens")) o.val_tokens = -1;  // the fraction decides
  return true;
}

/// The files TEXT names: itself, or a folder's regular files in name order.
std::vector<fs::path> text_files(const std::vector<std::string>& texts) {
  std::vector<fs::path> files;
  for (const auto& t : texts) {
    std::error_code ec;
    if (fs::is_directory(t, ec)) {
      std::vector<fs::path> inside;
      for (const auto& e : fs::directory_iterator(t, ec)) {
        if (e.is_regular_file() && !e.is_symlink()) inside.push_back(e.path());
      }
      std::sort(inside.begin(), inside.end());
      fw::check<fw::ConfigError>(!inside.empty(), "fourway: folder ", t,
                                 " holds no regular file to encode");
      files.insert(files.end(), inside.begin(), inside.end());
    } else {
      fw::check<fw::ConfigError>(fs::is_regular_file(t, ec), "fourway: text ", t,
                                 " does not exist (no such file or folder)");
      files.emplace_back(t);
    }
  }
  return files;
}

std::string read_text(const fs::path& file, bool utf8) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  fw::check<fw::ConfigError>(in.good() || in.eof(), "fourway: cannot read ", file.string());
  std::string text = std::move(s).str();
  fw::check<fw::ConfigError>(!text.empty(), "fourway: ", file.string(),
                             " is empty: there is no text to encode; leave it out");
  if (utf8) fw::validate_utf8(text, file.string());
  return text;
}

void write_tokens(const fs::path& path, std::span<const std::uint16_t> tokens) {
  try {
    fw::TokenData::write(path, tokens);
  } catch (const fw::CheckpointError& e) {
    std::error_code ec;
    const bool folder = fs::is_directory(path, ec);
    throw fw::CheckpointError(fw::detail::cat(e.what(), folder ? " (a folder has that name)" : "",
                                              "; choose a writable --out"));
  }
}

int encode(const Options& o) {
  const bool byte_ids = o.tokenizer == "bytes";
  std::optional<fw::Tokenizer> tokenizer;
  if (!byte_ids) tokenizer = fw::Tokenizer::load(o.tokenizer);
  const int vocab = byte_ids ? 256 : tokenizer->vocab_size();
  if (!byte_ids) {
    fw::check<fw::ConfigError>(vocab <= 65536, "fourway: the tokenizer ", tokenizer->source(),
                               " has ", vocab,
                               " ids; llm.c token files hold uint16 ids (at most 65536)");
  }
  const std::int32_t eot = o.no_eot || byte_ids ? -1 : tokenizer->special_id("<|endoftext|>");
  const auto files = text_files(o.texts);
  std::vector<std::uint16_t> tokens;
  std::uint64_t bytes = 0;
  for (const auto& f : files) {
    const std::string text = read_text(f, !byte_ids);
    bytes += text.size();
    if (eot >= 0) tokens.push_back(static_cast<std::uint16_t>(eot));
    if (byte_ids) {
      for (const char c : text) tokens.push_back(static_cast<unsigned char>(c));
    } else {
      for (const auto id : tokenizer->encode(text))
        tokens.push_back(static_cast<std::uint16_t>(id));
    }
  }
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t n_val =
      o.val_tokens >= 0 ? o.val_tokens : std::llround(o.val_fraction * static_cast<double>(n));
  fw::check<fw::ConfigError>(n_val < n, "fourway: the text has ", n, " tokens; a validation split ",
                             "of ", n_val,
                             " leaves none for training: lower --val-tokens or "
                             "--val-fraction, or give more text");
  fw::check<fw::ConfigError>(n_val > 0 || o.val_tokens == 0 || o.val_fraction == 0,
                             "fourway: the text has ", n,
                             " tokens, too few for a validation "
                             "split of ",
                             o.val_fraction,
                             ": give more text, a larger "
                             "--val-fraction or --val-fraction 0 (no validation file)");
  const fs::path prefix = o.out;
  if (prefix.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(prefix.parent_path(), ec);
    fw::check<fw::CheckpointError>(!ec, "fourway: cannot create the folder ",
                                   prefix.parent_path().string(), " of --out: ", ec.message(),
                                   "; choose a writable --out");
  }
  const auto split = static_cast<std::size_t>(n - n_val);
  const fs::path train = prefix.string() + "_train.bin", val = prefix.string() + "_val.bin";
  write_tokens(train, std::span(tokens).first(split));
  if (n_val > 0) write_tokens(val, std::span(tokens).subspan(split));

  if (byte_ids) {
    std::printf("fourway-data: byte ids: 256 ids, one per byte");
  } else {
    std::printf("fourway-data: tokenizer %s: %d ids, %zu merges", tokenizer->source().c_str(),
                vocab, tokenizer->merge_count());
  }
  if (eot >= 0) std::printf("; <|endoftext|> (%d) before each file", eot);
  std::printf("\nread %zu file%s, %llu bytes: %lld tokens\n", files.size(),
              files.size() == 1 ? "" : "s", static_cast<unsigned long long>(bytes),
              static_cast<long long>(n));
  std::printf("wrote %s: %zu tokens\n", train.string().c_str(), split);
  if (n_val > 0) {
    std::printf("wrote %s: %lld tokens (the last %.1f%% of the tokens)\n", val.string().c_str(),
                static_cast<long long>(n_val),
                100.0 * static_cast<double>(n_val) / static_cast<double>(n));
  } else {
    std::printf("no validation file (--val-%s 0)\n", o.val_tokens == 0 ? "tokens" : "fraction");
  }
  std::printf("next: fourway-train --data %s --vocab %d%s\n", train.string().c_str(), vocab,
              n_val > 0 ? (" --val-data " + val.string()).c_str() : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    Options o;
    std::fputs(make_parser(o).help().c_str(), stdout);
    return 0;
  }
  if (argc < 2 || std::strcmp(argv[1], "encode") != 0) {
    std::fprintf(stderr, "fourway-data: %s\n", usage);
    return 2;
  }
  Options o;
  auto parser = make_parser(o);
  try {
    if (!parse(argc, argv, o, parser)) {
      std::fputs(parser.help().c_str(), stdout);
      return 0;
    }
  } catch (const fw::Error& e) {
    std::fprintf(stderr, "fourway-data: %s\n", e.what());
    return 2;
  }
  try {
    return encode(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fourway-data: %s\n", e.what());
  }
  return 1;
}
