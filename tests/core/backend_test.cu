// Tests for fourway/backend/cuda/backend.cuh and the device side of core/dtype.hpp. Compiled by
// nvcc in every build with CUDA (so CI proves it compiles); skips where there is no GPU.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fourway/fourway.cuh"

namespace fw = fourway;

static_assert(std::is_same_v<fw::native_t<fw::fp16>, __half>);
static_assert(std::is_same_v<fw::native_t<fw::bf16>, __nv_bfloat16>);
static_assert(std::is_same_v<fw::native_t<float>, float>);
static_assert(FOURWAY_HAS_CUDA == 1);

#define FW_REQUIRE_GPU()                                                 \
  do {                                                                   \
    if (fw::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

namespace {

__global__ void decode_all(float* half_out, float* bf_out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536) return;
  const auto bits = static_cast<std::uint16_t>(i);
  half_out[i] = __half2float(__ushort_as_half(bits));
  bf_out[i] = __bfloat162float(__ushort_as_bfloat16(bits));
}

// Converts each input with the CUDA intrinsics and with fourway's own (device-compiled) code.
__global__ void encode(const float* in, int n, std::uint16_t* half_cuda, std::uint16_t* half_fw,
                       std::uint16_t* bf_cuda, std::uint16_t* bf_fw) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  half_cuda[i] = __half_as_ushort(__float2half_rn(in[i]));
  half_fw[i] = fw::fp16(in[i]).bits;
  bf_cuda[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
  bf_fw[i] = fw::bf16(in[i]).bits;
}

template <class T>
std::vector<T> download(const fw::Context<fw::Cuda>& ctx, const fw::Tensor<T, fw::Cuda>& t) {
  std::vector<T> out(static_cast<std::size_t>(t.numel()));
  fw::cuda::to_host(ctx, out.data(), t.data(), t.numel());
  return out;
}

}  // namespace

TEST(CudaBackend, DeviceCountNeverThrows) { EXPECT_GE(fw::cuda::device_count(), 0); }

TEST(CudaBackend, ContextOnAMissingDeviceNamesTheNumbers) {  // runs with or without a GPU
  fw::MemoryAccountant m(3);
  const int n = fw::cuda::device_count();
  try {
    fw::Context<fw::Cuda> ctx(m, n);
    FAIL() << "a context on device " << n << " of " << n;
  } catch (const fw::DeviceError& e) {
    const std::string want = "fourway: rank 3 asks for CUDA device " + std::to_string(n) + " but " +
                             std::to_string(n) + " devices are visible";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  EXPECT_THROW(fw::Context<fw::Cuda>(m, -1), fw::DeviceError);
}

TEST(CudaBackend, AllocateFillCopyAndCountBytes) {
  FW_REQUIRE_GPU();
  fw::MemoryAccountant m(1);
  fw::Context<fw::Cuda> ctx(m, 0);
  constexpr std::int64_t n = 100003;  // odd, more than one grid-stride pass of small grids
  {
    fw::Tensor<float, fw::Cuda> a({n}, fw::MemTag::activations, m);
    fw::Tensor<float, fw::Cuda> b({7, n / 7 + 1}, fw::MemTag::grads, m);
    EXPECT_EQ(m.current(fw::MemTag::activations), n * sizeof(float));
    EXPECT_EQ(m.current(fw::MemTag::grads), 7 * (n / 7 + 1) * sizeof(float));
    fw::cuda::fill(ctx, a.data(), n, 2.5f);
    for (float x : download(ctx, a)) ASSERT_EQ(x, 2.5f);

    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    std::vector<float> ref(n);
    for (auto& x : ref) x = dist(rng);
    fw::cuda::from_host(ctx, a.data(), ref.data(), n);
    fw::cuda::copy(ctx, b.data() + 1, a.data(), n);
    fw::cuda::fill(ctx, b.data(), 1, -1.0f);
    ctx.synchronize();
    const auto back = download(ctx, b);
    EXPECT_EQ(back[0], -1.0f);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i + 1], ref[i]) << i;

    const auto view = b.slice(1, {n});
    EXPECT_EQ(m.allocations(), 2u);  // a view allocates nothing
    EXPECT_EQ(download(ctx, view), ref);
  }
  EXPECT_EQ(m.total_current(), 0u);
  EXPECT_EQ(m.total_peak(), (n + 7 * (n / 7 + 1)) * sizeof(float));
}

