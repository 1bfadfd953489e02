#include "fourway/core/tensor.hpp"

#include <gtest/gtest.h>

#include "fourway/backend/host/backend.hpp"

namespace fw = fourway;

TEST(Tensor, OwningTensorIsCountedAndFreed) {
  fw::MemoryAccountant acct(3);
  {
    fw::Tensor<float, fw::Host> w({4, 5}, fw::MemTag::weights, acct);
    EXPECT_EQ(w.numel(), 20);
    EXPECT_EQ(acct.current(fw::MemTag::weights), 80u);
    fw::Tensor<fw::bf16, fw::Host> g({7}, fw::MemTag::grads, acct);
    EXPECT_EQ(acct.current(fw::MemTag::grads), 14u);
    EXPECT_EQ(acct.total_current(), 94u);
  }
  EXPECT_EQ(acct.total_current(), 0u);
  EXPECT_EQ(acct.total_peak(), 94u);
  EXPECT_EQ(acct.peak(fw::MemTag::weights), 80u);
}

TEST(Tensor, ViewsAllocateNothing) {
  fw::MemoryAccountant acct;
  fw::Tensor<float, fw::Host> a({2, 3}, fw::MemTag::activations, acct);
  const auto before = acct.allocations();
  auto v = a.view({3, 2});
  auto s = a.slice(2, {4});
  EXPECT_EQ(acct.allocations(), before);
  EXPECT_EQ(acct.current(fw::MemTag::activations), 24u);
  EXPECT_EQ(s.data(), a.data() + 2);
  EXPECT_FALSE(v.owning());
  EXPECT_THROW((void)a.view({4, 2}), fw::ShapeError);
  EXPECT_THROW((void)a.slice(3, {4}), fw::ShapeError);
}
