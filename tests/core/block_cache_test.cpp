// The block cache behind Tensor (core/block_cache.hpp): a freed block serves the next tensor of
// the same byte count; other sizes, a full cache, caching turned off and an out-of-memory backend
// all go to the backend as they should. The expected counts are worked out by hand from the
// sequence of allocations each test makes, against a backend that counts its own calls.
#include "fourway/core/block_cache.hpp"

#include <gtest/gtest.h>

#include <new>
#include <set>
#include <string_view>

#include "fourway/core/tensor.hpp"

namespace fw = fourway;

namespace {

struct Counted {
  static constexpr std::string_view name = "counted";
  static constexpr bool on_device = false;
  static inline int allocated = 0;
  static inline int freed = 0;
  static inline std::size_t capacity = 0;  // > 0: the backend's memory; past it, OutOfMemory
  static inline std::size_t in_use = 0;
  static inline std::set<void*> live;
  static void reset() {
    allocated = freed = 0;
    capacity = in_use = 0;
    live.clear();
  }
  static void* allocate(std::size_t bytes) {
    if (capacity > 0 && in_use + 256 > capacity) throw fw::OutOfMemory("counted backend is full");
    ++allocated;
    in_use += 256;  // every block of these tests is at most 256 B
    void* p = ::operator new(bytes);
    live.insert(p);
    return p;
  }
  static void deallocate(void* p) noexcept {
    ++freed;
    in_use -= 256;
    live.erase(p);
    ::operator delete(p);
  }
};
using T = fw::Tensor<float, Counted>;

TEST(BlockCache, AFreedBlockServesTheNextTensorOfItsSize) {
  Counted::reset();
  {
    fw::MemoryAccountant m;
    float* first = nullptr;
    {
      T a({16}, fw::MemTag::activations, m);
      first = a.data();
    }
    EXPECT_EQ(m.cached_bytes(), 64u);
    EXPECT_EQ(m.total_current(), 0u);       // an idle block is not in use
    T b({4, 4}, fw::MemTag::workspace, m);  // same 64 B, another shape and tag
    EXPECT_EQ(b.data(), first);
    EXPECT_EQ(m.cached_bytes(), 0u);
    T c({8}, fw::MemTag::workspace, m);  // 32 B: a new block
    EXPECT_EQ(Counted::allocated, 2);
    EXPECT_EQ(m.backend_allocations(), 2u);
    EXPECT_EQ(m.allocations(), 3u);  // tensors, cached or not
    EXPECT_EQ(Counted::freed, 0);
  }
  // The accountant's cache gives everything back when it goes.
  EXPECT_EQ(Counted::freed, 2);
  EXPECT_TRUE(Counted::live.empty());
}

TEST(BlockCache, IdleBytesStayWithinTwiceTheLivePeak) {
  Counted::reset();
  fw::MemoryAccountant m;
  { T a({10}, fw::MemTag::workspace, m); }  // peak 40 B: up to 80 B idle
  EXPECT_EQ(m.cached_bytes(), 40u);
  {
    T b({5}, fw::MemTag::workspace, m);  // 20 B, new; peak stays 40
    T c({6}, fw::MemTag::workspace, m);  // 24 B, new; live 44: peak 44, cap 88
  }
  // c went back first (40 + 24 = 64 <= 88), then b (64 + 20 = 84 <= 88).
  EXPECT_EQ(m.cached_bytes(), 84u);
  { T d({2}, fw::MemTag::workspace, m); }  // 8 B more would be 92 > 88: freed at once
  EXPECT_EQ(m.cached_bytes(), 84u);
  EXPECT_EQ(Counted::allocated, 4);
  EXPECT_EQ(Counted::freed, 1);
  EXPECT_EQ(m.release_cached_blocks(), 84u);
  EXPECT_EQ(Counted::freed, 4);
  EXPECT_EQ(m.cached_bytes(), 0u);
}

TEST(BlockCache, OffSendsEveryBlockBackToTheBackend) {
  Counted::reset();
  fw::MemoryAccountant m;
  { T a({16}, fw::MemTag::workspace, m); }
  m.set_block_caching(false);  // releases what is idle, keeps nothing from now on
  EXPECT_EQ(Counted::freed, 1);
  { T b({16}, fw::MemTag::workspace, m); }
  EXPECT_EQ(Counted::allocated, 2);
  EXPECT_EQ(Counted::freed, 2);
  EXPECT_EQ(m.cached_bytes(), 0u);
}

TEST(BlockCache, AnOutOfMemoryBackendGetsTheIdleBlocksBackAndIsAskedAgain) {
  Counted::reset();
  Counted::capacity = 512;  // two blocks
  fw::MemoryAccountant m;
  { T a({16}, fw::MemTag::workspace, m); }  // block 1, idle
  T b({8}, fw::MemTag::workspace, m);       // block 2: the backend is full now
  T c({4}, fw::MemTag::workspace, m);       // full: block 1 goes back, then c is allocated
  EXPECT_EQ(Counted::allocated, 3);
  EXPECT_EQ(Counted::freed, 1);
  EXPECT_EQ(m.cached_bytes(), 0u);
  // Nothing idle to give back: the backend's error reaches the caller, and nothing is counted.
  EXPECT_THROW((T({2}, fw::MemTag::workspace, m)), fw::OutOfMemory);
  EXPECT_EQ(m.total_current(), 48u);
}

}  // namespace
