//! A distributed training checkpoint: one directory, committed atomically, holding per-rank
//! safetensors files of local slices and an index that describes every tensor globally.
//!
//!   ROOT/step-00000120/              a committed checkpoint (the directory rename is the commit)
//!     index.json                     written last, by rank 0; without it there is no checkpoint
//!     rank-00003.safetensors         rank 3's slices, one 1-D F32 entry "<tensor>@<first>" each
//!   ROOT/.step-00000120.tmp/         a save in progress: never read, removed by the next save
//!
//! The index records the format version, the step, free-form metadata (mesh, precision, Adam's
//! step, the loss scaler, the data position, ...), every tensor's global shape and dtype, and
//! for every file its size, its CRC-32C and the slices it holds, each with its own CRC-32C. A
//! slice is `rows` runs of `count` elements of the flattened tensor, run i starting at element
//! first + i·stride (rows = 1: one contiguous run, what data parallelism and ZeRO write; more: a
//! box, e.g. a tensor-parallel column slice of a matrix). Nothing in it depends on the mesh that
//! wrote it, so a checkpoint loads onto any mesh: a rank asks for element ranges of global
//! tensors and reads only the slices that overlap them (`StateDir::read`), verifying each
//! slice's checksum the first time it touches it.
//!
//! Saving is a collective of the ranks that hold state (`save_state_dir`); after each phase the
//! ranks agree on success (`FlagGather`), so a failure anywhere is a `CheckpointError` on every
//! rank that names the failed ranks, never a hang:
//!
//!   create   rank 0 removes stale ROOT/.*.tmp directories and creates TMP
//!   write    every rank writes its file in TMP, fsyncs it, then a one-line-per-slice manifest
//!   index    rank 0 reads the manifests, writes TMP/index.json, fsyncs it and TMP
//!   commit   rank 0 renames TMP to ROOT/step-N and fsyncs ROOT
//!   prune    rank 0 removes committed checkpoints beyond the newest `keep` (oldest first)
//!
//! A process that dies in any phase leaves only a hidden TMP directory; the previous checkpoint
//! is never modified. A bit flipped in a file is refused naming the file and the tensor; a
//! truncated file naming the file.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fourway/checkpoint/crc32c.hpp"
#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/checkpoint/sharded_io.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/shape.hpp"

namespace fourway {

/// Version 2 added strided slices (`rows` > 1); version 1 indexes are read as well.
inline constexpr int state_dir_format_version = 2;

/// One slice of a global tensor held by one file: `rows` runs of `count` elements, run i at
/// element first + i·stride of the flattened tensor, stored one after the other.
struct StateSlice {
  std::string tensor;
  std::int64_t first = 0;   // element offset in the flattened global tensor
  std::int64_t count = 0;   // elements per run
  std::uint32_t crc = 0;    // CRC-32C of the slice's bytes
  std::int64_t stride = 0;  // between runs (rows > 1 only)
  std::int64_t rows = 1;
  [[nodiscard]] std::string entry_name() const { return tensor + "@" + std::to_string(first); }
  [[nodiscard]] std::int64_t values() const { return count * rows; }
  [[nodiscard]] std::int64_t run_first(std::int64_t i) const { return first + i * stride; }
};

struct StateFile {
  std::string name;  // relative to the checkpoint directory
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;  // of the whole file
  std::vector<StateSlice> slices;
};

/// A tensor as the model knows it, whatever the mesh (values are stored as F32).
struct StateTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

struct StateIndex {
  int version = state_dir_format_version;
  std::int64_t step = 0;
  std::map<std::string, std::string> meta;
  std::vector<StateTensor> tensors;
  std::vector<StateFile> files;

