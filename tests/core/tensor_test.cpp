#include "fourway/core/tensor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/host/backend.hpp"

namespace fw = fourway;

static_assert(!std::is_copy_constructible_v<fw::Tensor<float, fw::Host>>);
static_assert(std::is_nothrow_move_constructible_v<fw::Tensor<float, fw::Host>>);
static_assert(fw::Tensor<fw::bf16, fw::Host>::dtype == fw::Dtype::bf16);

TEST(Tensor, OwningTensorIsCountedAndFreed) {
  fw::MemoryAccountant acct(3);
  {
    fw::Tensor<float, fw::Host> w({4, 5}, fw::MemTag::weights, acct);
    EXPECT_EQ(w.numel(), 20);
    EXPECT_EQ(w.bytes(), 80u);
    EXPECT_TRUE(w.owning());
    EXPECT_EQ(w.tag(), fw::MemTag::weights);
    EXPECT_EQ(acct.current(fw::MemTag::weights), 80u);
    fw::Tensor<fw::bf16, fw::Host> g({7}, fw::MemTag::grads, acct);
    EXPECT_EQ(acct.current(fw::MemTag::grads), 14u);
    EXPECT_EQ(acct.total_current(), 94u);
  }
  EXPECT_EQ(acct.total_current(), 0u);
  EXPECT_EQ(acct.total_peak(), 94u);
  EXPECT_EQ(acct.peak(fw::MemTag::weights), 80u);
}

TEST(Tensor, HostMemoryIsAlignedAndWritable) {
  fw::MemoryAccountant acct;
  fw::Tensor<std::int32_t, fw::Host> t({3, 11}, fw::MemTag::workspace, acct);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % fw::Host::alignment, 0u);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<std::int32_t>(3 * i - 7);
  std::int64_t sum = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) sum += t[i];
  EXPECT_EQ(sum, 3 * (32 * 33 / 2) - 7 * 33);
}

TEST(Tensor, ViewsAllocateNothing) {
  fw::MemoryAccountant acct;
  fw::Tensor<float, fw::Host> a({2, 3}, fw::MemTag::activations, acct);
  const auto before = acct.allocations();
  auto v = a.view({3, 2});
  auto s = a.slice(2, {4});
  auto whole = a.view();
  EXPECT_EQ(acct.allocations(), before);
  EXPECT_EQ(acct.current(fw::MemTag::activations), 24u);
  EXPECT_EQ(s.data(), a.data() + 2);
  EXPECT_EQ(whole.data(), a.data());
  EXPECT_EQ(whole.shape(), a.shape());
  EXPECT_FALSE(v.owning());
  EXPECT_EQ(v.shape(), fw::Shape({3, 2}));
  EXPECT_THROW((void)a.view({4, 2}), fw::ShapeError);
  EXPECT_THROW((void)a.slice(3, {4}), fw::ShapeError);
  EXPECT_THROW((void)a.slice(-1, {1}), fw::ShapeError);
  a[5] = 1.5f;
  EXPECT_EQ(v[5], 1.5f);
  EXPECT_EQ(s[3], 1.5f);
}

TEST(Tensor, ViewOfExternalMemory) {
  float buf[12] = {};
  auto t = fw::Tensor<float, fw::Host>::view_of(buf, {3, 4});
  EXPECT_EQ(t.data(), buf);
  EXPECT_EQ(t.numel(), 12);
  EXPECT_FALSE(t.owning());
  t[11] = 2.0f;
  EXPECT_EQ(buf[11], 2.0f);
  t.reset();
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(buf[11], 2.0f);
}

TEST(Tensor, ViewErrorsNameTheShapes) {
  fw::MemoryAccountant acct;
  fw::Tensor<float, fw::Host> a({2, 3}, fw::MemTag::activations, acct);
  try {
    (void)a.view({4, 2});
    FAIL();
  } catch (const fw::ShapeError& e) {
    EXPECT_STREQ(e.what(), "fourway: cannot view (2, 3) (6 elements) as (4, 2) (8 elements)");
  }
  try {
    (void)a.slice(3, {2, 2});
    FAIL();
  } catch (const fw::ShapeError& e) {
    EXPECT_STREQ(e.what(),
                 "fourway: slice of 4 elements at offset 3 exceeds tensor (2, 3) of 6 elements");
  }
}

