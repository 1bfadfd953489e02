//! Who started this process, read from the launcher's environment: rank, world size, local rank,
//! and where rank 0 listens for the TCP rendezvous (comm/tcp_rendezvous.hpp).
//!
//!   launcher        rank / size / local rank                     rank 0's address and port
//!   torchrun-style  RANK, WORLD_SIZE, LOCAL_RANK                 MASTER_ADDR, MASTER_PORT
//!   mpirun          OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK     (none: NCCL's id goes over MPI)
//!   srun (Slurm)    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID    MASTER_ADDR, else the first host
//!                                                                of SLURM_STEP_NODELIST (else
//!                                                                _JOB_NODELIST, _NODELIST);
//!                                                                MASTER_PORT, else
//!                                                                10000 + SLURM_JOB_ID % 20000
//!
//! Precedence, when several are set: torchrun-style, then mpirun, then Slurm -- the launcher
//! that started this very process wins over the allocation around it (`srun torchrun ...` and
//! `mpirun` inside an `sbatch` script both see SLURM_* variables that describe the job, not the
//! process). A launcher is recognised by its rank variable (RANK or WORLD_SIZE for torchrun);
//! from then on every variable it needs must be there and well formed, or the read throws
//! ConfigError naming the variable, its value and the fix. Nothing is guessed.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "fourway/comm/tcp_rendezvous.hpp"
#include "fourway/core/error.hpp"

namespace fourway {

enum class Launcher : std::uint8_t { none, torchrun, mpirun, slurm };

constexpr std::string_view launcher_name(Launcher l) {
  switch (l) {
    case Launcher::none: return "no launcher";
    case Launcher::torchrun: return "torchrun-style variables (RANK, WORLD_SIZE)";
    case Launcher::mpirun: return "mpirun (OMPI_COMM_WORLD_RANK)";
    case Launcher::slurm: return "srun (SLURM_PROCID)";
  }
  return "?";
}

/// This process's place in the job, as its launcher described it.
struct LaunchEnv {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int size = 1;
  int local_rank = 0;       ///< the process's index on its node (it picks the GPU)
  std::string master_addr;  ///< rank 0's host (empty under mpirun and without a launcher)
  int master_port = 0;      ///< rank 0's rendezvous port (0 under mpirun and without a launcher)
};

/// An environment: the value of a variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// This process's environment.
inline EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());  // NOLINT(concurrency-mt-unsafe): read only
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

/// Slurm without MASTER_PORT: a port from the job id, below Linux's ephemeral range (32768..)
/// so that no outgoing connection holds it. Two concurrent steps of one job need MASTER_PORT.
constexpr int slurm_port_base = 10000;
constexpr int slurm_port_span = 20000;
constexpr int slurm_default_port(std::int64_t job_id) {
  return slurm_port_base + static_cast<int>(job_id % slurm_port_span);
}