  [[nodiscard]] const StateTensor* tensor(std::string_view name) const {
    for (const auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  [[nodiscard]] std::uint64_t total_bytes() const {
    std::uint64_t n = 0;
    for (const auto& f : files) n += f.bytes;
    return n;
  }
};

/// The phases of a save, for the fault-injection hook of tests (`StateSave::at_phase`).
enum class SavePhase : std::uint8_t { create, write, index, commit, prune };

constexpr std::string_view save_phase_name(SavePhase p) {
  switch (p) {
    case SavePhase::create: return "create";
    case SavePhase::write: return "write";
    case SavePhase::index: return "index";
    case SavePhase::commit: return "commit";
    case SavePhase::prune: return "prune";
  }
  return "?";
}

namespace detail {

inline constexpr std::string_view nothing_committed =
    "; nothing was committed and earlier checkpoints are untouched";

inline std::string hex32(std::uint32_t v) {
  char buf[11];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

inline std::uint32_t parse_hex32(std::string_view s, std::string_view what) {
  check<CheckpointError>(s.size() == 10 && s[0] == '0' && s[1] == 'x', "fourway: ", what,
                         ": checksum \"", s, "\" is not 0x followed by 8 hex digits");
  std::uint32_t v = 0;
  for (char c : s.substr(2)) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    check<CheckpointError>(d >= 0, "fourway: ", what, ": checksum \"", s, "\" is not hex");
    v = (v << 4) | static_cast<std::uint32_t>(d);
  }
  return v;
}

inline std::string step_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

inline std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

/// fsync of a file or directory by path.
inline bool fsync_path(const std::filesystem::path& p, bool directory) {
  const int fd = ::open(p.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  (void)::close(fd);
  return ok;
}

/// CRC-32C of a whole file, read in 1 MiB pieces.
inline std::uint32_t file_crc32c(const std::filesystem::path& p, std::uint64_t* size = nullptr) {
  std::ifstream in(p, std::ios::binary);
  check<CheckpointError>(in.good(), "fourway: cannot open ", p.string(), " to checksum it");
  std::vector<char> buf(1 << 20);
  Crc32c crc;
  std::uint64_t n = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    crc.update(buf.data(), got);
    n += got;
  }
  if (size) *size = n;
  return crc.value();
}

inline std::int64_t json_int(const StJson::Value& v, std::string_view what) {
  check<CheckpointError>(v.kind == detail::StJson::Kind::number, "fourway: ", what,
                         " is not a number");
  const auto u = parse_u64(v.str);
  check<CheckpointError>(u.has_value() && *u <= (1ULL << 62), "fourway: ", what, " = ", v.str,
                         " is not a non-negative integer");
  return static_cast<std::int64_t>(*u);
}

inline const StJson::Value& json_member(const StJson::Value& o, std::string_view key,
                                        std::string_view what) {
  check<CheckpointError>(o.kind == detail::StJson::Kind::object, "fourway: ", what,
                         " is not an object");
  for (std::size_t i = 0; i < o.keys.size(); ++i) {
    if (o.keys[i] == key) return o.values[i];
  }
  throw CheckpointError(cat("fourway: ", what, " has no \"", key, "\""));
}

inline const std::string& json_string(const StJson::Value& v, std::string_view what) {
  check<CheckpointError>(v.kind == detail::StJson::Kind::string, "fourway: ", what,
                         " is not a string");
  return v.str;
}

}  // namespace detail

/// The index as JSON (one line per file, sorted keys where the format has a choice).
inline std::string to_json(const StateIndex& x) {
  std::string j = "{\"format\":\"fourway-state\",\"version\":" + std::to_string(x.version) +
                  ",\"step\":" + std::to_string(x.step) + ",\n\"meta\":{";
  bool first = true;
  for (const auto& [k, v] : x.meta) {
    j += first ? "" : ",";
    first = false;
    detail::json_escape(j, k);
    j += ':';
    detail::json_escape(j, v);
  }
  j += "},\n\"tensors\":{";
  first = true;
  for (const auto& t : x.tensors) {
    j += first ? "\n" : ",\n";
    first = false;
    detail::json_escape(j, t.name);
    j += ":{\"dtype\":\"F32\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i) j += ',';
      j += std::to_string(t.shape[i]);
    }
    j += "]}";
  }
  j += "},\n\"files\":{";
  first = true;
  for (const auto& f : x.files) {
    j += first ? "\n" : ",\n";
    first = false;
    detail::json_escape(j, f.name);
    j += detail::cat(":{\"bytes\":", f.bytes, ",\"crc32c\":\"", detail::hex32(f.crc),
                     "\",\"slices\":[");
    for (std::size_t i = 0; i < f.slices.size(); ++i) {
      const auto& s = f.slices[i];
      j += i ? "," : "";
      j += "[";
      detail::json_escape(j, s.tensor);
      j += detail::cat(",", s.first, ",", s.count, ",\"", detail::hex32(s.crc), "\"");
      if (s.rows > 1) j += detail::cat(",", s.stride, ",", s.rows);
      j += "]";
    }
    j += "]}";
  }
  j += "}}\n";
  return j;
}

/// Parses and validates an index: every slice lies inside its tensor, and over all files the
/// slices of each tensor cover it exactly once (so a load can never read a hole or two values).
/// A slice is [tensor, first, count, crc32c] or, strided, [tensor, first, count, crc32c,
/// stride, rows].
inline StateIndex parse_state_index(std::string_view text, const std::string& source) {
  using detail::json_int;
  using detail::json_member;
  using detail::json_string;
  // A file holds one slice per (parameter, part) it owns: far more than a safetensors shape.
  const auto doc = detail::StJson(text, source, 8, std::size_t{1} << 24).parse_document();
  StateIndex x;
  check<CheckpointError>(
      json_string(json_member(doc, "format", source), source + ": format") == "fourway-state",
      "fourway: ", source, " is not a fourway state index");
  x.version = static_cast<int>(json_int(json_member(doc, "version", source), "version"));
  check<CheckpointError>(x.version >= 1 && x.version <= state_dir_format_version,
                         "fourway: ", source, " has format version ", x.version,
                         "; this build reads versions 1 to ", state_dir_format_version);
  x.step = json_int(json_member(doc, "step", source), "step");
  const auto& meta = json_member(doc, "meta", source);
  for (std::size_t i = 0; i < meta.keys.size(); ++i) {
    x.meta[meta.keys[i]] = json_string(meta.values[i], source + ": meta." + meta.keys[i]);
  }
  const auto& tensors = json_member(doc, "tensors", source);
  check<CheckpointError>(tensors.kind == detail::StJson::Kind::object, "fourway: ", source,
                         ": tensors is not an object");
  for (std::size_t i = 0; i < tensors.keys.size(); ++i) {
    const std::string what = source + ": tensor " + tensors.keys[i];
    StateTensor t{tensors.keys[i], {}};
    check<CheckpointError>(
        json_string(json_member(tensors.values[i], "dtype", what), what) == "F32",
        "fourway: ", what, ": only F32 state tensors are written");
    for (const auto& d : json_member(tensors.values[i], "shape", what).items) {
      t.shape.push_back(json_int(d, what + " shape"));
    }
    check<CheckpointError>(x.tensor(t.name) == nullptr, "fourway: ", what, " appears twice");
    x.tensors.push_back(std::move(t));
  }
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> cover;
  const auto& files = json_member(doc, "files", source);
  check<CheckpointError>(files.kind == detail::StJson::Kind::object, "fourway: ", source,
                         ": files is not an object");
  for (std::size_t i = 0; i < files.keys.size(); ++i) {
    const std::string what = source + ": file " + files.keys[i];
    check<CheckpointError>(files.keys[i].find('/') == std::string::npos &&
                               files.keys[i].find("..") == std::string::npos,
                           "fourway: ", what, ": a file name may not leave the directory");
    StateFile f;
    f.name = files.keys[i];
    f.bytes =
        static_cast<std::uint64_t>(json_int(json_member(files.values[i], "bytes", what), what));
    f.crc =
        detail::parse_hex32(json_string(json_member(files.values[i], "crc32c", what), what), what);
    for (const auto& s : json_member(files.values[i], "slices", what).items) {
      check<CheckpointError>(
          s.kind == detail::StJson::Kind::array && (s.items.size() == 4 || s.items.size() == 6),
          "fourway: ", what,
          ": a slice is [tensor, first, count, crc32c] or [tensor, first, count, crc32c, stride, "
          "rows]");
      StateSlice sl{json_string(s.items[0], what), json_int(s.items[1], what),
                    json_int(s.items[2], what),
                    detail::parse_hex32(json_string(s.items[3], what), what)};
      if (s.items.size() == 6) {
        sl.stride = json_int(s.items[4], what);
        sl.rows = json_int(s.items[5], what);
      }
      const StateTensor* t = x.tensor(sl.tensor);
      check<CheckpointError>(t != nullptr, "fourway: ", what, " holds a slice of \"", sl.tensor,
                             "\", which the index does not describe");
      check<CheckpointError>(sl.rows >= 1 && (sl.rows == 1 || sl.stride >= sl.count),
                             "fourway: ", what, ": slice at ", sl.first, " of \"", sl.tensor,
                             "\" has ", sl.rows, " runs of ", sl.count, " elements ", sl.stride,
                             " apart; runs may not overlap");
      check<CheckpointError>(sl.count > 0 && sl.run_first(sl.rows - 1) + sl.count <= t->numel(),
                             "fourway: ", what, ": slice [", sl.first, ", ",
                             sl.run_first(sl.rows - 1) + sl.count, ") of \"", sl.tensor,
                             "\" lies outside its ", t->numel(), " elements");
      auto& runs = cover[sl.tensor];
      for (std::int64_t r = 0; r < sl.rows; ++r) runs.emplace_back(sl.run_first(r), sl.count);
      f.slices.push_back(std::move(sl));
    }
    x.files.push_back(std::move(f));
  }
  for (const auto& t : x.tensors) {
    auto& c = cover[t.name];
    std::sort(c.begin(), c.end());
    std::int64_t at = 0;
    for (const auto& [first, count] : c) {
      check<CheckpointError>(first == at, "fourway: ", source, ": the slices of \"", t.name, "\" ",
                             first < at ? "overlap" : "leave a hole", " at element ",
                             std::min(first, at), "; the index is inconsistent");
      at += count;
    }
    check<CheckpointError>(at == t.numel(), "fourway: ", source, ": the slices of \"", t.name,
                           "\" cover ", at, " of its ", t.numel(), " elements");
  }
  return x;
}

/// What one rank contributes to a save: `rows` runs of `count` elements of global tensor
/// `tensor`, run i from element first + i·stride (a slice, StateSlice). The rank then pushes the
/// values in order, run after run (`StateSink::put`).
struct StatePiece {
  std::string tensor;
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t stride = 0;
  std::int64_t rows = 1;
  [[nodiscard]] std::int64_t values() const { return count * rows; }
};

/// Receives a rank's values: `put(piece, offset, values)` for each piece in increasing offsets
/// (pieces may interleave); each piece's checksum is computed as its values arrive, and so is
/// the whole file's, from `file_head` (the checksum of the bytes before the values) on, as long
/// as the values arrive in file order.
class StateSink {
 public:
  StateSink(PieceSink& out, std::vector<StatePiece> pieces, Crc32c file_head = {})
      : out_(&out),
        pieces_(std::move(pieces)),
        crcs_(pieces_.size()),
        done_(pieces_.size(), 0),
        file_crc_(file_head) {}

