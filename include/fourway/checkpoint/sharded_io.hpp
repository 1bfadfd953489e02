//! Safetensors files read and written by many ranks, each touching only the bytes it owns.
//!
//! `SafetensorsReader` opens a file, reads its 8-byte length and header with positioned reads
//! (`pread`), validates the header with every check `SafetensorsFile` makes (so a corrupt file is
//! refused on every rank the same way), and then reads element ranges of single tensors on
//! demand, converting F32/F16/BF16/F64 to the caller's type through a bounded buffer (1 MiB of
//! file bytes at a time). Nothing ever holds the whole file; `bytes_read()` counts every byte
//! taken from the file (header included), so tests can prove a rank read only its share.
//!
//! `write_safetensors_collective` writes one file from the pieces the ranks of a group hold:
//! ```
//!   every rank    header = SafetensorsWriter::header(metadata, shapes)  (identical everywhere)
//!   rank 0        creates PATH.tmp, writes length + header, sizes the file      } ok agreed
//!   every rank    opens PATH.tmp, pwrite()s its pieces at their offsets, fsync  } by all ranks
//!   rank 0        renames PATH.tmp to PATH                                       } ok agreed
//! ```
//! The bytes equal `SafetensorsWriter::serialize()` of the same tensors, so the file is
//! byte-identical to the one-rank save. If any rank fails at any point, every rank throws
//! `CheckpointError` naming the failed rank(s), rank 0 removes PATH.tmp, and PATH is never
//! created (nor replaced).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fourway/checkpoint/safetensors.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/comm/staged.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

/// A safetensors file opened for positioned reads of single tensors' element ranges.
class SafetensorsReader {
 public:
  /// Opens and validates `path` (reads only the length field and the header).
  static SafetensorsReader open(const std::filesystem::path& path, SafetensorsLimits limits = {}) {
    SafetensorsReader r;
    r.source_ = path.string();
    std::error_code ec;
    check<CheckpointError>(std::filesystem::is_regular_file(path, ec), "fourway: cannot open ",
                           "safetensors file ", r.source_, ": no such regular file");
    const auto size = std::filesystem::file_size(path, ec);
    check<CheckpointError>(!ec, "fourway: cannot read the size of ", r.source_, ": ", ec.message());
    r.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    check<CheckpointError>(r.fd_ >= 0, "fourway: cannot open ", r.source_, ": ",
                           std::strerror(errno));
    unsigned char first[8] = {};
    r.pread_all(first, std::min<std::uint64_t>(8, size), 0);
    const std::uint64_t n = SafetensorsFile::header_length(first, size, r.source_, limits);
    std::string text(static_cast<std::size_t>(n), '\0');
    r.pread_all(text.data(), n, 8);
    r.index_ = SafetensorsFile::index(text, size, r.source_, limits);
    return r;
  }

  SafetensorsReader(SafetensorsReader&& o) noexcept { swap(o); }
  SafetensorsReader& operator=(SafetensorsReader&& o) noexcept {
    if (this != &o) {
      close();
      swap(o);
    }
    return *this;
  }
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  ~SafetensorsReader() { close(); }

  [[nodiscard]] const std::string& source() const { return source_; }
  [[nodiscard]] const std::vector<SafetensorsEntry>& entries() const { return index_.entries(); }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const {
    return index_.metadata();
  }
  [[nodiscard]] const SafetensorsEntry* find(std::string_view name) const {
    return index_.find(name);
  }
  /// Bytes read from the file so far (length field and header included).
  [[nodiscard]] std::uint64_t bytes_read() const { return bytes_read_; }

  /// Elements [first, first + count) of tensor `e`, converted into `out` (through a buffer the
  /// reader keeps, at most 1 MiB: one reader serves one thread).
  template <floating_dtype T>
  void read_elements(const SafetensorsEntry& e, std::int64_t first, std::int64_t count,
                     T* out) const {
    check<CheckpointError>(first >= 0 && count >= 0 && first + count <= e.numel(),
                           "fourway: ", source_, ": elements [", first, ", ", first + count,
                           ") of tensor \"", e.name, "\" of ", e.numel());
    const std::size_t esize = st_dtype_size(e.dtype);
    const std::int64_t chunk =
        std::max<std::int64_t>(1, (1 << 20) / static_cast<std::int64_t>(esize));
    std::vector<unsigned char>& buf = scratch_;
    buf.resize(std::max(buf.size(), static_cast<std::size_t>(std::min(count, chunk)) * esize));
    for (std::int64_t at = 0; at < count; at += chunk) {
      const std::int64_t n = std::min(chunk, count - at);
      pread_all(buf.data(), static_cast<std::uint64_t>(n) * esize,
                index_.data_offset() + e.begin + static_cast<std::uint64_t>(first + at) * esize);
      SafetensorsFile::convert_values(e.dtype, buf.data(), out + at, static_cast<std::size_t>(n),
                                      source_, e.name);
    }
  }

