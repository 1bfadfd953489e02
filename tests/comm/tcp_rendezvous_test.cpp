// The TCP rendezvous that carries NCCL's unique id without MPI (comm/tcp_rendezvous.hpp), with
// real processes on 127.0.0.1: each rank is a forked child with its own sockets, which reports
// what it got (the blob, or the error's type, text and time) through a pipe. The blob rank 0
// serves is random per run, so only a rendezvous that really carries it passes. Deadlines are
// about 1 s; a child that outlives 10 s is killed and reported as hung.
#include "fourway/comm/tcp_rendezvous.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fw = fourway;
using namespace std::chrono_literals;

namespace {

using Blob = std::vector<std::byte>;
using Clock = std::chrono::steady_clock;

constexpr std::size_t id_bytes = 128;  // sizeof(ncclUniqueId)

/// What one process did: "ok" with the blob it holds, or the error's type and text.
struct Outcome {
  std::string kind;  // ok, ConfigError, CommTimeout, CommError, other, hung
  double seconds = 0;
  Blob blob;
  std::string what;
};

Blob random_blob(std::size_t n = id_bytes) {
  std::random_device rd;
  std::mt19937 gen(rd());
  Blob b(n);
  for (auto& x : b) x = static_cast<std::byte>(gen() & 0xff);
  return b;
}

/// A port nothing listens on now (bound to port 0 and closed).
int free_port() {
  fw::detail::tcp::Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  return ntohs(a.sin_port);
}

fw::RendezvousConfig config(int port, int rank, int size, std::chrono::milliseconds deadline) {
  return fw::RendezvousConfig{"127.0.0.1", port, rank, size, deadline};
}

/// A forked process running `fn`; `result()` waits for it (at most 10 s, then kills it).
class Process {
 public:
  explicit Process(const std::function<Blob()>& fn) {
    std::fflush(nullptr);
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      Outcome o;
      const auto t0 = Clock::now();
      try {
        o.blob = fn();
        o.kind = "ok";
      } catch (const fw::CommTimeout& e) {
        o = {"CommTimeout", 0, {}, e.what()};
      } catch (const fw::CommError& e) {
        o = {"CommError", 0, {}, e.what()};
      } catch (const fw::ConfigError& e) {
        o = {"ConfigError", 0, {}, e.what()};
      } catch (const std::exception& e) {
        o = {"other", 0, {}, e.what()};
      }
      o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      std::string out = o.kind + "\n" + std::to_string(o.seconds) + "\n";
      for (std::byte b : o.blob) out += static_cast<char>(b);
      out = std::to_string(o.blob.size()) + "\n" + out + o.what;
      const char* p = out.data();
      std::size_t left = out.size();
      while (left > 0) {
        const ssize_t k = ::write(fds[1], p, left);
        if (k <= 0) break;
        p += k;
        left -= static_cast<std::size_t>(k);
      }
      ::_exit(0);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() { (void)result(); }

  const Outcome& result() {
    if (done_) return outcome_;
    done_ = true;
    std::string in;
    const auto until = Clock::now() + 10s;
    char buf[4096];
    bool eof = false;
    while (!eof && Clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t k = ::read(fd_, buf, sizeof(buf));
      if (k <= 0) eof = true;
      if (k > 0) in.append(buf, static_cast<std::size_t>(k));
    }
    if (!eof) ::kill(pid_, SIGKILL);
    ::close(fd_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    if (!eof) return outcome_ = {"hung", 10, {}, "killed after 10 s"};
    // size \n kind \n seconds \n blob what
    std::size_t a = in.find('\n'), b = in.find('\n', a + 1), c = in.find('\n', b + 1);
    if (a == std::string::npos || b == std::string::npos || c == std::string::npos) {
      return outcome_ = {"crashed", 0, {}, "exit status " + std::to_string(status) + ": " + in};
    }
    const std::size_t n = std::stoul(in.substr(0, a));
    outcome_.kind = in.substr(a + 1, b - a - 1);
    outcome_.seconds = std::stod(in.substr(b + 1, c - b - 1));
    for (std::size_t i = 0; i < n; ++i)
      outcome_.blob.push_back(static_cast<std::byte>(in[c + 1 + i]));
    outcome_.what = in.substr(c + 1 + n);
    return outcome_;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool done_ = false;
  Outcome outcome_;
};

/// Rank `rank` of `size` through `tcp_rendezvous`, its blob filled with 0xee before.
std::function<Blob()> rank_fn(int port, int rank, int size, std::chrono::milliseconds deadline,
                              const Blob& served = {}) {
  return [=] {
    Blob b = rank == 0 ? served : Blob(served.empty() ? id_bytes : served.size(), std::byte{0xee});
    fw::tcp_rendezvous(config(port, rank, size, deadline), b);
    return b;
  };
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// `o` is an error of type `kind` whose message holds every one of `parts`.
void expect_error(const Outcome& o, const std::string& kind,
                  std::initializer_list<std::string> parts) {
  EXPECT_EQ(o.kind, kind) << o.what;
  for (const std::string& p : parts)
    EXPECT_TRUE(has(o.what, p)) << "no '" << p << "' in " << o.what;
}

void every_rank_gets_rank_zeros_blob(int size) {
  const int port = free_port();
  const Blob blob = random_blob();
  std::vector<std::unique_ptr<Process>> ranks(static_cast<std::size_t>(size));
  // the odd ranks before rank 0 (they retry until it listens), the even ones after
  for (int r = 1; r < size; r += 2)
    ranks[r] = std::make_unique<Process>(rank_fn(port, r, size, 5s));
  std::this_thread::sleep_for(100ms);
  ranks[0] = std::make_unique<Process>(rank_fn(port, 0, size, 5s, blob));
  for (int r = 2; r < size; r += 2)
    ranks[r] = std::make_unique<Process>(rank_fn(port, r, size, 5s));
  for (int r = 0; r < size; ++r) {
    const Outcome& o = ranks[r]->result();
    ASSERT_EQ(o.kind, "ok") << "rank " << r << ": " << o.what;
    EXPECT_EQ(o.blob, blob) << "rank " << r << " does not hold rank 0's blob";
    EXPECT_LT(o.seconds, 3.0) << "rank " << r;
  }
}

TEST(TcpRendezvous, TwoRanksEachHoldRankZerosBlobBitForBit) { every_rank_gets_rank_zeros_blob(2); }

TEST(TcpRendezvous, FourRanksEachHoldRankZerosBlobBitForBit) { every_rank_gets_rank_zeros_blob(4); }

TEST(TcpRendezvous, AWorldOfOneOpensNoSocketAndKeepsItsBlob) {
  Blob b = random_blob();
  const Blob before = b;
  // port 1 would need root to listen on: a world of one must not try
  fw::tcp_rendezvous(config(1, 0, 1, 1000ms), b);
  EXPECT_EQ(b, before);
}

TEST(TcpRendezvous, ARankThatNeverComesTimesOutOnRankZeroNamingIt) {
  // Deadline 1 s. The bound is the deadline + 10%, plus 0.3 s for a loaded CI machine (as the
  // LocalWorld timeout tests).
  constexpr auto deadline = 1000ms;
  const int port = free_port();
  Process zero(rank_fn(port, 0, 3, deadline, random_blob()));
  Process one(rank_fn(port, 1, 3, 3 * deadline));  // waits longer: it hears rank 0's reason
  const Outcome& o = zero.result();
  const std::string at = "127.0.0.1:" + std::to_string(port);
  expect_error(o, "CommTimeout",
               {"fourway: CommTimeout: TCP rendezvous at " + at + " (rank 0 of 3)",
                "for rank 2 of 3: never came (came: 1)", "MASTER_PORT"});
  EXPECT_GE(o.seconds, 1.0) << o.what;
  EXPECT_LE(o.seconds, 1.0 * 1.1 + 0.3) << o.what;
  // rank 1 came: rank 0 tells it why nobody gets the id
  const Outcome& p = one.result();
  expect_error(p, "CommTimeout", {"refused this rank", "for rank 2 of 3: never came"});
  EXPECT_LE(p.seconds, 1.0 * 1.1 + 0.3) << p.what;
}

TEST(TcpRendezvous, WithoutRankZeroEveryRankTimesOutNamingTheAddress) {
  constexpr auto deadline = 1000ms;
  const int port = free_port();  // nothing listens there
  Process one(rank_fn(port, 1, 3, deadline));
  Process two(rank_fn(port, 2, 3, deadline));
  const std::string at = "127.0.0.1:" + std::to_string(port);
  for (Process* p : {&one, &two}) {
    const Outcome& o = p->result();
    expect_error(o, "CommTimeout",
                 {"could not reach rank 0 at " + at, "Connection refused",
                  "same MASTER_ADDR and MASTER_PORT"});
    EXPECT_GE(o.seconds, 1.0) << o.what;
    EXPECT_LE(o.seconds, 1.0 * 1.1 + 0.3) << o.what;
  }
}

/// A raw connection from this process: its local address, and it sends `bytes`.
struct RawClient {
  fw::detail::tcp::Socket s;
  std::string address;
};
RawClient raw_connect(int port, const std::string& bytes) {
  RawClient c{fw::detail::tcp::Socket(::socket(AF_INET, SOCK_STREAM, 0)), {}};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const auto until = Clock::now() + 3s;
  while (::connect(c.s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 &&
         Clock::now() < until) {
    c.s = fw::detail::tcp::Socket(::socket(AF_INET, SOCK_STREAM, 0));
    std::this_thread::sleep_for(20ms);
  }
  sockaddr_in self{};
  socklen_t len = sizeof(self);
  ::getsockname(c.s.get(), reinterpret_cast<sockaddr*>(&self), &len);
  c.address = "127.0.0.1:" + std::to_string(ntohs(self.sin_port));
  EXPECT_EQ(::send(c.s.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  return c;
}

TEST(TcpRendezvous, GarbageFromAPeerFailsRankZeroNamingThePeer) {
  const int port = free_port();
  Process zero(rank_fn(port, 0, 2, 3000ms, random_blob()));
  const RawClient http = raw_connect(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  const Outcome& o = zero.result();
  // what came: "GET " in hex
  expect_error(
      o, "CommError",
      {"garbage from " + http.address, "47 45 54 20", "MASTER_PORT " + std::to_string(port)});
  EXPECT_LT(o.seconds, 2.0) << "garbage must fail at once, not at the deadline: " << o.what;
}

TEST(TcpRendezvous, GarbageInsteadOfRankZerosAnswerIsATypedErrorNamingTheAddress) {
  const int port = free_port();
  // a stand-in "rank 0" that is another program: it reads the hello and answers HTTP
  Process impostor([port]() -> Blob {
    std::string err;
    fw::detail::tcp::Socket l = fw::detail::tcp::listen_on(AF_INET, port, err);
    if (!l.open()) throw std::runtime_error("impostor cannot listen: " + err);
    const auto until = Clock::now() + 3s;
    if (!fw::detail::tcp::wait_for(l.get(), POLLIN, until)) throw std::runtime_error("no client");
    fw::detail::tcp::Socket c(::accept(l.get(), nullptr, nullptr));
    std::uint8_t hello[fw::detail::tcp::hello_bytes];
    (void)fw::detail::tcp::recv_all(c.get(), hello, sizeof(hello), until);
    const std::string reply = "HTTP/1.1 400 Bad Request\r\n\r\n";
    (void)fw::detail::tcp::send_all(c.get(), reinterpret_cast<const std::uint8_t*>(reply.data()),
                                    reply.size(), until);
    return {};
  });
  Process one(rank_fn(port, 1, 2, 2000ms));
  const Outcome& o = one.result();
  expect_error(
      o, "CommError",
      {"garbage from rank 0 at 127.0.0.1:" + std::to_string(port), "48 54 54 50"});  // HTTP
  EXPECT_LT(o.seconds, 1.5) << o.what;
  EXPECT_EQ(impostor.result().kind, "ok") << impostor.result().what;
}

TEST(TcpRendezvous, AWrongWorldSizeIsRefusedOnBothSides) {
  const int port = free_port();
  Process zero(rank_fn(port, 0, 2, 3000ms, random_blob()));
  Process one(rank_fn(port, 1, 3, 3000ms));  // started for a world of 3
  const Outcome& o = zero.result();
  expect_error(o, "ConfigError",
               {"TCP rendezvous at 127.0.0.1:" + std::to_string(port), "rank 1 at 127.0.0.1:",
                "was started for a world of 3 ranks, rank 0 for 2", "same WORLD_SIZE"});
  EXPECT_LT(o.seconds, 2.0) << o.what;
  expect_error(one.result(), "ConfigError",
               {"refused this rank", "was started for a world of 3 ranks, rank 0 for 2"});
}

TEST(TcpRendezvous, ARankThatComesTwiceIsRefusedNamingBothAddresses) {
  const int port = free_port();
  Process zero(rank_fn(port, 0, 3, 3000ms, random_blob()));
  Process first(rank_fn(port, 1, 3, 3000ms));
  Process second(rank_fn(port, 1, 3, 3000ms));
  const Outcome& o = zero.result();
  expect_error(o, "ConfigError",
               {"rank 1 came twice: from 127.0.0.1:", " and from 127.0.0.1:", "distinct RANK"});
  EXPECT_LT(o.seconds, 2.0) << o.what;
  for (Process* p : {&first, &second}) {
    expect_error(p->result(), "ConfigError", {"refused this rank", "rank 1 came twice"});
  }
}

TEST(TcpRendezvous, ASecondRankZeroIsRefused) {
  const int port = free_port();
  Process zero(rank_fn(port, 0, 2, 3000ms, random_blob()));
  Process other([port]() -> Blob {  // another process that believes it is rank 0, connecting
    const auto until = Clock::now() + 2s;
    std::uint8_t hello[fw::detail::tcp::hello_bytes];
    fw::detail::tcp::put_u32(hello, fw::detail::tcp::magic);
    fw::detail::tcp::put_u32(hello + 4, fw::detail::tcp::version);
    fw::detail::tcp::put_u32(hello + 8, 0);
    fw::detail::tcp::put_u32(hello + 12, 2);
    fw::detail::tcp::put_u32(hello + 16, id_bytes);
    const RawClient c =
        raw_connect(port, std::string(reinterpret_cast<const char*>(hello), sizeof(hello)));
    std::uint8_t head[fw::detail::tcp::answer_bytes];
    (void)fw::detail::tcp::recv_all(c.s.get(), head, sizeof(head), until);
    return {};
  });
  expect_error(zero.result(), "ConfigError",
               {"says it is rank 0, but rank 0 is the process listening here"});
}

TEST(TcpRendezvous, BlobsOfDifferentSizesAreRefused) {
  const int port = free_port();
  Process zero(rank_fn(port, 0, 2, 3000ms, random_blob(128)));
  Process one([port] {
    Blob b(64);
    fw::tcp_rendezvous(config(port, 1, 2, 3000ms), b);
    return b;
  });
  expect_error(zero.result(), "ConfigError", {"expects a 64-byte blob, rank 0 serves 128 bytes"});
  expect_error(one.result(), "ConfigError", {"refused this rank", "expects a 64-byte blob"});
}

TEST(TcpRendezvous, AnUnresolvableHostIsAConfigErrorNamingIt) {
  // a name with spaces: the resolver refuses it without asking DNS, so no network is needed
  Blob b(id_bytes);
  for (int rank : {0, 1}) {
    const auto t0 = Clock::now();
    try {
      fw::tcp_rendezvous(fw::RendezvousConfig{"no such host", 29500, rank, 2, 1000ms}, b);
      ADD_FAILURE() << "rank " << rank << " did not throw";
    } catch (const fw::ConfigError& e) {
      const std::string m = e.what();
      EXPECT_TRUE(has(m, "cannot resolve the host 'no such host' (MASTER_ADDR)")) << m;
      EXPECT_TRUE(
          has(m, "TCP rendezvous at no such host:29500 (rank " + std::to_string(rank) + " of 2)"))
          << m;
    }
    EXPECT_LE(std::chrono::duration<double>(Clock::now() - t0).count(), 1.1 + 0.3);
  }
}

TEST(TcpRendezvous, APortHeldByAnotherListenerIsACommErrorNamingIt) {
  fw::RendezvousServer first(config(0, 0, 2, 1000ms));
  const int port = first.port();
  ASSERT_GT(port, 0);
  try {
    fw::RendezvousServer second(config(port, 0, 2, 1000ms));
    ADD_FAILURE() << "a second listener on port " << port;
  } catch (const fw::CommError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(has(m, "rank 0 cannot listen on port " + std::to_string(port))) << m;
    EXPECT_TRUE(has(m, "in use")) << m;
  }
}

TEST(TcpRendezvous, ImpossibleConfigurationsAreConfigErrors) {
  Blob b(id_bytes);
  const auto refused = [&](fw::RendezvousConfig c, const std::string& part) {
    try {
      fw::tcp_rendezvous(c, b);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const fw::ConfigError& e) {
      EXPECT_TRUE(has(e.what(), part)) << e.what();
    }
  };
  refused({"127.0.0.1", 29500, 2, 2, 1000ms}, "rank 2 is not a rank of a world of 2");
  refused({"127.0.0.1", 29500, -1, 2, 1000ms}, "rank -1 is not a rank of a world of 2");
  refused({"127.0.0.1", 0, 1, 2, 1000ms}, "port 0 is not a TCP port");
  refused({"127.0.0.1", 70000, 1, 2, 1000ms}, "port 70000 is not a TCP port");
  refused({"", 29500, 1, 2, 1000ms}, "no host; set MASTER_ADDR");
  refused({"127.0.0.1", 29500, 1, 2, 0ms}, "deadline 0 ms");
  Blob empty;
  try {
    fw::tcp_rendezvous(config(29500, 1, 2, 1000ms), empty);
    ADD_FAILURE() << "an empty blob was accepted";
  } catch (const fw::ConfigError& e) {
    EXPECT_TRUE(has(e.what(), "a blob of 0 bytes")) << e.what();
  }
}

TEST(TcpRendezvous, RankListsFoldRuns) {
  EXPECT_EQ(fw::detail::tcp::rank_list({}), "none");
  EXPECT_EQ(fw::detail::tcp::rank_list({3}), "3");
  EXPECT_EQ(fw::detail::tcp::rank_list({1, 2}), "1, 2");
  EXPECT_EQ(fw::detail::tcp::rank_list({1, 2, 3, 5, 7, 8, 9}), "1-3, 5, 7-9");
}

}  // namespace