  void put(std::size_t piece, std::int64_t offset, std::span<const float> values) {
    check<CheckpointError>(
        piece < pieces_.size() && offset == done_[piece] &&
            offset + static_cast<std::int64_t>(values.size()) <= pieces_[piece].values(),
        "fourway: a state piece must be written in order and within its ", "count: piece ", piece,
        " at ", offset, " (+", values.size(), ")");
    const auto bytes = std::as_bytes(values);
    const std::span<const unsigned char> raw(reinterpret_cast<const unsigned char*>(bytes.data()),
                                             bytes.size());
    out_->write(piece, static_cast<std::uint64_t>(offset) * sizeof(float), raw);
    crcs_[piece].update(raw);
    if (in_order_) {
      while (next_ < pieces_.size() && done_[next_] == pieces_[next_].values()) ++next_;
      if (piece == next_) {
        file_crc_.update(raw);
      } else {
        in_order_ = false;  // the file's checksum has to be read back
      }
    }
    done_[piece] += static_cast<std::int64_t>(values.size());
  }

  /// The CRC-32C of the whole file when every value arrived in file order and every piece is
  /// complete; nothing otherwise.
  [[nodiscard]] std::optional<std::uint32_t> file_crc() const {
    if (!in_order_) return std::nullopt;
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      if (done_[i] != pieces_[i].values()) return std::nullopt;
    }
    return file_crc_.value();
  }

