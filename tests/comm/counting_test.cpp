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
    EXPECT_NE(k.json().find("\"pair\":{\"all_reduce\":{\"calls\":1,\"payload\":200,\"modelled_"
                            "bytes\":200,\"host_waits\":1,\"device_orders\":0}"),
              std::string::npos)
        << k.json();
  });
}

// How each operation completed (issue 43): a blocking form and a Work's first host wait() are
// host waits, a Work's wait_device() before any host wait and a call through
// fw::complete_in_stream_order are device orders (on LocalComm they block the host all the same:
// the count is the algorithm's, what NCCL would do), and a Work that test() found finished costs
// nothing however it is waited on afterwards.
TEST(Counting, CountsHowEachOperationCompleted) {
  fw::launch<fw::LocalWorld>(2, [](fw::World<fw::LocalWorld>& w) {
    fw::Counting<fw::LocalComm> c(std::move(w.comm()));
    EXPECT_FALSE(c.orders_on_device());
    std::vector<float> x(8, 1.0f), all(16), shard(4);
    c.all_reduce(x.data(), x.data(), 8, fw::ReduceOp::sum);  // host: x = 2
    c.all_gather_async(x.data(), all.data(), 8).wait();      // host
    fw::Work rs = c.reduce_scatter_async(all.data(), shard.data(), 4, fw::ReduceOp::sum);
    rs.wait_device();  // device
    rs.wait();         // and then a host wait
    rs.wait();         // counted once
    fw::Work b = c.broadcast_async(x.data(), 8, 0);
    while (!b.test()) {
    }
    b.wait();  // found finished by test(): nothing
    fw::complete_in_stream_order(
        c, [&](auto& k) { return k.all_reduce_async(x.data(), x.data(), 8, fw::ReduceOp::sum); },
        [&](auto& k) { k.all_reduce(x.data(), x.data(), 8, fw::ReduceOp::sum); });  // device
    EXPECT_EQ(x[7], 4.0f);  // 2 on each rank, summed: the call ran
    c.barrier();            // host
    const auto& k = c.counters();
    const auto ar = k.get("world", fw::CommOp::all_reduce);
    EXPECT_EQ(ar.calls, 2u);
    EXPECT_EQ(ar.host_waits, 1u);
    EXPECT_EQ(ar.device_orders, 1u);
    EXPECT_EQ(k.get("world", fw::CommOp::all_gather).host_waits, 1u);
    const auto rsc = k.get("world", fw::CommOp::reduce_scatter);
    EXPECT_EQ(rsc.device_orders, 1u);
    EXPECT_EQ(rsc.host_waits, 1u);
    const auto bc = k.get("world", fw::CommOp::broadcast);
    EXPECT_EQ(bc.host_waits + bc.device_orders, 0u);
    EXPECT_EQ(k.get("world", fw::CommOp::barrier).host_waits, 1u);
    EXPECT_EQ(k.completed("world", fw::Completion::host_wait), 4u);
    EXPECT_EQ(k.completed({}, fw::Completion::device_order), 2u);
    EXPECT_EQ(k.completed("other", fw::Completion::host_wait), 0u);
    EXPECT_NE(k.table().find("host waits"), std::string::npos) << k.table();
  });
}

namespace {
/// LocalComm saying it orders on the device (as NcclComm does), and noting its async calls.
struct DeviceOrdering : fw::LocalComm {
  explicit DeviceOrdering(fw::LocalComm c) : fw::LocalComm(std::move(c)) {}
  [[nodiscard]] static constexpr bool orders_on_device() { return true; }
  DeviceOrdering split(int color, int key) {
    return DeviceOrdering(fw::LocalComm::split(color, key));
  }
  template <fw::comm_element T>
  fw::Work all_reduce_async(const T* s, T* r, std::int64_t n, fw::ReduceOp op,
                            fw::CallOptions o = {}) {
    ++issued_async;
    return fw::LocalComm::all_reduce_async(s, r, n, op, o);
  }
  int issued_async = 0;
};
}  // namespace

// complete_in_stream_order takes the *_async form and Work::wait_device() where the communicator
// orders on the device, through Counting too, and the blocking form elsewhere.
TEST(Counting, CompleteInStreamOrderIssuesAsyncOnlyWhereTheDeviceOrders) {
  static_assert(fw::communicator<DeviceOrdering>);
  fw::launch<fw::LocalWorld>(2, [](fw::World<fw::LocalWorld>& w) {
    fw::Counting<DeviceOrdering> c(DeviceOrdering(std::move(w.comm())));
    EXPECT_TRUE(c.orders_on_device());
    std::vector<double> x(3, 1.5);
    const auto issue = [&](auto& k) {
      return k.all_reduce_async(x.data(), x.data(), 3, fw::ReduceOp::sum);
    };
    const auto call = [&](auto& k) { k.all_reduce(x.data(), x.data(), 3, fw::ReduceOp::sum); };
    fw::complete_in_stream_order(c, issue, call);
    EXPECT_EQ(c.inner().issued_async, 1);
    EXPECT_EQ(x[2], 3.0);
    fw::complete_in_stream_order(c.inner(), issue, call);  // the bare communicator: the same
    EXPECT_EQ(c.inner().issued_async, 2);
    EXPECT_EQ(x[2], 6.0);
    const auto ar = c.count(fw::CommOp::all_reduce);
    EXPECT_EQ(ar.calls, 1u);
    EXPECT_EQ(ar.device_orders, 1u);
    EXPECT_EQ(ar.host_waits, 0u);
    DeviceOrdering& plain = c.inner();
    fw::LocalComm& host = plain;  // the host backend: the blocking form
    fw::complete_in_stream_order(host, issue, call);
    EXPECT_EQ(c.inner().issued_async, 2);
    EXPECT_EQ(x[2], 12.0);
  });
}
