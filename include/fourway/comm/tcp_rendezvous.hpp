//! A TCP rendezvous that carries one fixed-size blob from rank 0 to every other rank: NCCL's
//! 128-byte unique id when the processes were started without MPI (torchrun-style variables,
//! srun; comm/launch_env.hpp). Host code on POSIX sockets; the blob is opaque bytes here.
//!
//!   rank 0: listens on MASTER_PORT (every interface)     rank r > 0: connects to
//!           accepts, reads each hello ---------------->          MASTER_ADDR:MASTER_PORT,
//!           ... until ranks 1..N-1 all said hello                retrying until the deadline,
//!           then answers each: world size + blob ----->          sends its hello, reads the blob
//!
//! The invariants that are not obvious:
//!   - nothing blocks without a deadline: every socket is non-blocking and every wait is a poll()
//!     bounded by what is left of `RendezvousConfig::deadline`; the listener is closed on every
//!     path (an RAII socket, moved out of the server when it serves). Name resolution
//!     (getaddrinfo) has no deadline of its own: it is bounded by the resolver's (resolv.conf's
//!     timeout and attempts); a temporary failure is retried until the deadline.
//!   - rank 0 answers no one before every rank has come, so a rank that holds the blob knows the
//!     whole world assembled (NCCL's init would otherwise wait for the missing rank itself).
//!   - each side checks the other: a magic word and a version, the world size, the rank (in
//!     1..N-1, none twice) and the blob's size. A failure rank 0 sees is also sent to every
//!     connected rank as a typed refusal, so they fail with the same cause instead of a timeout.
//! Every error is typed (CommTimeout for a deadline, ConfigError for a launch that cannot work,
//! CommError for a broken or foreign peer) and names the address, the ranks, what was expected,
//! what came, and the fix.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "fourway/core/error.hpp"

namespace fourway {

/// Where and as whom a process meets the others.
struct RendezvousConfig {
  std::string host;  ///< MASTER_ADDR: rank 0's host name or address, as the other ranks reach it
  int port = 0;      ///< MASTER_PORT (1..65535; RendezvousServer alone takes 0: a free port)
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds deadline{std::chrono::minutes(5)};  ///< for the whole rendezvous
};

namespace detail::tcp {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t magic = 0x46575256;  // "FWRV"
constexpr std::uint32_t version = 1;
/// hello, rank r -> rank 0: magic, version, rank, world size, blob bytes (big-endian 32-bit)
constexpr std::size_t hello_bytes = 20;
/// answer, rank 0 -> rank r: magic, version, status, rank, world size, payload bytes; then the
/// payload: the blob (status ok) or the reason of the refusal (text)
constexpr std::size_t answer_bytes = 24;
constexpr std::size_t max_blob = 65536;
constexpr std::size_t max_reason = 4096;

/// What an answer says; a refusal carries the type of the error rank 0 threw.
enum class Status : std::uint32_t { ok = 0, config_error = 1, comm_error = 2, timeout = 3 };

/// How a message of an error of status `s` begins.
inline const char* prefix(Status s) {
  return s == Status::timeout ? "fourway: CommTimeout: " : "fourway: ";
}

[[noreturn]] inline void raise(Status s, const std::string& what) {
  switch (s) {
    case Status::config_error: throw ConfigError(what);
    case Status::timeout: throw CommTimeout(what);
    default: throw CommError(what);
  }
}

/// A file descriptor closed by its destructor (move-only).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  [[nodiscard]] int get() const { return fd_; }
  [[nodiscard]] bool open() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) (void)::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

inline std::string errno_text(int e) {
  return std::error_code(e, std::generic_category()).message();
}

inline bool set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

inline void put_u32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 24);
  p[1] = static_cast<std::uint8_t>(v >> 16);
  p[2] = static_cast<std::uint8_t>(v >> 8);
  p[3] = static_cast<std::uint8_t>(v);
}
inline std::uint32_t get_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}
inline std::int32_t get_i32(const std::uint8_t* p) { return static_cast<std::int32_t>(get_u32(p)); }