  /// The slices written, with their checksums; throws if a piece was left short.
  [[nodiscard]] std::vector<StateSlice> slices() const {
    std::vector<StateSlice> out;
    for (std::size_t i = 0; i < pieces_.size(); ++i) {
      const StatePiece& p = pieces_[i];
      check<CheckpointError>(done_[i] == p.values(), "fourway: state piece \"", p.tensor, "\" got ",
                             done_[i], " of its ", p.values(), " elements");
      out.push_back({p.tensor, p.first, p.count, crcs_[i].value(), p.stride, p.rows});
    }
    return out;
  }

 private:
  PieceSink* out_;
  std::vector<StatePiece> pieces_;
  std::vector<Crc32c> crcs_;
  std::vector<std::int64_t> done_;
  Crc32c file_crc_;
  std::size_t next_ = 0;  // the first piece not yet complete, while in order
  bool in_order_ = true;
};

/// What a save writes besides the values.
struct StateSave {
  std::filesystem::path root;
  std::int64_t step = 0;
  /// The global description of the tensors this rank writes slices of (rank 0 writes the union
  /// of every rank's into the index; a tensor named twice must have one shape).
  std::vector<StateTensor> tensors;
  std::map<std::string, std::string> meta;
  int keep = 0;  // > 0: keep only the newest `keep` committed checkpoints (after the commit)
  /// Called by every rank before each phase (tests inject faults here).
  std::function<void(SavePhase)> at_phase;
};

namespace detail {
inline std::vector<std::pair<std::int64_t, std::filesystem::path>> committed_steps(
    const std::filesystem::path& root) {
  std::vector<std::pair<std::int64_t, std::filesystem::path>> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() < 13 || n.rfind("step-", 0) != 0) continue;
    std::int64_t step = 0;
    bool digits = true;
    for (char c : n.substr(5)) {
      digits = digits && c >= '0' && c <= '9';
      step = step * 10 + (c - '0');
    }
    if (!digits || !std::filesystem::is_regular_file(e.path() / "index.json", ec)) continue;
    out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace detail

/// The committed checkpoints under `root`, oldest first (a directory without index.json is not
/// one).
inline std::vector<std::filesystem::path> committed_checkpoints(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> out;
  for (auto& [step, p] : detail::committed_steps(root)) out.push_back(p);
  return out;
}

/// The newest committed checkpoint under `root`, if any.
inline std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root) {
  auto all = committed_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back();
}

namespace detail {
inline std::filesystem::path state_final_dir(const StateSave& s) {
  return s.root / step_dir_name(s.step);
}
inline std::filesystem::path state_tmp_dir(const StateSave& s) {
  return s.root / ("." + step_dir_name(s.step) + ".tmp");
}
/// Rank 0 removes the temporary directory of a failed save (the cleanup of `agree_or_throw`).
inline std::function<void()> remove_state_tmp(int rank, const StateSave& s) {
  return [rank, tmp = state_tmp_dir(s)] {
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(tmp, ec);
    }
  };
}
/// Runs `f`, turning an exception into its message in `error`.
template <class F>
void guarded(std::string& error, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
  }
}
}  // namespace detail