  /// Whether tensors `a` and `b` have the same dtype and bytes (compared 1 MiB at a time).
  [[nodiscard]] bool same_bytes(const SafetensorsEntry& a, const SafetensorsEntry& b) const {
    if (a.dtype != b.dtype || a.end - a.begin != b.end - b.begin) return false;
    const std::uint64_t total = a.end - a.begin;
    constexpr std::uint64_t chunk = 1 << 20;
    std::vector<unsigned char> x(static_cast<std::size_t>(std::min(total, chunk)));
    std::vector<unsigned char> y(x.size());
    for (std::uint64_t at = 0; at < total; at += chunk) {
      const std::uint64_t n = std::min(chunk, total - at);
      pread_all(x.data(), n, index_.data_offset() + a.begin + at);
      pread_all(y.data(), n, index_.data_offset() + b.begin + at);
      if (std::memcmp(x.data(), y.data(), static_cast<std::size_t>(n)) != 0) return false;
    }
    return true;
  }

 private:
  SafetensorsReader() = default;
  void close() noexcept {
    if (fd_ >= 0) (void)::close(fd_);
    fd_ = -1;
  }
  void swap(SafetensorsReader& o) noexcept {
    std::swap(source_, o.source_);
    std::swap(fd_, o.fd_);
    std::swap(index_, o.index_);
    std::swap(bytes_read_, o.bytes_read_);
    std::swap(scratch_, o.scratch_);
  }
  void pread_all(void* dst, std::uint64_t n, std::uint64_t offset) const {
    auto* p = static_cast<unsigned char*>(dst);
    std::uint64_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, p + done, static_cast<std::size_t>(n - done),
                                  static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      check<CheckpointError>(got > 0, "fourway: reading ", n, " B at offset ", offset, " of ",
                             source_, " failed after ", done,
                             " B: ", got < 0 ? std::strerror(errno) : "unexpected end of file");
      done += static_cast<std::uint64_t>(got);
    }
    bytes_read_ += n;
  }

  std::string source_;
  int fd_ = -1;
  SafetensorsFile index_;
  mutable std::uint64_t bytes_read_ = 0;
  mutable std::vector<unsigned char> scratch_;  // file bytes of read_elements, reused
};

/// One tensor of a file written collectively: its name, dtype and shape.
struct CollectiveTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<std::int64_t> shape;
  [[nodiscard]] std::uint64_t bytes() const {
    std::uint64_t n = st_dtype_size(dtype);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

/// What a rank's writer callback gets: `write(t, offset, bytes)` puts `bytes` at byte `offset`
/// of tensor `t`'s data (bounds checked).
class PieceSink {
 public:
  PieceSink(int fd, std::string source, std::vector<std::uint64_t> begins,
            std::vector<std::uint64_t> sizes)
      : fd_(fd), source_(std::move(source)), begins_(std::move(begins)), sizes_(std::move(sizes)) {}

  void write(std::size_t t, std::uint64_t offset, std::span<const unsigned char> bytes) {
    check<CheckpointError>(t < sizes_.size() && offset + bytes.size() <= sizes_[t],
                           "fourway: a piece of ", bytes.size(), " B at offset ", offset,
                           " does not fit tensor ", t, " of ", source_);
    std::uint64_t done = 0;
    while (done < bytes.size()) {
      const ssize_t put = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                                   static_cast<off_t>(begins_[t] + offset + done));
      if (put < 0 && errno == EINTR) continue;
      check<CheckpointError>(put > 0, "fourway: writing ", bytes.size(), " B to ", source_,
                             " failed: ", put < 0 ? std::strerror(errno) : "nothing written");
      done += static_cast<std::uint64_t>(put);
    }
    written_ += bytes.size();
  }
  /// Bytes this rank wrote.
  [[nodiscard]] std::uint64_t written() const { return written_; }

 private:
  int fd_;
  std::string source_;
  std::vector<std::uint64_t> begins_;  // file offset of each tensor's data
  std::vector<std::uint64_t> sizes_;
  std::uint64_t written_ = 0;
};

/// `flags(mine)`: every rank's flag, in rank order (an all-gather of one integer).
using FlagGather = std::function<std::vector<std::int64_t>(std::int64_t)>;

/// A `FlagGather` over `comm`, the flags staged through backend memory of `ctx` (comm/staged.hpp:
/// no host pointer reaches a communicator). Both must outlive it.
template <class B, communicator Comm>
FlagGather flag_gather(const Context<B>& ctx, Comm& comm) {
  return [&ctx, &comm](std::int64_t mine) {
    std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
    staged_all_gather(ctx, comm, &mine, all.data(), 1);
    return all;
  };
}