/// The first bytes of what came, in hex and as text: `47 45 54 20 ("GET ")`.
inline std::string preview(const std::uint8_t* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string hex, text;
  const std::size_t shown = std::min<std::size_t>(n, 16);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) hex += ' ';
    hex += digits[p[i] >> 4];
    hex += digits[p[i] & 15];
    text += (p[i] >= 32 && p[i] < 127) ? static_cast<char>(p[i]) : '.';
  }
  return cat(hex, n > shown ? " ..." : "", " (\"", text, "\")");
}

/// Milliseconds left before `until` for poll(): at least 0, rounded up.
inline int ms_left(Clock::time_point until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, 1 << 30));
}

/// Waits until `fd` is ready for `events` or `until` passes (false). Errors count as ready: the
/// call that follows reports them.
inline bool wait_for(int fd, short events, Clock::time_point until) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(until));
    if (r > 0) return true;
    if (r == 0 || (r < 0 && errno != EINTR)) return r < 0;
  }
}

/// How a transfer of a fixed number of bytes ended.
struct Transfer {
  enum class End : std::uint8_t { done, closed, timeout, error } end = End::done;
  std::size_t bytes = 0;  ///< moved before it ended
  int error = 0;          ///< errno, for End::error
};

inline Transfer send_all(int fd, const std::uint8_t* p, std::size_t n, Clock::time_point until) {
  Transfer t;
  while (t.bytes < n) {
    if (!wait_for(fd, POLLOUT, until)) return t.end = Transfer::End::timeout, t;
    const ssize_t k = ::send(fd, p + t.bytes, n - t.bytes, MSG_NOSIGNAL);
    if (k > 0) {
      t.bytes += static_cast<std::size_t>(k);
    } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      t.error = errno;
      return t.end = Transfer::End::error, t;
    }
  }
  return t;
}

inline Transfer recv_all(int fd, std::uint8_t* p, std::size_t n, Clock::time_point until) {
  Transfer t;
  while (t.bytes < n) {
    if (!wait_for(fd, POLLIN, until)) return t.end = Transfer::End::timeout, t;
    const ssize_t k = ::recv(fd, p + t.bytes, n - t.bytes, 0);
    if (k > 0) {
      t.bytes += static_cast<std::size_t>(k);
    } else if (k == 0) {
      return t.end = Transfer::End::closed, t;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      t.error = errno;
      return t.end = Transfer::End::error, t;
    }
  }
  return t;
}

/// `address:port` of a socket address; IPv6 in brackets, IPv4-mapped IPv6 as plain IPv4.
inline std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return cat(buf, ":", ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      ::inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], buf, sizeof(buf));
      return cat(buf, ":", ntohs(in6->sin6_port));
    }
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return cat("[", buf, "]:", ntohs(in6->sin6_port));
  }
  return "an address of family " + std::to_string(sa->sa_family);
}

inline std::string peer_text(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  return address_text(reinterpret_cast<const sockaddr*>(&ss));
}

/// `1-3, 5, 7`: ranks in order, runs folded.
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += j == i ? std::to_string(ranks[i]) : cat(ranks[i], j == i + 1 ? ", " : "-", ranks[j]);
    i = j + 1;
  }
  return s.empty() ? "none" : s;
}

using AddrList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

/// The addresses of `c.host`, retrying a temporary failure (EAI_AGAIN) until `until`.
inline AddrList resolve(const RendezvousConfig& c, const std::string& where,
                        Clock::time_point until) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(c.port);
  for (;;) {
    addrinfo* list = nullptr;
    const int e = ::getaddrinfo(c.host.c_str(), port.c_str(), &hints, &list);
    if (e == 0) return {list, &::freeaddrinfo};
    if (e != EAI_AGAIN || Clock::now() >= until) {
      throw ConfigError(cat("fourway: ", where, ": cannot resolve the host '", c.host,
                            "' (MASTER_ADDR): ", ::gai_strerror(e),
                            "; set MASTER_ADDR to rank 0's host name or IP address, one every "
                            "rank can resolve (under srun: the first host of the node list)"));
    }
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(100), until - Clock::now()));
  }
}