/// The create phase of a save (a collective; see the file comment): rank 0 refuses to overwrite
/// a committed step, removes stale temporary directories and creates this save's; every rank
/// learns the outcome.
inline void begin_state_save(int rank, const FlagGather& flags, const StateSave& s) {
  namespace fs = std::filesystem;
  const fs::path final_dir = detail::state_final_dir(s), tmp = detail::state_tmp_dir(s);
  if (s.at_phase) s.at_phase(SavePhase::create);
  std::string error;
  if (rank == 0) {
    detail::guarded(error, [&] {
      std::error_code ec;
      fs::create_directories(s.root, ec);
      check<CheckpointError>(!ec, "fourway: cannot create ", s.root.string(), ": ", ec.message());
      check<CheckpointError>(!fs::exists(final_dir / "index.json", ec),
                             "fourway: ", final_dir.string(),
                             " already holds a committed checkpoint; a ",
                             "checkpoint is never overwritten (remove it or save another step)");
      for (const auto& e : fs::directory_iterator(s.root, ec)) {  // stale saves of crashed runs
        const std::string n = e.path().filename().string();
        if (n.size() > 5 && n[0] == '.' && n.ends_with(".tmp")) fs::remove_all(e.path(), ec);
      }
      if (fs::exists(final_dir, ec)) fs::remove_all(final_dir, ec);  // no index: not a checkpoint
      check<CheckpointError>(fs::create_directory(tmp, ec) && !ec, "fourway: cannot create ",
                             tmp.string(), ": ", ec ? ec.message() : "it exists");
    });
  }
  detail::agree_or_throw(flags, "creating " + tmp.string(), error,
                         detail::remove_state_tmp(rank, s), detail::nothing_committed);
}

/// The write phase on one rank (no communication): its file in the temporary directory from
/// `write_mine(StateSink&)`, fsynced and checksummed, then its manifest. Throws on failure; the
/// caller hands the message to `finish_state_save`, which agrees it over the group.
template <class WriteMine>
void write_state_file(int rank, const StateSave& s, const std::vector<StatePiece>& mine,
                      WriteMine&& write_mine) {
  namespace fs = std::filesystem;
  if (s.at_phase) s.at_phase(SavePhase::write);
  const fs::path tmp = detail::state_tmp_dir(s);
  const fs::path file = tmp / detail::rank_file_name(rank);
  std::vector<CollectiveTensor> tensors;
  tensors.reserve(mine.size());
  for (const auto& p : mine) {
    std::vector<std::int64_t> shape{p.count};
    if (p.rows > 1) shape.insert(shape.begin(), p.rows);
    tensors.push_back({StateSlice{p.tensor, p.first, p.count}.entry_name(), StDtype::F32, shape});
  }
  const PieceLayout layout({{"format", "fourway-state"}, {"rank", std::to_string(rank)}}, tensors);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check<CheckpointError>(fd >= 0, "fourway: rank ", rank, " cannot create ", file.string(), ": ",
                         std::strerror(errno));
  std::vector<StateSlice> slices;
  std::optional<std::uint32_t> streamed_crc;  // the file's checksum, when written in order
  try {
    check<CheckpointError>(layout.write_head(fd), "fourway: writing the header of ", file.string(),
                           " failed: ", std::strerror(errno));
    PieceSink raw(fd, file.string(), layout.begins, layout.sizes);
    StateSink sink(raw, mine, Crc32c().update(layout.head()));
    write_mine(sink);
    slices = sink.slices();
    streamed_crc = sink.file_crc();
    check<CheckpointError>(::fsync(fd) == 0, "fourway: fsync of ", file.string(),
                           " failed: ", std::strerror(errno));
  } catch (...) {
    (void)::close(fd);
    throw;
  }
  check<CheckpointError>(::close(fd) == 0, "fourway: closing ", file.string(),
                         " failed: ", std::strerror(errno));
  std::uint64_t bytes = 0;
  std::uint32_t crc = 0;
  if (streamed_crc) {  // no second pass over the file
    std::error_code ec;
    bytes = std::filesystem::file_size(file, ec);
    crc = *streamed_crc;
  } else {
    crc = detail::file_crc32c(file, &bytes);
  }
  check<CheckpointError>(bytes == layout.total, "fourway: ", file.string(), " holds ", bytes,
                         " B after writing, expected ", layout.total);
  // The manifest: what rank 0 puts into the index for this file.
  const fs::path manifest = tmp / (detail::rank_file_name(rank) + ".manifest");
  {
    std::ofstream m(manifest, std::ios::trunc);
    m << "file " << bytes << ' ' << detail::hex32(crc) << '\n';
    for (const auto& t : s.tensors) {
      m << "tensor " << t.shape.size();
      for (auto d : t.shape) m << ' ' << d;
      m << ' ' << t.name << '\n';
    }
    for (const auto& sl : slices) {
      m << "slice " << sl.first << ' ' << sl.count << ' ' << sl.stride << ' ' << sl.rows << ' '
        << detail::hex32(sl.crc) << ' ' << sl.tensor << '\n';
    }
    m.flush();
    check<CheckpointError>(m.good(), "fourway: writing ", manifest.string(), " failed");
  }
  check<CheckpointError>(detail::fsync_path(manifest, false), "fourway: fsync of ",
                         manifest.string(), " failed");
}

