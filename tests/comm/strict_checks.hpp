// The strict decorator's checks (comm/strict.hpp), shared by its LocalComm test (label cpu) and
// its MPI test (label mpi, 2 ranks). Each check takes a fresh Strict<C> of two ranks (a stuck
// operation stays in its communicator's queue) and the rank's accountant, and says with gtest
// what it saw. The same calls pass on the lenient inner communicator (see the LocalWorld strict
// test for that half).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "fourway/comm/strict.hpp"
#include "fourway/core/tensor.hpp"

namespace strict_test {

namespace fw = fourway;
using Clock = std::chrono::steady_clock;

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline fw::Tensor<float, fw::Host> filled(fw::MemoryAccountant& m, std::int64_t n, float v) {
  fw::Tensor<float, fw::Host> t(fw::Shape{n}, fw::MemTag::comm_buffers, m);
  for (std::int64_t i = 0; i < n; ++i) t[i] = v + static_cast<float>(i);
  return t;
}

constexpr auto kDeadline = std::chrono::milliseconds(600);

/// A host scalar is refused with NcclComm's CommError; a tensor passes.
template <class C>
void host_memory_is_refused(fw::Strict<C>& c, fw::MemoryAccountant& m) {
  double scalar = 1.0;
  try {
    c.all_reduce(&scalar, &scalar, 1, fw::ReduceOp::sum);
    ADD_FAILURE() << "a host scalar was accepted";
  } catch (const fw::CommError& e) {
    EXPECT_TRUE(contains(e.what(), "pageable host memory")) << e.what();
  }
  auto t = filled(m, 4, 1.0f);
  c.all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum);
  EXPECT_EQ(t[0], 2.0f);
}

/// Each rank sends then receives, ungrouped: NCCL hangs; here a CommTimeout naming the pending
/// send, within the deadline and a margin.
template <class C>
void ungrouped_exchange_times_out(fw::Strict<C>& c, fw::MemoryAccountant& m) {
  auto out = filled(m, 16, 1.0f);
  auto in = filled(m, 16, 0.0f);
  const int peer = 1 - c.rank();
  const auto t0 = Clock::now();
  try {
    c.send(out.data(), 16, peer, 7, {.timeout = kDeadline});
    c.recv(in.data(), 16, peer, 7, {.timeout = kDeadline});
    ADD_FAILURE() << "the ungrouped exchange completed";
  } catch (const fw::CommTimeout& e) {
    EXPECT_TRUE(
        contains(e.what(), "send (fp32, count 16) to rank " + std::to_string(peer) + " with tag 7"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "group_start()")) << e.what();
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(s, 1.1 * 0.6 + 0.3) << "the timeout came late";
}

/// The same exchange as one group completes, at 64 B and at 12 MiB.
template <class C>
void grouped_exchange_completes(fw::Strict<C>& c, fw::MemoryAccountant& m) {
  for (std::int64_t n : {std::int64_t{16}, std::int64_t{3} << 20}) {
    auto out = filled(m, n, static_cast<float>(10 * c.rank()));
    auto in = filled(m, n, -1.0f);
    const int peer = 1 - c.rank();
    c.group_start();
    fw::Work s = c.send_async(out.data(), n, peer, 7);
    fw::Work r = c.recv_async(in.data(), n, peer, 7);
    c.group_end();
    r.wait();
    s.wait();
    EXPECT_EQ(in[n - 1], static_cast<float>(10 * peer) + static_cast<float>(n - 1));
  }
}

/// Rank 1 receives rank 0's two messages in the other order: NCCL matches by order, so the
/// sender meets a recv expecting another tag (CommMismatch); the receiver, left without data,
/// fails too (at its deadline, or at once where it learns that its peer has gone).
template <class C>
void messages_match_by_order(fw::Strict<C>& c, fw::MemoryAccountant& m) {
  auto a = filled(m, 4, 1.0f);
  auto b = filled(m, 4, 2.0f);
  try {
    c.group_start();
    fw::Work x, y;
    if (c.rank() == 0) {
      x = c.send_async(a.data(), 4, 1, 1, {.timeout = kDeadline});
      y = c.send_async(b.data(), 4, 1, 2, {.timeout = kDeadline});
    } else {
      x = c.recv_async(b.data(), 4, 0, 2, {.timeout = kDeadline});
      y = c.recv_async(a.data(), 4, 0, 1, {.timeout = kDeadline});
    }
    c.group_end({.timeout = kDeadline});
    x.wait();
    y.wait();
    ADD_FAILURE() << "swapped messages were delivered on rank " << c.rank();
  } catch (const fw::CommMismatch& e) {
    EXPECT_EQ(c.rank(), 0) << e.what();
    EXPECT_TRUE(contains(e.what(), "posting order, not tag")) << e.what();
  } catch (const fw::CommError& e) {
    EXPECT_EQ(c.rank(), 1) << e.what();
  }
}

/// A recv_async queued before a send on the same communicator holds the send back (a
/// communicator is a stream): both ranks doing so time out.
template <class C>
void a_communicator_is_a_stream(fw::Strict<C>& c, fw::MemoryAccountant& m) {
  auto in = filled(m, 4, 0.0f);
  auto out = filled(m, 4, 1.0f);
  const int peer = 1 - c.rank();
  try {
    fw::Work r = c.recv_async(in.data(), 4, peer, 0, {.timeout = kDeadline});
    c.send(out.data(), 4, peer, 0, {.timeout = kDeadline});
    r.wait();
    ADD_FAILURE() << "the send overtook the recv queued before it";
  } catch (const fw::CommTimeout& e) {
    // the queued recv times out first (and its failure may surface at the send's wait)
    EXPECT_TRUE(contains(e.what(), "(fp32, count 4)")) << e.what();
  }
}

/// Blocking collectives of two groups in different orders on the two ranks: each waits for the
/// other's group (NCCL hangs); here a CommTimeout naming this rank's pending collective. Rank 0's
/// deadline is the short one, so it is the rank that times out whatever the scheduling (with
/// equal deadlines the first to time out moves on and completes the other's call).
template <class C>
void crossed_collectives_time_out(fw::Strict<C>& c, fw::MemoryAccountant& m) {
  auto a = c.split(0, c.rank(), std::string("a"));
  auto b = c.split(0, c.rank(), std::string("b"));
  auto t = filled(m, 4, 1.0f);
  auto u = filled(m, 4, 1.0f);
  if (c.rank() == 0) {
    try {
      a.all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum, {.timeout = kDeadline});
      ADD_FAILURE() << "rank 0's all_reduce on group a completed while rank 1 waits on b";
    } catch (const fw::CommTimeout& e) {
      EXPECT_TRUE(contains(e.what(), "all_reduce(fp32, count 4, sum)")) << e.what();
    }
    // then rank 0 calls b, where rank 1 waits: that completes
    b.all_reduce(u.data(), u.data(), 4, fw::ReduceOp::sum);
  } else {
    b.all_reduce(t.data(), t.data(), 4, fw::ReduceOp::sum, {.timeout = 10 * kDeadline});
    EXPECT_EQ(t[0], 2.0f);
    // and rank 1's call on a meets rank 0's call that timed out (still posted underneath), so
    // no collective is left pending when the groups are freed (MPI would match a leftover with
    // the next collective on the group)
    a.all_reduce(u.data(), u.data(), 4, fw::ReduceOp::sum);
  }
  EXPECT_EQ(u[0], 2.0f);
  // rank 1 may still be reducing into rank 0's `t` for the call that timed out: both ranks are
  // past their second call only after that, so `t` is freed after the barrier
  c.barrier();
}

}  // namespace strict_test