namespace detail {
/// Every rank learns which ranks failed a phase; throws CheckpointError on all of them if any.
inline void agree_or_throw(
    const FlagGather& flags, const std::string& what, const std::string& my_error,
    const std::function<void()>& cleanup,
    std::string_view outcome = "; no file was written under the final name") {
  const std::vector<std::int64_t> all = flags(my_error.empty() ? 1 : 0);
  std::string failed;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r]) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (failed.empty()) return;
  cleanup();
  throw CheckpointError(cat("fourway: ", what, " failed on rank(s) ", failed,
                            my_error.empty() ? "" : "; here: ", my_error, outcome));
}
}  // namespace detail

/// Where a file assembled piece by piece puts everything: its header text, each tensor's first
/// byte and size, and the file's size.
struct PieceLayout {
  std::string header;
  std::vector<std::uint64_t> begins, sizes;
  std::uint64_t total = 0;

  PieceLayout(const std::map<std::string, std::string>& metadata,
              const std::vector<CollectiveTensor>& tensors) {
    std::vector<SafetensorsWriter::HeaderEntry> entries;
    entries.reserve(tensors.size());
    for (const auto& t : tensors) entries.push_back({t.name, t.dtype, t.shape, t.bytes()});
    header = SafetensorsWriter::header(metadata, entries);
    total = 8 + header.size();
    for (const auto& t : tensors) {
      begins.push_back(total);
      sizes.push_back(t.bytes());
      total += t.bytes();
    }
  }

  /// The file's first bytes: the little-endian length field and the header.
  [[nodiscard]] std::vector<unsigned char> head() const {
    std::vector<unsigned char> out(8 + header.size());
    for (std::size_t i = 0; i < 8; ++i) {
      out[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
    }
    std::copy(header.begin(), header.end(), out.begin() + 8);
    return out;
  }

  /// Writes the length field and the header at offset 0 of `fd` and sizes the file; false (errno
  /// set) on failure.
  [[nodiscard]] bool write_head(int fd) const {
    const std::vector<unsigned char> head = this->head();
    return ::pwrite(fd, head.data(), head.size(), 0) == static_cast<ssize_t>(head.size()) &&
           ::ftruncate(fd, static_cast<off_t>(total)) == 0;
  }
};

/// Writes `path` (see the file comment) from the pieces each rank's `write_mine(PieceSink&)`
/// puts; a collective of the group whose `flags` agree on success (`rank` 0 creates, renames and
/// cleans up). Returns the bytes this rank wrote.
template <class WriteMine>
std::uint64_t write_safetensors_collective(int rank, const FlagGather& flags,
                                           const std::filesystem::path& path,
                                           const std::map<std::string, std::string>& metadata,
                                           const std::vector<CollectiveTensor>& tensors,
                                           WriteMine&& write_mine) {
  const PieceLayout layout(metadata, tensors);
  auto tmp = path;
  tmp += ".tmp";
  const bool lead = rank == 0;
  const auto remove_tmp = [&] {
    if (lead) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
    }
  };
  std::string error;
  if (lead) {
    try {
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      check<CheckpointError>(fd >= 0, "fourway: cannot create ", tmp.string(), ": ",
                             std::strerror(errno));
      const bool ok = layout.write_head(fd);
      const int err = errno;
      (void)::close(fd);
      check<CheckpointError>(ok, "fourway: writing the header of ", tmp.string(),
                             " failed: ", std::strerror(err));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  detail::agree_or_throw(flags, "creating " + tmp.string(), error, remove_tmp);
  std::uint64_t written = 0;
  try {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
    check<CheckpointError>(fd >= 0, "fourway: rank ", rank, " cannot open ", tmp.string(), ": ",
                           std::strerror(errno));
    try {
      PieceSink sink(fd, tmp.string(), layout.begins, layout.sizes);
      write_mine(sink);
      written = sink.written();
      check<CheckpointError>(::fsync(fd) == 0, "fourway: fsync of ", tmp.string(),
                             " failed: ", std::strerror(errno));
    } catch (...) {
      (void)::close(fd);
      throw;
    }
    (void)::close(fd);
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree_or_throw(flags, "writing " + path.string(), error, remove_tmp);
  if (lead) {
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec)
      error = detail::cat("fourway: cannot rename ", tmp.string(), " to ", path.string(), ": ",
                          ec.message());
  }
  detail::agree_or_throw(flags, "renaming to " + path.string(), error, remove_tmp);
  return written;
}

}  // namespace fourway
