//! Test-only reader of fourway golden files (format: docs/golden.md, written by
//! tools/make_golden.py). Throws fw::CheckpointError on a bad magic, version or truncation.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fourway/core/error.hpp"

namespace fourway::test {

struct GoldenTensor {
  std::uint32_t dtype = 0;  // 0 f32, 1 i32
  std::vector<std::int64_t> dims;
  std::vector<float> f32;
  std::vector<std::int32_t> i32;
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
  }
};

class Golden {
 public:
  static constexpr std::uint32_t supported_version = 1;

  explicit Golden(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    check<CheckpointError>(in.good(), "fourway: cannot open golden file ", path);
    std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::size_t pos = 0;
    auto take = [&](void* dst, std::size_t n) {
      check<CheckpointError>(pos + n <= buf.size(), "fourway: golden file ", path,
                             " is truncated at byte ", pos);
      std::memcpy(dst, buf.data() + pos, n);
      pos += n;
    };
    char magic[8];
    take(magic, 8);
    check<CheckpointError>(std::memcmp(magic, "FWGOLD\0\0", 8) == 0, "fourway: ", path,
                           " is not a fourway golden file (bad magic)");
    std::uint32_t version = 0;
    std::uint32_t count = 0;
    take(&version, 4);
    check<CheckpointError>(version == supported_version, "fourway: golden file ", path,
                           " has version ", version, ", this reader knows ", supported_version,
                           "; regenerate it with tools/make_golden.py");
    take(&count, 4);
    for (std::uint32_t e = 0; e < count; ++e) {
      std::uint32_t len = 0;
      take(&len, 4);
      std::string name(len, '\0');
      take(name.data(), len);
      GoldenTensor t;
      std::uint32_t ndim = 0;
      take(&t.dtype, 4);
      take(&ndim, 4);
      t.dims.resize(ndim);
      for (auto& d : t.dims) {
        std::uint64_t v = 0;
        take(&v, 8);
        d = static_cast<std::int64_t>(v);
      }
      const auto n = static_cast<std::size_t>(t.numel());
      if (t.dtype == 0) {
        t.f32.resize(n);
        take(t.f32.data(), n * 4);
      } else {
        check<CheckpointError>(t.dtype == 1, "fourway: golden entry ", name, " has dtype ",
                               t.dtype);
        t.i32.resize(n);
        take(t.i32.data(), n * 4);
      }
      entries_.emplace(name, std::move(t));
    }
    check<CheckpointError>(pos == buf.size(), "fourway: golden file ", path, " has ",
                           buf.size() - pos, " trailing bytes");
  }

  [[nodiscard]] bool has(const std::string& name) const { return entries_.count(name) != 0; }
  [[nodiscard]] const GoldenTensor& at(const std::string& name) const {
    auto it = entries_.find(name);
    check<CheckpointError>(it != entries_.end(), "fourway: golden entry ", name, " is missing");
    return it->second;
  }
  [[nodiscard]] const std::vector<float>& f32(const std::string& name) const {
    return at(name).f32;
  }
  [[nodiscard]] const std::vector<std::int32_t>& i32(const std::string& name) const {
    return at(name).i32;
  }
  [[nodiscard]] std::size_t size() const { return entries_.size(); }

 private:
  std::map<std::string, GoldenTensor> entries_;
};

/// Path of a file under tests/golden/ (FOURWAY_GOLDEN_DIR is set by the tests' CMakeLists).
inline std::string golden_path(const std::string& file) {
#ifdef FOURWAY_GOLDEN_DIR
  return std::string(FOURWAY_GOLDEN_DIR) + "/" + file;
#else
  return "tests/golden/" + file;
#endif
}

}  // namespace fourway::test