namespace detail::env {

/// One element of a host list item: literal text, or a bracket's ranges (`01-04`, `07`).
struct Piece {
  std::string text;  ///< literal text, when `ranges` is empty
  struct Range {
    std::int64_t lo, hi;
    std::size_t width;  ///< digits of `lo` as written (`01` keeps its zero)
  };
  std::vector<Range> ranges;
};

/// Where a node list came from, for messages: "the Slurm node list" or "started by srun
/// (SLURM_PROCID), but SLURM_JOB_NODELIST=".
struct ListOrigin {
  std::string_view list;
  std::string_view label;
};

[[noreturn]] inline void bad_nodelist(const ListOrigin& o, const std::string& why) {
  throw ConfigError(cat("fourway: ", o.label, "'", o.list, "' is malformed (", why,
                        "); set MASTER_ADDR to rank 0's host instead"));
}

/// `01-04,07` -> ranges.
inline std::vector<Piece::Range> parse_ranges(const ListOrigin& list, std::string_view body) {
  std::vector<Piece::Range> out;
  std::size_t at = 0;
  while (at <= body.size()) {
    const std::size_t comma = std::min(body.find(',', at), body.size());
    const std::string_view r = body.substr(at, comma - at);
    const std::size_t dash = r.find('-');
    const std::string_view lo = r.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : r.substr(dash + 1);
    Piece::Range range{0, 0, lo.size()};
    const auto a = std::from_chars(lo.data(), lo.data() + lo.size(), range.lo);
    const auto b = std::from_chars(hi.data(), hi.data() + hi.size(), range.hi);
    if (lo.empty() || hi.empty() || a.ec != std::errc() || a.ptr != lo.data() + lo.size() ||
        b.ec != std::errc() || b.ptr != hi.data() + hi.size() || range.lo < 0 ||
        range.hi < range.lo) {
      bad_nodelist(list, cat("'", r, "' in [", body, "] is not a number or a range lo-hi"));
    }
    out.push_back(range);
    at = comma + 1;
  }
  return out;
}

/// The items of a node list (split at the commas outside brackets), each as pieces.
inline std::vector<std::vector<Piece>> parse_nodelist(const ListOrigin& origin) {
  const std::string_view list = origin.list;
  if (list.empty()) bad_nodelist(origin, "it is empty");
  std::vector<std::vector<Piece>> items(1);
  std::size_t at = 0;
  while (at < list.size()) {
    const char ch = list[at];
    if (ch == ',') {
      if (items.back().empty()) bad_nodelist(origin, "an empty host name");
      items.emplace_back();
      ++at;
    } else if (ch == '[') {
      const std::size_t close = list.find(']', at);
      if (close == std::string_view::npos) bad_nodelist(origin, "a '[' without its ']'");
      const std::string_view body = list.substr(at + 1, close - at - 1);
      if (body.find('[') != std::string_view::npos) bad_nodelist(origin, "a '[' inside brackets");
      items.back().push_back(Piece{"", parse_ranges(origin, body)});
      at = close + 1;
    } else if (ch == ']') {
      bad_nodelist(origin, "a ']' without its '['");
    } else {
      const std::size_t end = std::min(list.find_first_of(",[]", at), list.size());
      items.back().push_back(Piece{std::string(list.substr(at, end - at)), {}});
      at = end;
    }
  }
  if (items.back().empty()) bad_nodelist(origin, "an empty host name");
  return items;
}

inline std::string padded(std::int64_t v, std::size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

}  // namespace detail::env

/// Every host of a Slurm node list, in Slurm's order: `gpu[01-03,07],login1` -> gpu01, gpu02,
/// gpu03, gpu07, login1. Numbers keep the width written for the range's low end; an item with
/// several brackets (`r[1-2]n[1-2]`) varies its last bracket fastest. Throws ConfigError for a
/// malformed list, or one of more than `max_hosts` hosts.
inline std::vector<std::string> expand_slurm_nodelist(std::string_view list,
                                                      std::size_t max_hosts = 1 << 20) {
  namespace e = detail::env;
  const e::ListOrigin origin{list, "the Slurm node list "};
  std::vector<std::string> hosts;
  const auto too_many = [&](std::size_t n) {
    if (n > max_hosts) e::bad_nodelist(origin, detail::cat("more than ", max_hosts, " hosts"));
  };
  for (const auto& item : e::parse_nodelist(origin)) {
    std::vector<std::string> names{""};
    for (const e::Piece& p : item) {
      std::vector<std::string> next;
      for (const std::string& head : names) {
        if (p.ranges.empty()) next.push_back(head + p.text);
        for (const auto& r : p.ranges) {
          too_many(static_cast<std::size_t>(r.hi - r.lo) + next.size() + 1);
          for (std::int64_t v = r.lo; v <= r.hi; ++v) next.push_back(head + e::padded(v, r.width));
        }
      }
      names = std::move(next);
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
    too_many(hosts.size());
  }
  return hosts;
}

/// The first host of a Slurm node list (where srun starts task 0 under its default block
/// distribution), without expanding the rest. `label` begins the error's message.
inline std::string first_slurm_host(std::string_view list,
                                    std::string_view label = "the Slurm node list ") {
  namespace e = detail::env;
  const auto items = e::parse_nodelist(e::ListOrigin{list, label});
  std::string host;
  for (const e::Piece& p : items.front()) {
    host += p.ranges.empty() ? p.text : e::padded(p.ranges.front().lo, p.ranges.front().width);
  }
  return host;
}

namespace detail::env {

/// Reads variables of one launcher and names them in every error.
class Reader {
 public:
  Reader(const EnvLookup& env, std::string_view launcher) : env_(env), launcher_(launcher) {}

  [[nodiscard]] std::optional<std::string> get(const std::string& name) const { return env_(name); }
  [[nodiscard]] bool has(const std::string& name) const { return env_(name).has_value(); }

  /// A variable the launcher must set.
  [[nodiscard]] std::string text(const std::string& name, std::string_view set_to) const {
    const std::optional<std::string> v = env_(name);
    check<ConfigError>(v.has_value() && !v->empty(), "fourway: started by ", launcher_, ", but ",
                       name, v.has_value() ? " is empty" : " is not set", ": set it to ", set_to);
    return *v;
  }

  /// A whole number in [lo, hi] (decimal digits only: no sign, no space).
  [[nodiscard]] std::int64_t number(const std::string& name, std::string_view set_to,
                                    std::int64_t lo, std::int64_t hi) const {
    const std::string v = text(name, set_to);
    std::int64_t out = 0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), out);
    check<ConfigError>(v.front() != '-' && r.ec == std::errc() && r.ptr == v.data() + v.size(),
                       "fourway: started by ", launcher_, ", but ", name, "='", v,
                       "' is not a whole number: set it to ", set_to);
    check<ConfigError>(out >= lo && out <= hi, "fourway: started by ", launcher_, ", but ", name,
                       "=", out, " is not in ", lo, "..", hi, ": set it to ", set_to);
    return out;
  }

  [[nodiscard]] int port(const std::string& name) const {
    return static_cast<int>(
        number(name, "rank 0's rendezvous port, a free TCP port (1..65535)", 1, 65535));
  }

  /// Rank, size and local rank, checked together.
  void place(LaunchEnv& e, const std::string& rank, const std::string& size,
             const std::string& local) const {
    constexpr std::int64_t most = 1 << 24;
    e.size = static_cast<int>(number(size, "the number of processes (>= 1)", 1, most));
    e.rank = static_cast<int>(number(
        rank, cat("this process's rank, 0..", e.size - 1, " (", size, "=", e.size, ")"), 0, most));
    check<ConfigError>(e.rank < e.size, "fourway: started by ", launcher_, ", but ", rank, "=",
                       e.rank, " is not below ", size, "=", e.size, ": ranks are 0..", e.size - 1,
                       "; start every process with the same ", size, " and a distinct ", rank);
    e.local_rank = static_cast<int>(
        number(local, "this process's index on its node (0 for the first)", 0, e.size - 1));
  }

 private:
  const EnvLookup& env_;
  std::string_view launcher_;
};

}  // namespace detail::env