TEST(CudaBackend, SixteenBitFillKeepsTheBits) {
  FW_REQUIRE_GPU();
  fw::MemoryAccountant m;
  fw::Context<fw::Cuda> ctx(m, 0);
  fw::Tensor<fw::bf16, fw::Cuda> t({333}, fw::MemTag::weights, m);
  fw::Tensor<fw::fp16, fw::Cuda> h({333}, fw::MemTag::weights, m);
  EXPECT_EQ(m.current(fw::MemTag::weights), 2u * 333u * 2u);
  fw::cuda::fill(ctx, t.data(), t.numel(), fw::bf16(-0.3f));
  fw::cuda::fill(ctx, h.data(), h.numel(), fw::fp16(0.1f));
  for (fw::bf16 x : download(ctx, t)) ASSERT_EQ(x.bits, fw::bf16(-0.3f).bits);
  for (fw::fp16 x : download(ctx, h)) ASSERT_EQ(x.bits, fw::fp16(0.1f).bits);
}

TEST(CudaBackend, HostDtypesDecodeLikeCudaIntrinsics) {
  FW_REQUIRE_GPU();
  fw::MemoryAccountant m;
  fw::Context<fw::Cuda> ctx(m, 0);
  fw::Tensor<float, fw::Cuda> half_out({65536}, fw::MemTag::workspace, m);
  fw::Tensor<float, fw::Cuda> bf_out({65536}, fw::MemTag::workspace, m);
  decode_all<<<256, 256, 0, ctx.stream()>>>(half_out.data(), bf_out.data());
  fw::cuda::check_cuda(cudaGetLastError(), "decode_all");
  const auto h = download(ctx, half_out);
  const auto b = download(ctx, bf_out);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    const float hh = static_cast<float>(fw::fp16::from_bits(static_cast<std::uint16_t>(i)));
    const float bh = static_cast<float>(fw::bf16::from_bits(static_cast<std::uint16_t>(i)));
    if (hh != hh) {
      ASSERT_NE(h[i], h[i]) << i;
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(h[i]), std::bit_cast<std::uint32_t>(hh)) << i;
    }
    if (bh != bh) {
      ASSERT_NE(b[i], b[i]) << i;
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(b[i]), std::bit_cast<std::uint32_t>(bh)) << i;
    }
  }
}

TEST(CudaBackend, EncodingMatchesCudaIntrinsicsOnDeviceAndHost) {
  FW_REQUIRE_GPU();
  fw::MemoryAccountant m;
  fw::Context<fw::Cuda> ctx(m, 0);
  constexpr int n = 1 << 20;
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::uint32_t> dist;
  std::vector<float> in(n);
  for (auto& x : in) {
    do {
      x = std::bit_cast<float>(dist(rng));
    } while (x != x);  // NaN payloads differ between implementations; NaN has its own test
  }
  fw::Tensor<float, fw::Cuda> d_in({n}, fw::MemTag::workspace, m);
  fw::Tensor<std::uint16_t, fw::Cuda> hc({n}, fw::MemTag::workspace, m);
  fw::Tensor<std::uint16_t, fw::Cuda> hf({n}, fw::MemTag::workspace, m);
  fw::Tensor<std::uint16_t, fw::Cuda> bc({n}, fw::MemTag::workspace, m);
  fw::Tensor<std::uint16_t, fw::Cuda> bf({n}, fw::MemTag::workspace, m);
  fw::cuda::from_host(ctx, d_in.data(), in.data(), n);
  encode<<<(n + 255) / 256, 256, 0, ctx.stream()>>>(d_in.data(), n, hc.data(), hf.data(), bc.data(),
                                                    bf.data());
  fw::cuda::check_cuda(cudaGetLastError(), "encode");
  const auto vhc = download(ctx, hc);
  const auto vhf = download(ctx, hf);
  const auto vbc = download(ctx, bc);
  const auto vbf = download(ctx, bf);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(vhf[i], vhc[i]) << "device fp16, x bits " << std::bit_cast<std::uint32_t>(in[i]);
    ASSERT_EQ(fw::fp16(in[i]).bits, vhc[i])
        << "host fp16, x bits " << std::bit_cast<std::uint32_t>(in[i]);
    ASSERT_EQ(vbf[i], vbc[i]) << "device bf16, x bits " << std::bit_cast<std::uint32_t>(in[i]);
    ASSERT_EQ(fw::bf16(in[i]).bits, vbc[i])
        << "host bf16, x bits " << std::bit_cast<std::uint32_t>(in[i]);
  }
}