/// The rest of a save (a collective; see the file comment): every rank's write outcome
/// (`write_error`, empty when its `write_state_file` succeeded) is agreed, then rank 0 writes the
/// index, commits and prunes, each phase agreed. Returns the committed directory.
inline std::filesystem::path finish_state_save(int rank, int world, const FlagGather& flags,
                                               const StateSave& s, const std::string& write_error) {
  namespace fs = std::filesystem;
  fs::path final_dir = detail::state_final_dir(s);  // returned: not const, so it moves
  const fs::path tmp = detail::state_tmp_dir(s);
  const bool lead = rank == 0;
  const auto phase = [&](SavePhase p) {
    if (s.at_phase) s.at_phase(p);
  };
  const auto remove_tmp = detail::remove_state_tmp(rank, s);
  detail::agree_or_throw(flags, "writing the state files of " + final_dir.string(), write_error,
                         remove_tmp, detail::nothing_committed);

  std::string error;
  phase(SavePhase::index);
  if (lead) {
    detail::guarded(error, [&] {
      StateIndex x;
      x.step = s.step;
      x.meta = s.meta;
      std::map<std::string, std::vector<std::int64_t>> shapes;  // every rank's tensors, once
      for (int r = 0; r < world; ++r) {
        const fs::path manifest = tmp / (detail::rank_file_name(r) + ".manifest");
        std::ifstream m(manifest);
        check<CheckpointError>(m.good(), "fourway: rank ", r, "'s manifest ", manifest.string(),
                               " is missing");
        StateFile f;
        f.name = detail::rank_file_name(r);
        std::string word, crc;
        m >> word >> f.bytes >> crc;
        check<CheckpointError>(word == "file", "fourway: ", manifest.string(), " is malformed");
        f.crc = detail::parse_hex32(crc, manifest.string());
        while (m >> word) {
          if (word == "tensor") {
            std::size_t rank = 0;
            m >> rank;
            check<CheckpointError>(m.good() && rank <= 8, "fourway: ", manifest.string(),
                                   " is malformed");
            std::vector<std::int64_t> shape(rank);
            for (auto& d : shape) m >> d;
            std::string name;
            m.get();
            std::getline(m, name);
            const auto [it, added] = shapes.emplace(name, shape);
            check<CheckpointError>(added || it->second == shape, "fourway: rank ", r,
                                   " describes \"", name, "\" as ", dims_string(shape),
                                   ", another rank as ", dims_string(it->second),
                                   "; the ranks do not train one model");
          } else {
            StateSlice sl;
            m >> sl.first >> sl.count >> sl.stride >> sl.rows >> crc;
            check<CheckpointError>(word == "slice" && !m.fail(), "fourway: ", manifest.string(),
                                   " is malformed");
            m.get();
            std::getline(m, sl.tensor);
            sl.crc = detail::parse_hex32(crc, manifest.string());
            f.slices.push_back(sl);
          }
        }
        x.files.push_back(std::move(f));
        std::error_code ec;
        fs::remove(manifest, ec);
      }
      for (auto& [name, shape] : shapes) x.tensors.push_back({name, shape});  // sorted by name
      const std::string json = to_json(x);
      (void)parse_state_index(json, "the index being written");  // coverage checked before commit
      const fs::path index = tmp / "index.json";
      {
        std::ofstream out(index, std::ios::trunc | std::ios::binary);
        out << json;
        out.flush();
        check<CheckpointError>(out.good(), "fourway: writing ", index.string(), " failed");
      }
      check<CheckpointError>(detail::fsync_path(index, false) && detail::fsync_path(tmp, true),
                             "fourway: fsync of ", index.string(), " failed");
    });
  }
  detail::agree_or_throw(flags, "writing the index of " + final_dir.string(), error, remove_tmp,
                         detail::nothing_committed);

  phase(SavePhase::commit);
  if (lead) {
    detail::guarded(error, [&] {
      std::error_code ec;
      fs::rename(tmp, final_dir, ec);
      check<CheckpointError>(!ec, "fourway: cannot rename ", tmp.string(), " to ",
                             final_dir.string(), ": ", ec.message());
      check<CheckpointError>(detail::fsync_path(s.root, true), "fourway: fsync of ",
                             s.root.string(), " failed");
    });
  }
  detail::agree_or_throw(flags, "committing " + final_dir.string(), error, remove_tmp,
                         detail::nothing_committed);

  phase(SavePhase::prune);
  if (lead && s.keep > 0) {
    auto all = detail::committed_steps(s.root);
    for (std::size_t i = 0; i + static_cast<std::size_t>(s.keep) < all.size(); ++i) {
      std::error_code ec;
      // The index goes first: a half-removed directory is no longer a checkpoint.
      fs::remove(all[i].second / "index.json", ec);
      fs::remove_all(all[i].second, ec);
    }
  }
  return final_dir;
}

