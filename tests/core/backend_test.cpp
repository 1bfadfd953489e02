// Tests for fourway/backend/host/backend.hpp (the CUDA twin is backend_test.cu).
#include "fourway/backend/host/backend.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace fw = fourway;

// Under AddressSanitizer an impossible allocation aborts unless the allocator may return null;
// this test needs the normal behaviour (a null that Host::allocate turns into OutOfMemory).
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

TEST(HostBackend, AllocatesAlignedMemory) {
  for (std::size_t bytes : {0u, 1u, 63u, 64u, 1000u, 4096u}) {
    void* p = fw::Host::allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % fw::Host::alignment, 0u) << bytes;
    fw::Host::deallocate(p);
  }
}

TEST(HostBackend, FailedAllocationIsOutOfMemoryNamingTheSize) {
  const std::size_t huge = std::size_t{1} << 50;  // 1 PiB: no machine has it, and no ASan either
  try {
    void* p = fw::Host::allocate(huge);
    fw::Host::deallocate(p);
    FAIL() << "allocating " << huge << " B succeeded";
  } catch (const fw::OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(huge)), std::string::npos) << e.what();
  }
}

TEST(HostBackend, ContextCarriesTheRanksAccountant) {
  fw::MemoryAccountant m(4);
  const fw::Context<fw::Host> ctx(m);
  EXPECT_EQ(&ctx.memory(), &m);
  EXPECT_EQ(ctx.memory().rank(), 4);
  ctx.synchronize();
}

TEST(HostBackend, FillAndCopyOddSizes) {
  fw::MemoryAccountant m;
  const fw::Context<fw::Host> ctx(m);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  constexpr std::int64_t n = 1237;
  fw::Tensor<float, fw::Host> a({n}, fw::MemTag::workspace, m);
  fw::Tensor<float, fw::Host> b({n}, fw::MemTag::workspace, m);
  std::vector<float> ref(n);
  for (auto& x : ref) x = dist(rng);
  fw::host::from_host(ctx, a.data(), ref.data(), n);
  fw::host::copy(ctx, b.data(), a.data(), n);
  std::vector<float> back(n);
  fw::host::to_host(ctx, back.data(), b.data(), n);
  EXPECT_EQ(back, ref);
  fw::host::fill(ctx, b.data() + 5, n - 10, -0.75f);
  for (std::int64_t i = 0; i < n; ++i) {
    const bool inside = i >= 5 && i < n - 5;
    ASSERT_EQ(b[i], inside ? -0.75f : ref[static_cast<std::size_t>(i)]) << i;
  }
  fw::Tensor<fw::bf16, fw::Host> h({3, 7}, fw::MemTag::workspace, m);
  fw::host::fill(ctx, h.data(), h.numel(), fw::bf16(1.5f));
  for (std::int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(static_cast<float>(h[i]), 1.5f);
  fw::host::copy(ctx, b.data(), a.data(), 0);  // zero elements: a no-op
  EXPECT_EQ(m.total_current(), 2 * n * sizeof(float) + 21 * sizeof(fw::bf16));
}
