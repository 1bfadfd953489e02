#include "fourway/comm/communicator.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

namespace fw = fourway;

TEST(Work, DefaultIsCompleteAndCompletionStateRethrows) {
  fw::Work none;
  EXPECT_TRUE(none.test());
  none.wait();

  auto ok = std::make_shared<fw::detail::CompletionState>();
  fw::Work w(ok);
  EXPECT_FALSE(w.test());
  std::thread t([&] { ok->finish(nullptr); });
  w.wait();
  t.join();
  EXPECT_TRUE(w.test());

  auto bad = std::make_shared<fw::detail::CompletionState>();
  fw::Work f(bad);
  bad->finish(std::make_exception_ptr(fw::CommTimeout("late")));
  EXPECT_TRUE(f.test());
  EXPECT_THROW(f.wait(), fw::CommTimeout);
  EXPECT_THROW(f.wait(), fw::CommTimeout);  // every wait reports it
}

TEST(Communicator, PaddingAndShardCounts) {
  EXPECT_EQ(fw::padded_count(10, 4), 12);
  EXPECT_EQ(fw::padded_count(12, 4), 12);
  EXPECT_EQ(fw::padded_count(0, 3), 0);
  EXPECT_EQ(fw::shard_count(0, 3), 0);
  EXPECT_THROW((void)fw::shard_count(7, 2), fw::ShapeError);
  EXPECT_THROW((void)fw::shard_count(8, 0), fw::ShapeError);
}

TEST(Communicator, NamesOfOpsAndReductions) {
  EXPECT_EQ(fw::comm_op_name(fw::CommOp::reduce_scatter), "reduce_scatter");
  EXPECT_EQ(fw::reduce_op_name(fw::ReduceOp::avg), "avg");
  static_assert(fw::comm_element<fw::bf16> && fw::comm_element<std::int64_t>);
  static_assert(!fw::comm_element<char>);
  fw::CommOptions o;
  EXPECT_EQ(o.deadline, std::chrono::minutes(5));
  EXPECT_FALSE(o.debug);
}
