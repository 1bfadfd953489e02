//! The built-in default corpus: real English text as byte-level tokens (vocabulary 256).
//!
//! No download: at run time it reads the license texts every Debian/Ubuntu system ships in
//! `/usr/share/common-licenses/` (regular files only, symbolic links skipped, in name order;
//! about 250 KB, so ~250k tokens). Where that folder is missing or empty it falls back to a short
//! text embedded here. Token i is byte i of the text, so any model with vocab >= 256 can train
//! on it and its loss is directly comparable to bits per byte (loss / ln 2).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "fourway/train/token_data.hpp"

namespace fourway {

inline constexpr std::int64_t corpus_vocab = 256;

namespace detail {
inline constexpr std::string_view embedded_corpus_text =
    "A model too large for one device has to be split, and there are only a few ways to split "
    "it. The simplest keeps a whole copy of the model on every device and gives each copy a "
    "different slice of the batch; after the backward pass the gradients are summed across the "
    "copies so that every copy takes the same step. This is data parallelism, and it is the "
    "first thing to try, because it changes nothing about the mathematics of a step.\n\n"
    "When the copies themselves no longer fit, the optimizer state is the first thing to "
    "divide. Adam keeps two moments per parameter, and mixed precision keeps an extra copy of "
    "the weights in single precision, so the state is several times larger than the weights. "
    "Each device can own one shard of that state and update only its shard; then the "
    "gradients, and finally the weights themselves, can be sharded in the same way, gathered "
    "just before a layer needs them and released just after.\n\n"
    "Tensor parallelism cuts each matrix multiplication into columns and rows, so the devices "
    "of one node share every layer, and a pipeline gives each group of devices a run of "
    "consecutive layers and streams micro-batches through them. Each of these costs "
    "communication, and the art is to pay for it where the links are fast: inside a node for "
    "the tensor splits, between nodes for the pipeline and the data copies.\n\n"
    "Whatever the split, the loss of a step must not change. A training run that is split "
    "eight ways should follow the same curve as the run on one device, step after step, and "
    "the only honest way to know that it does is to run both and compare the numbers.\n";

inline std::vector<std::uint16_t> bytes_to_tokens(std::string_view s) {
  std::vector<std::uint16_t> t(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) t[i] = static_cast<unsigned char>(s[i]);
  return t;
}
}  // namespace detail

/// The embedded fallback text as tokens.
inline TokenData embedded_corpus() {
  return TokenData(detail::bytes_to_tokens(detail::embedded_corpus_text),
                   "<built-in corpus: embedded text>");
}

/// The default corpus: the texts under `dir` (regular files, name order), else the embedded one.
inline TokenData builtin_corpus(const std::filesystem::path& dir = "/usr/share/common-licenses") {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(dir, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    try {
      const auto bytes = detail::read_whole_file(f, "corpus file");
      text.append(bytes.begin(), bytes.end());
      text += "\n\n";
    } catch (const CheckpointError&) {
      // an unreadable file is skipped; the corpus is whatever can be read
    }
  }
  if (text.size() < 2 * detail::embedded_corpus_text.size()) return embedded_corpus();
  return TokenData(detail::bytes_to_tokens(text), "<built-in corpus: " + dir.string() + ", " +
                                                      std::to_string(files.size()) + " files>");
}

}  // namespace fourway
