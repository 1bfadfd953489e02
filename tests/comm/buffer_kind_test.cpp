// The refusal that keeps host memory away from NCCL (comm/buffer_kind.hpp), for every kind
// cudaPointerGetAttributes reports; NcclComm applies it to every buffer before calling NCCL.
#include "fourway/comm/buffer_kind.hpp"

#include <gtest/gtest.h>

#include <string>

namespace fw = fourway;

namespace {

std::string refusal(fw::BufferKind k, std::int64_t count) {
  try {
    fw::require_nccl_buffer(k, count, "send", "all_reduce(fp64, count 1, sum) #3 on rank 1");
  } catch (const fw::CommError& e) {
    return e.what();
  }
  return {};
}

TEST(BufferKind, NcclTakesDeviceAndManagedMemoryOnly) {
  EXPECT_TRUE(fw::nccl_accepts(fw::BufferKind::device));
  EXPECT_TRUE(fw::nccl_accepts(fw::BufferKind::managed));
  EXPECT_FALSE(fw::nccl_accepts(fw::BufferKind::host));
  EXPECT_FALSE(fw::nccl_accepts(fw::BufferKind::pinned_host));
  EXPECT_FALSE(fw::nccl_accepts(fw::BufferKind::null));
  EXPECT_EQ(refusal(fw::BufferKind::device, 1), "");
  EXPECT_EQ(refusal(fw::BufferKind::managed, 1), "");
}

TEST(BufferKind, AHostPointerIsRefusedWithTheCallTheBufferAndTheFix) {
  const std::string m = refusal(fw::BufferKind::host, 1);
  EXPECT_NE(m.find("fourway: all_reduce(fp64, count 1, sum) #3 on rank 1 refused"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("send buffer (1 elements) is pageable host memory"), std::string::npos) << m;
  EXPECT_NE(m.find("Tensor<T, Cuda>"), std::string::npos) << m;
  EXPECT_NE(refusal(fw::BufferKind::pinned_host, 4).find("pinned host memory"), std::string::npos);
}

TEST(BufferKind, ANullBufferIsFineOnlyWhenNothingIsMoved) {
  EXPECT_EQ(refusal(fw::BufferKind::null, 0), "");
  EXPECT_NE(refusal(fw::BufferKind::null, 2).find("a null pointer"), std::string::npos);
}

}  // namespace