inline std::string where(const RendezvousConfig& c) {
  return cat("TCP rendezvous at ", c.host, ":", c.port, " (rank ", c.rank, " of ", c.size, ")");
}

/// The checks both halves make of their own configuration.
inline void check_config(const RendezvousConfig& c, std::size_t blob_bytes, bool listening) {
  const std::string w = where(c);
  check<ConfigError>(c.size >= 1 && c.rank >= 0 && c.rank < c.size, "fourway: ", w, ": rank ",
                     c.rank, " is not a rank of a world of ", c.size,
                     " (ranks are 0..size-1); check RANK and WORLD_SIZE");
  check<ConfigError>(c.port >= (listening ? 0 : 1) && c.port <= 65535, "fourway: ", w, ": port ",
                     c.port, " is not a TCP port; set MASTER_PORT to 1..65535");
  check<ConfigError>(!c.host.empty(), "fourway: ", w,
                     ": no host; set MASTER_ADDR to rank 0's host name or address");
  check<ConfigError>(c.deadline.count() > 0, "fourway: ", w, ": deadline ", c.deadline.count(),
                     " ms; give it a positive deadline");
  check<ConfigError>(blob_bytes >= 1 && blob_bytes <= max_blob, "fourway: ", w, ": a blob of ",
                     blob_bytes, " bytes; the rendezvous carries 1..", max_blob);
}

/// An answer's header (the payload follows it).
inline std::array<std::uint8_t, answer_bytes> answer_header(Status s, int rank, int size,
                                                            std::size_t payload) {
  std::array<std::uint8_t, answer_bytes> h{};
  put_u32(h.data(), magic);
  put_u32(h.data() + 4, version);
  put_u32(h.data() + 8, static_cast<std::uint32_t>(s));
  put_u32(h.data() + 12, static_cast<std::uint32_t>(rank));
  put_u32(h.data() + 16, static_cast<std::uint32_t>(size));
  put_u32(h.data() + 20, static_cast<std::uint32_t>(payload));
  return h;
}

/// A non-blocking socket listening on every interface of `family` at `port`, or a closed one and
/// the reason in `error`.
inline Socket listen_on(int family, int port, std::string& error) {
  Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.open()) return error = errno_text(errno), Socket();
  const int one = 1, zero = 0;
  (void)::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage ss{};
  socklen_t len = 0;
  const auto p = htons(static_cast<std::uint16_t>(port));
  if (family == AF_INET6) {
    (void)::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 too
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = p;
    len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = p;
    len = sizeof(sockaddr_in);
  }
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
      ::listen(s.get(), SOMAXCONN) != 0 || !set_nonblocking(s.get())) {
    return error = errno_text(errno), Socket();
  }
  return s;
}

}  // namespace detail::tcp

