//! Test support: run a built program as a user would (shell command line, stdin closed) and
//! collect its exit status and both output streams. Scratch files live in a folder per process,
//! since ctest runs tests in parallel and other builds may share /tmp.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fourway::test {

struct ProgramRun {
  int status = -1;  // exit status, or -1 when the program did not exit normally (a crash)
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// `<tmp>/<prefix>_<pid>/name`, the folder created on first use.
inline std::filesystem::path scratch_path(const std::string& prefix, const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

/// Runs `'exe' args` (args are shell words, quoted by the caller where needed).
inline ProgramRun run_program(const std::string& exe, const std::string& args,
                              const std::string& scratch_prefix) {
  const auto out = scratch_path(scratch_prefix, "stdout.txt");
  const auto err = scratch_path(scratch_prefix, "stderr.txt");
  const std::string cmd =
      "'" + exe + "' " + args + " > '" + out.string() + "' 2> '" + err.string() + "' < /dev/null";
  const int raw = std::system(cmd.c_str());
  ProgramRun r;
  r.status = (raw != -1 && WIFEXITED(raw)) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace fourway::test
