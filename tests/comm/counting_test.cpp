#include "fourway/comm/counting.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "fourway/comm/local_world.hpp"

namespace fw = fourway;
static_assert(fw::communicator<fw::Counting<fw::LocalComm>>);
static_assert(fw::call_options_communicator<fw::Counting<fw::LocalComm>>);

// The communication law of docs/design.md on the collectives of one step: a data-parallel step of
// Ψ fp32 gradient elements all-reduces 2Ψ(N−1)/N·4 bytes per rank; a ZeRO-3 step (reduce-scatter
// of the gradients, all-gather of the parameters in forward and again in backward) 3Ψ(N−1)/N·4.
// Both figures are checked: the decorator's *modelled* ring bytes (a formula applied to each call)
// and the bytes LocalWorld *measured* moving between ranks in its copy loops.
TEST(Counting, ModelledAndMeasuredBytesFollowTheLawForDataParallelAndZero3) {
  for (int n : {1, 2, 4, 8}) {
    const std::int64_t psi = 96 * 1024;  // divisible by every n above
    fw::launch<fw::LocalWorld>(n, [&](fw::World<fw::LocalWorld>& w) {
      fw::Counting<fw::LocalComm> c(std::move(w.comm()));
      std::vector<float> grads(psi, 1.0f), shard(psi / n), params(psi);
      c.all_reduce(grads.data(), grads.data(), psi, fw::ReduceOp::avg);
      const double dp_bytes = c.counters().modelled_bytes_sent();
      EXPECT_DOUBLE_EQ(dp_bytes, 2.0 * psi * (n - 1) / n * 4.0) << n;
      EXPECT_EQ(c.inner().traffic().total(), psi / n * (n - 1) * 2 * 4) << n;
      c.counters().reset();
      c.inner().reset_traffic();
      c.all_gather(shard.data(), params.data(), psi / n);  // forward
      c.all_gather(shard.data(), params.data(), psi / n);  // backward
      c.reduce_scatter(grads.data(), shard.data(), psi / n, fw::ReduceOp::avg);
      const double z3 = c.counters().modelled_bytes_sent();
      EXPECT_DOUBLE_EQ(z3, 3.0 * psi * (n - 1) / n * 4.0) << n;
      EXPECT_EQ(c.inner().traffic().total(), psi / n * (n - 1) * 3 * 4) << n;
      if (n > 1) {
        EXPECT_DOUBLE_EQ(z3 / dp_bytes, 1.5);
      }
      EXPECT_EQ(c.count(fw::CommOp::all_gather).calls, 2u);
      EXPECT_EQ(c.count(fw::CommOp::reduce_scatter).payload,
                static_cast<std::uint64_t>(psi / n * 4));
    });
  }
}

TEST(Counting, CountsPerGroupAcrossSplitsAndAsyncAndPointToPoint) {
  fw::launch<fw::LocalWorld>(4, [](fw::World<fw::LocalWorld>& w) {
    fw::Counting<fw::LocalComm> world(std::move(w.comm()));
    auto pair = world.split(w.rank() / 2, w.rank(), "pair");
    std::vector<fw::bf16> x(100, fw::bf16(1.0f));
    pair.all_reduce_async(x.data(), x.data(), 100, fw::ReduceOp::sum).wait();
    world.broadcast(x.data(), 100, 0);
    if (w.rank() % 2 == 0) {
      pair.send(x.data(), 10, 1, 0);
    } else {
      pair.recv(x.data(), 10, 0, 0);
    }
    auto& k = world.counters();
    EXPECT_EQ(k.get("pair", fw::CommOp::all_reduce).calls, 1u);
    EXPECT_DOUBLE_EQ(k.get("pair", fw::CommOp::all_reduce).modelled_bytes, 200.0 * 2 * 1 / 2);
    EXPECT_DOUBLE_EQ(k.get("world", fw::CommOp::broadcast).modelled_bytes, 200.0);
    EXPECT_EQ(k.get("world", fw::CommOp::split).calls, 1u);
    const double p2p = w.rank() % 2 == 0 ? 20.0 : 0.0;
    EXPECT_DOUBLE_EQ(k.modelled_bytes_sent("pair"), 200.0 + p2p);
    EXPECT_DOUBLE_EQ(k.get("pair", fw::CommOp::recv).modelled_bytes,
                     w.rank() % 2 == 1 ? 20.0 : 0.0);
    EXPECT_NE(k.table().find("pair"), std::string::npos);
    EXPECT_NE(k.json().find(
                  "\"pair\":{\"all_reduce\":{\"calls\":1,\"payload\":200,\"modelled_bytes\":200}"),
              std::string::npos)
        << k.json();
  });
}