/// Saves this rank's pieces (see the file comment); a collective of `world` ranks whose `flags`
/// agree after every phase. `write_mine(StateSink&)` pushes the values of `mine`. Returns the
/// committed directory. (`begin_state_save`, `write_state_file` and `finish_state_save` are its
/// phases; checkpoint/async_state_save.hpp runs the write in the background.)
template <class WriteMine>
std::filesystem::path save_state_dir(int rank, int world, const FlagGather& flags,
                                     const StateSave& s, std::vector<StatePiece> mine,
                                     WriteMine&& write_mine) {
  begin_state_save(rank, flags, s);
  std::string error;
  detail::guarded(error, [&] { write_state_file(rank, s, mine, write_mine); });
  return finish_state_save(rank, world, flags, s, error);
}

/// A committed checkpoint opened for reading: element ranges of global tensors, from whichever
/// files hold them, each slice's checksum verified the first time it is touched.
class StateDir {
 public:
  static StateDir open(const std::filesystem::path& dir) {
    StateDir d;
    d.dir_ = dir;
    const auto index = dir / "index.json";
    const std::string name = std::filesystem::path(dir).filename().string();
    check<CheckpointError>(!(name.starts_with('.') && name.ends_with(".tmp")),
                           "fourway: ", dir.string(),
                           " is not a committed checkpoint: it is a save that did ",
                           "not finish (resume from an earlier one)");
    std::error_code ec;
    check<CheckpointError>(std::filesystem::is_regular_file(index, ec), "fourway: ", dir.string(),
                           " is not a committed checkpoint: it has no index.json (a save that ",
                           "did not finish; resume from an earlier one)");
    const auto bytes = detail::read_whole_file(index, "checkpoint index");
    d.index_ = parse_state_index(
        std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
        index.string());
    return d;
  }

  [[nodiscard]] const StateIndex& index() const { return index_; }
  [[nodiscard]] const std::filesystem::path& path() const { return dir_; }
  /// Bytes read from the slice files so far (tests prove a rank read only what overlaps it).
  [[nodiscard]] std::uint64_t bytes_read() const {
    std::uint64_t n = 0;
    for (const auto& [name, r] : readers_) n += r.bytes_read();
    return n;
  }

  /// Calls `sink(offset, values)` for elements [first, first + count) of `tensor` (offset 0 is
  /// element `first`), every element exactly once, in pieces of at most 2^16 values; offsets
  /// increase within a slice, slices come in the order of their first element. Only the slices
  /// that overlap the range are read; host memory is one 2^16-value buffer.
  template <class Sink>
  void read(std::string_view tensor, std::int64_t first, std::int64_t count, Sink&& sink) {
    const StateTensor* t = index_.tensor(tensor);
    check<CheckpointError>(t != nullptr, "fourway: checkpoint ", dir_.string(),
                           " holds no tensor \"", tensor, "\"");
    check<CheckpointError>(first >= 0 && count >= 0 && first + count <= t->numel(),
                           "fourway: elements [", first, ", ", first + count, ") of \"", tensor,
                           "\" are outside its ", t->numel(), " elements");
    if (count == 0) return;
    const std::int64_t end = first + count;
    std::vector<float> buf;
    for (const auto& [fi, si] : slices_of(tensor)) {
      const StateFile* f = &index_.files[fi];
      const StateSlice* s = &f->slices[si];
      // The runs [r0, r1) of the slice that can overlap [first, end).
      std::int64_t r0 = 0, r1 = s->rows;
      if (s->rows > 1) {
        r0 = first <= s->first + s->count - 1
                 ? 0
                 : (first - (s->first + s->count - 1) + s->stride - 1) / s->stride;
        r1 = end <= s->first ? 0 : std::min(s->rows, (end - 1 - s->first) / s->stride + 1);
      } else if (s->first >= end || first >= s->first + s->count) {
        r1 = 0;
      }
      if (r0 >= r1) continue;
      SafetensorsReader& r = reader(*f);
      const SafetensorsEntry* e = r.find(s->entry_name());
      check<CheckpointError>(e != nullptr && e->dtype == StDtype::F32 && e->numel() == s->values(),
                             "fourway: ", (dir_ / f->name).string(), " lacks the F32 slice \"",
                             s->entry_name(), "\" of ", s->values(),
                             " elements its index promises (tensor \"", tensor, "\")");
      const std::string key = f->name + '\n' + s->entry_name();
      const bool verify = !verified_.contains(key);
      // Unverified: stream the whole slice (checksum), hand out the overlap as it passes; else
      // read the overlapping runs' overlap only. A mismatch throws after the values went out: a
      // load that throws leaves the caller's state unspecified (the caller agrees the failure
      // over all ranks).
      Crc32c crc;
      const auto run = [&](std::int64_t i, bool whole) {
        const std::int64_t g = s->run_first(i);  // global element of the run's first value
        const std::int64_t lo = std::max(first, g), hi = std::min(end, g + s->count);
        const std::int64_t from = whole ? g : lo, to = whole ? g + s->count : hi;
        for (std::int64_t at = from; at < to; at += chunk) {
          const std::int64_t n = std::min<std::int64_t>(chunk, to - at);
          buf.resize(static_cast<std::size_t>(n));
          r.read_elements(*e, i * s->count + (at - g), n, buf.data());
          if (whole) crc.update(buf.data(), buf.size() * sizeof(float));
          const std::int64_t a = std::max(at, lo), b = std::min(at + n, hi);
          if (a < b) {
            sink(a - first,
                 std::span<const float>(buf.data() + (a - at), static_cast<std::size_t>(b - a)));
          }
        }
      };
      for (std::int64_t i = verify ? 0 : r0; i < (verify ? s->rows : r1); ++i) run(i, verify);
      if (verify) {
        check<CheckpointError>(crc.value() == s->crc, "fourway: checksum mismatch in ",
                               (dir_ / f->name).string(), ", tensor \"", tensor, "\" elements [",
                               s->first, ", ", s->run_first(s->rows - 1) + s->count, "): CRC-32C ",
                               detail::hex32(crc.value()), ", the index says ",
                               detail::hex32(s->crc), "; the file is corrupt");
        verified_.insert(key);
      }
    }
  }

