//! Typed errors. Every message names the numbers involved and, where there is one, the fix.
//!
//! Catch `fourway::Error` for everything the library throws; the subclasses let callers (and
//! tests) tell a bad configuration from a communication failure from a corrupt checkpoint.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "fourway/config.hpp"

namespace fourway {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A configuration that cannot work: degrees that do not divide, sizes that disagree.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// Tensor shapes or counts that do not agree with an operation.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// A dtype an operation does not support.
class DtypeError : public Error {
 public:
  using Error::Error;
};

/// An allocation the backend could not satisfy.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

/// A failed CUDA, cuBLAS or NCCL call, or a GPU that is absent.
class DeviceError : public Error {
 public:
  using Error::Error;
};

/// A collective or point-to-point operation that failed.
class CommError : public Error {
 public:
  using Error::Error;
};

/// A rank that did not arrive within the deadline. Thrown instead of hanging.
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};

/// Ranks that called different collectives (op, count, dtype or root differ), found in debug mode.
class CommMismatch : public CommError {
 public:
  using CommError::CommError;
};

/// Ranks that can never make progress under the strict world's model of NCCL's contract (a send
/// whose recv is never posted, collectives in different orders on two groups, ...): thrown on
/// every waiting rank, naming every rank's pending operations, instead of waiting for a timeout.
class CommDeadlock : public CommError {
 public:
  using CommError::CommError;
};

/// A call that a CUDA graph capture cannot hold — a synchronising call or an allocation from the
/// backend — made while a capture (or its host rehearsal) is open (backend/capture.hpp); the
/// message names the call and the capture.
class GraphCaptureError : public Error {
 public:
  using Error::Error;
};

/// A safetensors file, token file or checkpoint that is missing, truncated or inconsistent.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A pipeline schedule that cannot run: an invalid request, or a table that the checker refuses
/// (a send without its recv, a deadlock, a micro-batch computed twice or never).
class ScheduleError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

namespace detail {
/// Builds a message from streamable pieces: `cat("world size ", n, " is not ", a, " x ", b)`.
template <class... Ts>
std::string cat(const Ts&... parts) {
  std::ostringstream os;
  ((os << parts), ...);
  return os.str();
}

/// Ends the program with `what` on stderr: for broken invariants found where nothing may throw
/// (destructors), so they are loud instead of silently wrong.
[[noreturn]] inline void fatal(const char* what) noexcept {
  std::fputs(what, stderr);
  std::fputs("\n", stderr);
  std::abort();
}
}  // namespace detail

/// Throws `E` with a message built from `parts` when `cond` is false.
template <class E = Error, class... Ts>
void check(bool cond, const Ts&... parts) {
  if (!cond) throw E(detail::cat(parts...));
}

}  // namespace fourway