TEST(Tensor, MovedFromTensorIsEmpty) {
  fw::MemoryAccountant acct;
  fw::Tensor<float, fw::Host> a({5}, fw::MemTag::weights, acct);
  float* p = a.data();
  fw::Tensor<float, fw::Host> b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_TRUE(b.owning());
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is API
  EXPECT_EQ(a.shape(), fw::Shape({0}));
  EXPECT_TRUE(a.empty());
  EXPECT_FALSE(a.owning());

  fw::Tensor<float, fw::Host> c({9}, fw::MemTag::weights, acct);
  fw::Tensor<float, fw::Host> d({2}, fw::MemTag::weights, acct);
  c = std::move(d);  // c's 36 B are freed, d's 8 B change hands
  EXPECT_EQ(acct.current(fw::MemTag::weights), 20u + 8u);
  EXPECT_EQ(d.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_FALSE(d.owning());
  EXPECT_TRUE(d.empty());
  c = std::move(c);  // self-move keeps the tensor
  EXPECT_EQ(c.numel(), 2);
  EXPECT_EQ(acct.current(fw::MemTag::weights), 28u);
}

TEST(Tensor, EmptyAndDefaultTensors) {
  fw::MemoryAccountant acct;
  fw::Tensor<float, fw::Host> z({0, 4}, fw::MemTag::workspace, acct);
  EXPECT_TRUE(z.empty());
  EXPECT_EQ(z.bytes(), 0u);
  EXPECT_EQ(z.data(), nullptr);
  EXPECT_EQ(acct.total_current(), 0u);
  fw::Tensor<float, fw::Host> d;
  EXPECT_FALSE(d.owning());
  EXPECT_EQ(d.data(), nullptr);
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(d.bytes(), 0u);
  fw::Tensor<double, fw::Host> scalar(fw::Shape{}, fw::MemTag::workspace, acct);  // shape ()
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(acct.current(fw::MemTag::workspace), 8u);
}

TEST(Tensor, ResetFreesNow) {
  fw::MemoryAccountant acct;
  fw::Tensor<fw::fp16, fw::Host> t({10, 10}, fw::MemTag::comm_buffers, acct);
  EXPECT_EQ(acct.current(fw::MemTag::comm_buffers), 200u);
  t.reset();
  EXPECT_EQ(acct.current(fw::MemTag::comm_buffers), 0u);
  EXPECT_EQ(acct.peak(fw::MemTag::comm_buffers), 200u);
  EXPECT_FALSE(t.owning());
  EXPECT_TRUE(t.empty());
  t.reset();  // twice is harmless
  EXPECT_EQ(acct.total_current(), 0u);
}

namespace {
// A device-like backend that records the device each allocation was asked for.
struct DeviceRecorder {
  static constexpr std::string_view name = "recorder";
  static constexpr bool on_device = true;
  static inline std::vector<int> asked;
  static void* allocate(std::size_t bytes) { return allocate(bytes, -2); }
  static void* allocate(std::size_t bytes, int device) {
    asked.push_back(device);
    return ::operator new(bytes);
  }
  static void deallocate(void* p) noexcept { ::operator delete(p); }
};
}  // namespace

// Cuda::allocate used to take the calling thread's current device; tensors now pass the device
// their rank's accountant is bound to (Context<Cuda> binds it), so a thread that switched
// devices, or never set one, still allocates on the rank's GPU.
TEST(Tensor, DeviceTensorsAllocateOnTheAccountantsDevice) {
  DeviceRecorder::asked.clear();
  fw::MemoryAccountant m(3);
  { fw::Tensor<float, DeviceRecorder> unbound({4}, fw::MemTag::weights, m); }
  m.bind_device(1);
  { fw::Tensor<float, DeviceRecorder> bound({4}, fw::MemTag::weights, m); }
  EXPECT_EQ(DeviceRecorder::asked, (std::vector<int>{-1, 1}));
  m.bind_device(1);  // the same GPU again is fine
  try {
    m.bind_device(0);
    FAIL() << "a rank's accountant moved to another GPU";
  } catch (const fw::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 already serves GPU 1"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(m.device(), 1);
}
