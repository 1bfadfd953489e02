// fourway-ckpt: what a checkpoint directory holds, and whether its files are intact.
//
//   fourway-ckpt info PATH     PATH: a step-NNNNNNNN directory, or a --save-dir root (the newest)
//
// Prints the step, the metadata (precision, the mesh that saved it, optimizer step, loss scale,
// data position), the tensors with their shapes, and every file with its size and whether its
// size and CRC-32C match the index. Exit status: 0 all intact, 1 a file does not match or the
// checkpoint cannot be read, 2 bad usage.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "fourway/checkpoint/state_dir.hpp"
#include "fourway/train/resume.hpp"

namespace fw = fourway;

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::puts("usage: fourway-ckpt info PATH   (a step-NNNNNNNN directory or a --save-dir root)");
    return 0;
  }
  if (argc != 3 || std::strcmp(argv[1], "info") != 0) {
    std::fputs("fourway-ckpt: usage: fourway-ckpt info PATH\n", stderr);
    return 2;
  }
  try {
    const auto dir = fw::resolve_checkpoint(argv[2]);
    const auto d = fw::StateDir::open(dir);
    const fw::StateIndex& x = d.index();
    std::printf("checkpoint %s\nstep %lld, format version %d\n", dir.string().c_str(),
                static_cast<long long>(x.step), x.version);
    for (const auto& [k, v] : x.meta) std::printf("  %-22s %s\n", k.c_str(), v.c_str());
    std::int64_t elements = 0;
    for (const auto& t : x.tensors) elements += t.numel();
    std::printf("%zu tensors, %lld elements (F32)\n", x.tensors.size(),
                static_cast<long long>(elements));
    for (const auto& t : x.tensors) {
      std::string shape = "(";
      for (std::size_t i = 0; i < t.shape.size(); ++i) {
        shape += (i ? ", " : "") + std::to_string(t.shape[i]);
      }
      std::printf("  %-40s %s\n", t.name.c_str(), (shape + ")").c_str());
    }
    const auto bad = d.verify_files();
    std::printf("%zu files, %llu B\n", x.files.size(),
                static_cast<unsigned long long>(x.total_bytes()));
    for (const auto& f : x.files) {
      bool ok = true;
      for (const auto& b : bad) ok = ok && b.find(f.name) == std::string::npos;
      std::printf("  %-24s %12llu B  %zu slices  crc32c %s  %s\n", f.name.c_str(),
                  static_cast<unsigned long long>(f.bytes), f.slices.size(),
                  fw::detail::hex32(f.crc).c_str(), ok ? "ok" : "BAD");
    }
    for (const auto& b : bad) std::fprintf(stderr, "fourway-ckpt: %s\n", b.c_str());
    std::printf("checksums: %s\n", bad.empty() ? "ok" : "MISMATCH");
    return bad.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fourway-ckpt: %s\n", e.what());
    return 1;
  }
}
