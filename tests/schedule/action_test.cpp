#include "fourway/schedule/action.hpp"

#include <gtest/gtest.h>

#include <set>

namespace s = fourway::schedule;

static_assert(s::is_compute(s::Op::backward_weight) && !s::is_compute(s::Op::send_gradient));
static_assert(s::matching_op(s::Op::send_activation) == s::Op::recv_activation);
static_assert(s::matching_op(s::Op::recv_gradient) == s::Op::send_gradient);
static_assert(s::frees_activations(s::Op::backward) &&
              s::frees_activations(s::Op::backward_weight));
static_assert(!s::frees_activations(s::Op::backward_input));

TEST(ScheduleAction, TagsAreUniquePerMessageAndSharedBySendAndRecv) {
  const int chunks = 6;
  std::set<int> seen;
  for (int mb = 0; mb < 9; ++mb) {
    for (int c = 0; c < chunks; ++c) {
      for (s::Op op : {s::Op::send_activation, s::Op::send_gradient}) {
        const s::Action send{op, mb, c, 1, 10};
        const s::Action recv{s::matching_op(op), mb, c, 0, 10};
        EXPECT_EQ(s::message_tag(send, chunks), s::message_tag(recv, chunks));
        EXPECT_TRUE(seen.insert(s::message_tag(send, chunks)).second) << mb << " " << c;
      }
    }
  }
}

TEST(ScheduleAction, Names) {
  EXPECT_EQ(s::op_name(s::Op::forward), "F");
  EXPECT_EQ(s::op_name(s::Op::backward), "BW");
  EXPECT_EQ(s::op_name(s::Op::backward_input), "B");
  EXPECT_EQ(s::op_name(s::Op::backward_weight), "W");
  EXPECT_EQ(s::op_name(s::Op::recv_gradient), "recv_B");
}