/// Rank 0's half: listens from construction (so a caller may learn the port first), serves the
/// blob once every rank has come.
class RendezvousServer {
 public:
  /// Listens on every interface at `c.port` (0: a free port, which `port()` then names): an IPv6
  /// socket that takes IPv4 too, else IPv4 alone. Throws CommError when the port cannot be bound
  /// (another program holds it). `c.host` must resolve here too, so a MASTER_ADDR that names no
  /// host fails on rank 0 as on the others.
  explicit RendezvousServer(RendezvousConfig c) : c_(std::move(c)) {
    namespace t = detail::tcp;
    t::check_config(c_, 1, true);
    check<ConfigError>(c_.rank == 0, "fourway: ", t::where(c_),
                       ": only rank 0 listens; ranks 1..N-1 call rendezvous_connect");
    (void)t::resolve(c_, t::where(c_), t::Clock::now() + c_.deadline);
    std::string v6_error, v4_error;
    listener_ = t::listen_on(AF_INET6, c_.port, v6_error);
    if (!listener_.open()) listener_ = t::listen_on(AF_INET, c_.port, v4_error);
    check<CommError>(listener_.open(), "fourway: ", t::where(c_), ": rank 0 cannot listen on port ",
                     c_.port, " of every interface (IPv6: ", v6_error, "; IPv4: ", v4_error,
                     "); if another program or an earlier run holds MASTER_PORT ", c_.port,
                     ", give every rank a free one");
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    check<CommError>(::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len) == 0,
                     "fourway: ", t::where(c_), ": getsockname failed: ", t::errno_text(errno));
    port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    c_.port = port_;
  }

  /// The port it listens on.
  [[nodiscard]] int port() const { return port_; }

  /// Waits until ranks 1..size-1 have each said hello, then sends each the world size and `blob`.
  /// Throws CommTimeout naming the ranks that have not come by the deadline; ConfigError for a
  /// rank started for another world size, out of range, come twice, or expecting another blob
  /// size; CommError for a malformed hello or a rank gone before its answer. Every connected
  /// rank is told why. The listener is closed when this returns or throws: it serves once.
  void serve(std::span<const std::byte> blob) {
    namespace t = detail::tcp;
    t::check_config(c_, blob.size(), true);
    check<ConfigError>(listener_.open(), "fourway: ", t::where(c_),
                       ": serve() was called twice; a server serves once");
    const t::Socket listener = std::move(listener_);
    const auto start = t::Clock::now();
    const auto until = start + c_.deadline;
    peers_.clear();
    who_.assign(static_cast<std::size_t>(c_.size), -1);
    int arrived = 0;
    while (arrived < c_.size - 1) {
      if (t::Clock::now() >= until) fail(t::Status::timeout, timeout_text(start));
      std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
      std::vector<std::size_t> polled;
      for (std::size_t i = 0; i < peers_.size(); ++i) {
        if (peers_[i].socket.open() && peers_[i].got < t::hello_bytes) {
          fds.push_back({peers_[i].socket.get(), POLLIN, 0});
          polled.push_back(i);
        }
      }
      const int r = ::poll(fds.data(), fds.size(), t::ms_left(until));
      if (r < 0 && errno != EINTR) {
        fail(t::Status::comm_error, detail::cat("poll failed: ", t::errno_text(errno)));
      }
      if (r <= 0) continue;
      for (std::size_t k = 0; k < polled.size(); ++k) {
        if (fds[k + 1].revents != 0 && read_hello(polled[k], blob.size())) ++arrived;
      }
      if (fds[0].revents != 0) accept_all(listener.get());
    }
    for (int rank = 1; rank < c_.size; ++rank) {
      Peer& p = peers_[static_cast<std::size_t>(who_[static_cast<std::size_t>(rank)])];
      const auto head = t::answer_header(t::Status::ok, rank, c_.size, blob.size());
      t::Transfer s = t::send_all(p.socket.get(), head.data(), head.size(), until);
      if (s.end == t::Transfer::End::done) {
        s = t::send_all(p.socket.get(), reinterpret_cast<const std::uint8_t*>(blob.data()),
                        blob.size(), until);
      }
      if (s.end != t::Transfer::End::done) {
        const bool late = s.end == t::Transfer::End::timeout;
        fail(late ? t::Status::timeout : t::Status::comm_error,
             detail::cat("every rank came, but sending the ", blob.size(), "-byte blob to rank ",
                         rank, " at ", p.address, " failed (",
                         late ? "the deadline passed" : t::errno_text(s.error),
                         "); that rank has gone: see its own error"));
      }
    }
    peers_.clear();  // closes the connections once every answer is queued
  }

 private:
  struct Peer {
    detail::tcp::Socket socket;
    std::string address;
    std::array<std::uint8_t, detail::tcp::hello_bytes> hello{};
    std::size_t got = 0;  ///< bytes of the hello received
  };

  /// Takes every pending connection.
  void accept_all(int listener) {
    namespace t = detail::tcp;
    for (;;) {
      t::Socket s(::accept(listener, nullptr, nullptr));
      if (!s.open()) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        fail(t::Status::comm_error, detail::cat("accept failed: ", t::errno_text(errno)));
      }
      (void)::fcntl(s.get(), F_SETFD, FD_CLOEXEC);
      if (!t::set_nonblocking(s.get())) {
        fail(t::Status::comm_error,
             detail::cat("cannot make a connection non-blocking: ", t::errno_text(errno)));
      }
      std::string address = t::peer_text(s.get());
      peers_.push_back(Peer{std::move(s), std::move(address)});
    }
  }

  /// Reads what peer `i` sent; true when that completes a hello that passes every check. A peer
  /// that closes before sending a byte is dropped (a port probe), any other fault fails.
  bool read_hello(std::size_t i, std::size_t blob_bytes) {
    namespace t = detail::tcp;
    Peer& p = peers_[i];
    const ssize_t k = ::recv(p.socket.get(), p.hello.data() + p.got, t::hello_bytes - p.got, 0);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (k <= 0) {
      const std::string why =
          k == 0 ? std::string("closed the connection") : "failed (" + t::errno_text(errno) + ")";
      if (p.got == 0) return p.socket.reset(), false;
      fail(t::Status::comm_error,
           detail::cat("the connection from ", p.address, " ", why, " after ", p.got, " of the ",
                       t::hello_bytes, " bytes of a hello: ", t::preview(p.hello.data(), p.got),
                       "; a rank that dies while connecting, or another program on MASTER_PORT ",
                       c_.port));
    }
    p.got += static_cast<std::size_t>(k);
    if (p.got >= 4 && t::get_u32(p.hello.data()) != t::magic) {
      fail(t::Status::comm_error, detail::cat("garbage from ", p.address,
                                              ": expected a fourway hello (magic 46 57 52 56, "
                                              "\"FWRV\"), got ",
                                              t::preview(p.hello.data(), p.got),
                                              "; another program is connecting to MASTER_PORT ",
                                              c_.port, ": give this job a port nothing else uses"));
    }
    if (p.got < t::hello_bytes) return false;
    const std::uint32_t v = t::get_u32(p.hello.data() + 4);
    const int rank = t::get_i32(p.hello.data() + 8);
    const int size = t::get_i32(p.hello.data() + 12);
    const std::uint32_t bytes = t::get_u32(p.hello.data() + 16);
    if (v != t::version) {
      fail(t::Status::comm_error,
           detail::cat(p.address, " speaks rendezvous version ", v, ", rank 0 speaks version ",
                       t::version, ": run the same fourway build on every rank"));
    }
    if (size != c_.size) {
      fail(t::Status::config_error,
           detail::cat("rank ", rank, " at ", p.address, " was started for a world of ", size,
                       " ranks, rank 0 for ", c_.size,
                       ": start every rank with the same WORLD_SIZE (SLURM_NTASKS); or a rank of "
                       "another job uses MASTER_PORT ",
                       c_.port));
    }
    if (rank == 0) {
      fail(t::Status::config_error,
           detail::cat(p.address,
                       " says it is rank 0, but rank 0 is the process listening here: "
                       "rank 0 came twice; every process needs a distinct RANK "
                       "(SLURM_PROCID) in 0..",
                       c_.size - 1));
    }
    if (rank < 1 || rank >= c_.size) {
      fail(t::Status::config_error,
           detail::cat(p.address, " says it is rank ", rank, ", not in 1..", c_.size - 1,
                       " of a world of ", c_.size,
                       ": give every process a RANK (SLURM_PROCID) in 0..", c_.size - 1));
    }
    int& slot = who_[static_cast<std::size_t>(rank)];
    if (slot >= 0) {
      fail(t::Status::config_error,
           detail::cat("rank ", rank, " came twice: from ",
                       peers_[static_cast<std::size_t>(slot)].address, " and from ", p.address,
                       "; every process needs a distinct RANK (SLURM_PROCID) in 0..", c_.size - 1));
    }
    if (bytes != blob_bytes) {
      fail(t::Status::config_error,
           detail::cat("rank ", rank, " at ", p.address, " expects a ", bytes,
                       "-byte blob, rank 0 serves ", blob_bytes,
                       " bytes: run the same fourway build on every rank"));
    }
    slot = static_cast<int>(i);
    return true;
  }

  /// The timeout's text: who never came, who came, and who sent part of a hello.
  [[nodiscard]] std::string timeout_text(detail::tcp::Clock::time_point start) const {
    namespace t = detail::tcp;
    std::vector<int> missing, came;
    for (int r = 1; r < c_.size; ++r) {
      (who_[static_cast<std::size_t>(r)] < 0 ? missing : came).push_back(r);
    }
    std::string partial;
    for (const Peer& p : peers_) {
      if (p.socket.open() && p.got > 0 && p.got < t::hello_bytes) {
        partial += detail::cat(partial.empty() ? "; part of a hello from " : ", ", p.address, " (",
                               p.got, " of ", t::hello_bytes, " bytes)");
      }
    }
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(t::Clock::now() - start).count();
    return detail::cat(
        "waited ", waited, " ms (deadline ", c_.deadline.count(), " ms) for rank",
        missing.size() == 1 ? " " : "s ", t::rank_list(missing), " of ", c_.size,
        ": never came (came: ", t::rank_list(came), partial,
        "). Start every rank with the same MASTER_ADDR and MASTER_PORT, and check that port ",
        c_.port,
        " of this host is reachable from theirs; if they only start late, raise "
        "the deadline (--comm-timeout)");
  }

  /// Tells every connected peer `what` (best effort: a refusal must not block) and throws it.
  [[noreturn]] void fail(detail::tcp::Status status, const std::string& what) {
    namespace t = detail::tcp;
    const std::string reason = what.substr(0, t::max_reason);
    for (Peer& p : peers_) {
      if (!p.socket.open()) continue;
      const int rank = p.got == t::hello_bytes ? t::get_i32(p.hello.data() + 8) : -1;
      auto message = t::answer_header(status, rank, c_.size, reason.size());
      (void)::send(p.socket.get(), message.data(), message.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)::send(p.socket.get(), reason.data(), reason.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    peers_.clear();
    t::raise(status, detail::cat(t::prefix(status), t::where(c_), ": ", what));
  }

  RendezvousConfig c_;
  detail::tcp::Socket listener_;
  int port_ = 0;
  std::vector<Peer> peers_;
  std::vector<int> who_;  ///< the peer of each rank, -1 until it came
};

namespace detail::tcp {

/// A connection to `c.host:c.port`, retried (10 ms, doubling to 500 ms) until `until`.
inline Socket connect_with_retries(const RendezvousConfig& c, const addrinfo* list,
                                   Clock::time_point start, Clock::time_point until) {
  int attempts = 0;
  std::string last = "no address";
  auto pause = std::chrono::milliseconds(10);
  for (;;) {
    for (const addrinfo* a = list; a != nullptr && Clock::now() < until; a = a->ai_next) {
      ++attempts;
      Socket s(::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (!s.open() || !set_nonblocking(s.get())) {
        last = errno_text(errno);
        continue;
      }
      if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
          last = errno_text(errno);
          continue;
        }
        if (!wait_for(s.get(), POLLOUT, until)) {
          last = "no answer to the connection request";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err != 0) {
          last = errno_text(err);
          continue;
        }
      }
      // On loopback a connection to a port nobody listens on can meet itself (TCP's
      // simultaneous open, when the port is in the ephemeral range): not rank 0.
      sockaddr_storage self{};
      socklen_t len = sizeof(self);
      if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&self), &len) == 0 &&
          address_text(reinterpret_cast<const sockaddr*>(&self)) == peer_text(s.get())) {
        last = "the connection met itself (nothing listens on the port)";
        continue;
      }
      return s;
    }
    if (Clock::now() >= until) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, until - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  throw CommTimeout(detail::cat("fourway: CommTimeout: ", where(c), ": could not reach rank 0 at ",
                                c.host, ":", c.port, " in ", waited, " ms (deadline ",
                                c.deadline.count(), " ms; ", attempts,
                                " attempts, the last: ", last,
                                "). Is rank 0 running, started with the same MASTER_ADDR and "
                                "MASTER_PORT? Check that ",
                                c.host, " names rank 0's host and that port ", c.port,
                                " is open between the hosts; if rank 0 only starts late, raise the "
                                "deadline (--comm-timeout)"));
}