/// This process's launch, from `env` (see the file comment for what is read and what wins).
/// Without any launcher's variables: `Launcher::none`, rank 0 of 1.
inline LaunchEnv read_launch_env(const EnvLookup& env) {
  namespace e = detail::env;
  LaunchEnv out;
  if (env("RANK") || env("WORLD_SIZE")) {
    const e::Reader r(env,
                      "torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
                      "MASTER_PORT)");
    out.launcher = Launcher::torchrun;
    r.place(out, "RANK", "WORLD_SIZE", "LOCAL_RANK");
    out.master_addr = r.text("MASTER_ADDR", "rank 0's host name or address");
    out.master_port = r.port("MASTER_PORT");
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    const e::Reader r(env, "mpirun (OMPI_COMM_WORLD_RANK)");
    out.launcher = Launcher::mpirun;
    r.place(out, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK");
  } else if (env("SLURM_PROCID")) {
    const e::Reader r(env, "srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID)");
    out.launcher = Launcher::slurm;
    r.place(out, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID");
    if (r.has("MASTER_ADDR")) {
      out.master_addr = r.text("MASTER_ADDR", "rank 0's host name or address");
    } else {
      std::string list_name;
      for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
        if (r.has(name)) {
          list_name = name;
          break;
        }
      }
      check<ConfigError>(!list_name.empty(),
                         "fourway: started by srun (SLURM_PROCID), but none of "
                         "SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set to "
                         "find rank 0's host: set MASTER_ADDR to it");
      const std::string label = detail::cat("started by srun (SLURM_PROCID), but ", list_name, "=");
      out.master_addr = first_slurm_host(r.text(list_name, "the job's node list"), label);
    }
    out.master_port = r.has("MASTER_PORT")
                          ? r.port("MASTER_PORT")
                          : slurm_default_port(r.number(
                                "SLURM_JOB_ID", "the job's id (or set MASTER_PORT to a free port)",
                                0, std::numeric_limits<std::int64_t>::max()));
  }
  return out;
}

/// The rendezvous of a launch: rank 0 listens at MASTER_PORT, the others reach it at
/// MASTER_ADDR, all within `deadline`.
inline RendezvousConfig rendezvous_config(const LaunchEnv& e, std::chrono::milliseconds deadline) {
  check<ConfigError>(e.launcher == Launcher::torchrun || e.launcher == Launcher::slurm,
                     "fourway: a TCP rendezvous needs torchrun-style variables or srun's; this "
                     "process was started by ",
                     launcher_name(e.launcher));
  return RendezvousConfig{e.master_addr, e.master_port, e.rank, e.size, deadline};
}

}  // namespace fourway