  /// Every file's size and CRC-32C against the index (for `fourway-ckpt info`): one line per
  /// mismatch, empty when all hold.
  [[nodiscard]] std::vector<std::string> verify_files() const {
    std::vector<std::string> bad;
    for (const auto& f : index_.files) {
      const auto p = dir_ / f.name;
      std::error_code ec;
      if (!std::filesystem::is_regular_file(p, ec)) {
        bad.push_back(p.string() + ": missing");
        continue;
      }
      std::uint64_t n = 0;
      const std::uint32_t crc = detail::file_crc32c(p, &n);
      if (n != f.bytes) {
        bad.push_back(
            detail::cat(p.string(), ": ", n, " B, the index says ", f.bytes, " B (truncated?)"));
      } else if (crc != f.crc) {
        bad.push_back(detail::cat(p.string(), ": CRC-32C ", detail::hex32(crc), ", the index says ",
                                  detail::hex32(f.crc)));
      }
    }
    return bad;
  }

 private:
  static constexpr std::int64_t chunk = 1 << 16;
  StateDir() = default;

  SafetensorsReader& reader(const StateFile& f) {
    auto it = readers_.find(f.name);
    if (it == readers_.end()) {
      const auto p = dir_ / f.name;
      std::error_code ec;
      const auto size = std::filesystem::file_size(p, ec);
      check<CheckpointError>(!ec && size == f.bytes, "fourway: ", p.string(), " holds ",
                             ec ? 0 : size, " B, the index says ", f.bytes,
                             " B: the file is truncated or was replaced");
      it = readers_.emplace(f.name, SafetensorsReader::open(p)).first;
    }
    return it->second;
  }

  using SliceAt = std::pair<std::size_t, std::size_t>;  // (file, slice) in the index

  /// The slices of `tensor` over all files, in the order of their first element (built once).
  const std::vector<SliceAt>& slices_of(std::string_view tensor) {
    if (by_tensor_.empty()) {
      for (std::size_t f = 0; f < index_.files.size(); ++f) {
        const auto& slices = index_.files[f].slices;
        for (std::size_t k = 0; k < slices.size(); ++k)
          by_tensor_[slices[k].tensor].emplace_back(f, k);
      }
      for (auto& [name, v] : by_tensor_) {
        std::sort(v.begin(), v.end(), [&](const SliceAt& a, const SliceAt& b) {
          return index_.files[a.first].slices[a.second].first <
                 index_.files[b.first].slices[b.second].first;
        });
      }
    }
    static const std::vector<SliceAt> none;
    const auto it = by_tensor_.find(std::string(tensor));
    return it == by_tensor_.end() ? none : it->second;
  }

  std::filesystem::path dir_;
  StateIndex index_;
  std::map<std::string, std::vector<SliceAt>> by_tensor_;
  std::map<std::string, SafetensorsReader> readers_;
  std::set<std::string> verified_;
};

}  // namespace fourway