/// What a transfer that did not finish means, for a message.
inline std::string transfer_text(const Transfer& t, std::size_t n, const char* what) {
  switch (t.end) {
    case Transfer::End::timeout: return detail::cat("no ", what, " within the deadline");
    case Transfer::End::closed:
      return detail::cat("the connection closed after ", t.bytes, " of ", n, " bytes of the ",
                         what);
    default: return detail::cat(what, " failed: ", errno_text(t.error));
  }
}

/// Throws for a transfer that did not finish: CommTimeout past the deadline, else CommError.
[[noreturn]] inline void transfer_failed(const Transfer& t, std::size_t n, const char* what,
                                         const std::string& context) {
  const Status s = t.end == Transfer::End::timeout ? Status::timeout : Status::comm_error;
  raise(s, detail::cat(prefix(s), context, transfer_text(t, n, what)));
}

}  // namespace detail::tcp

/// Rank r > 0's half: connects to rank 0 at `c.host:c.port` (retrying until the deadline), says
/// hello, and receives rank 0's blob into `blob` (both sides must agree on its size). Throws
/// CommTimeout when rank 0 cannot be reached or does not answer by the deadline, ConfigError
/// when the host does not resolve or rank 0 refuses the launch (its reason and type are kept),
/// CommError for an answer that is not a fourway rendezvous.
inline void rendezvous_connect(const RendezvousConfig& c, std::span<std::byte> blob) {
  namespace t = detail::tcp;
  t::check_config(c, blob.size(), false);
  const std::string w = t::where(c);
  check<ConfigError>(c.rank != 0, "fourway: ", w,
                     ": rank 0 serves (RendezvousServer); rendezvous_connect is for ranks 1..N-1");
  const auto start = t::Clock::now();
  const auto until = start + c.deadline;
  const t::AddrList addresses = t::resolve(c, w, until);
  const t::Socket s = t::connect_with_retries(c, addresses.get(), start, until);
  std::string at = detail::cat("rank 0 at ", c.host, ":", c.port);
  if (const std::string peer = t::peer_text(s.get()); peer != detail::cat(c.host, ":", c.port)) {
    at += " (" + peer + ")";
  }

  std::array<std::uint8_t, t::hello_bytes> hello{};
  t::put_u32(hello.data(), t::magic);
  t::put_u32(hello.data() + 4, t::version);
  t::put_u32(hello.data() + 8, static_cast<std::uint32_t>(c.rank));
  t::put_u32(hello.data() + 12, static_cast<std::uint32_t>(c.size));
  t::put_u32(hello.data() + 16, static_cast<std::uint32_t>(blob.size()));
  const t::Transfer sent = t::send_all(s.get(), hello.data(), hello.size(), until);
  if (sent.end != t::Transfer::End::done) {
    t::transfer_failed(sent, hello.size(), "hello",
                       detail::cat(w, ": connected to ", at, ", but "));
  }

  std::array<std::uint8_t, t::answer_bytes> head{};
  const t::Transfer got = t::recv_all(s.get(), head.data(), head.size(), until);
  const bool foreign = (got.bytes >= 4 && t::get_u32(head.data()) != t::magic) ||
                       (got.bytes >= 8 && t::get_u32(head.data() + 4) != t::version);
  if (foreign) {
    throw CommError(
        detail::cat("fourway: ", w, ": garbage from ", at,
                    ": expected a fourway answer (magic 46 57 52 56 \"FWRV\", version ", t::version,
                    "), got ", t::preview(head.data(), got.bytes),
                    "; another program (or another fourway build) listens on MASTER_PORT ", c.port,
                    ": give this job a port nothing else uses"));
  }
  if (got.end == t::Transfer::End::timeout) {
    throw CommTimeout(
        detail::cat("fourway: CommTimeout: ", w, ": connected to ", at, ", but no answer in ",
                    c.deadline.count(),
                    " ms: rank 0 answers once every rank has come, so a rank is missing "
                    "or late (rank 0's own error names it); if they only start late, "
                    "raise the deadline (--comm-timeout)"));
  }
  if (got.end != t::Transfer::End::done) {
    throw CommError(detail::cat("fourway: ", w, ": connected to ", at, ", but ",
                                t::transfer_text(got, head.size(), "answer"),
                                ": rank 0 failed or ended (see its own error)"));
  }
  const auto status = static_cast<t::Status>(t::get_u32(head.data() + 8));
  const int rank = t::get_i32(head.data() + 12);
  const int size = t::get_i32(head.data() + 16);
  const std::size_t length = t::get_u32(head.data() + 20);
  if (status != t::Status::ok) {
    const bool known = status == t::Status::config_error || status == t::Status::comm_error ||
                       status == t::Status::timeout;
    check<CommError>(known && length <= t::max_reason, "fourway: ", w, ": garbage from ", at,
                     ": an answer of status ", static_cast<std::uint32_t>(status), " with ", length,
                     " bytes of reason; run the same fourway build on every rank");
    std::string reason(length, '\0');
    const t::Transfer r =
        t::recv_all(s.get(), reinterpret_cast<std::uint8_t*>(reason.data()), length, until);
    reason.resize(r.bytes);
    t::raise(status, detail::cat(t::prefix(status), w, ": ", at, " refused this rank: ", reason));
  }
  check<ConfigError>(rank == c.rank && size == c.size, "fourway: ", w, ": ", at, " answered rank ",
                     rank, " of a world of ", size, ", but this is rank ", c.rank, " of ", c.size,
                     ": run the same fourway build on every rank");
  check<ConfigError>(length == blob.size(), "fourway: ", w, ": ", at, " sends a ", length,
                     "-byte blob, this rank expects ", blob.size(),
                     " bytes: run the same fourway build on every rank");
  const t::Transfer body =
      t::recv_all(s.get(), reinterpret_cast<std::uint8_t*>(blob.data()), blob.size(), until);
  if (body.end != t::Transfer::End::done) {
    t::transfer_failed(body, blob.size(), "blob", detail::cat(w, ": ", at, " answered, but "));
  }
}

/// Both halves: rank 0 serves `blob` to the others, which receive it into theirs. A world of one
/// rank has nothing to share and opens no socket.
inline void tcp_rendezvous(const RendezvousConfig& c, std::span<std::byte> blob) {
  detail::tcp::check_config(c, blob.size(), false);
  if (c.size == 1) return;
  if (c.rank == 0) {
    RendezvousServer server(c);
    server.serve(blob);
  } else {
    rendezvous_connect(c, blob);
  }
}

}  // namespace fourway
