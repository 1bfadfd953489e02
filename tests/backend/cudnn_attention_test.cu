// The fourway::cudnn component: causal attention through cuDNN's attention graph against the host
// twin (the same reference the other attention paths meet in kernels_test.cu), directly and
// through the layers' entry points with Context<Cuda>::set_cudnn_attention, in bf16 and fp16.
// The header comes first: this unit is its compile-alone check (tests/hygiene/CMakeLists.txt).
// Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fourway/backend/cuda/attention_select.cuh"
#include "fourway/backend/cuda/kernels.cuh"
#include "fourway/backend/cudnn/sdpa.cuh"
#include "fourway/backend/host/kernels.hpp"
#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {

template <class T>
std::vector<T> download(const fw::Context<fw::Cuda>& ctx, const fw::Tensor<T, fw::Cuda>& t) {
  std::vector<T> h(static_cast<std::size_t>(t.numel()));
  fw::cuda::to_host(ctx, h.data(), t.data(), t.numel());
  return h;
}

template <class T>
fw::Tensor<T, fw::Cuda> upload(const fw::Context<fw::Cuda>& ctx, fw::MemoryAccountant& acct,
                               const std::vector<T>& v) {
  fw::Tensor<T, fw::Cuda> t({static_cast<std::int64_t>(v.size())}, fw::MemTag::workspace, acct);
  fw::cuda::from_host(ctx, t.data(), v.data(), t.numel());
  return t;
}

}  // namespace

template <class T>
class CudnnAttention : public ::testing::Test {};
using Halves = ::testing::Types<fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(CudnnAttention, Halves);

// Forward (out, lse) and backward (dqkv) on shapes with head sizes 32, 64 and 128, odd and even
// sequence lengths, against the host flash attention; then the same call through
// flash_attention_forward / backward with the context's cuDNN flag, which must give the same
// values bit for bit (it is the same graph).
TYPED_TEST(CudnnAttention, MatchesTheHostTwinDirectlyAndThroughTheLayersEntry) {
  if (fw::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  using E = TypeParam;
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> host(acct);
  fw::Context<fw::Cuda> dev(acct, 0);
  const std::int64_t shapes[][4] = {
      {2, 64, 128, 2}, {1, 37, 96, 3}, {2, 130, 256, 2}, {1, 1024, 768, 12}};
  std::uint32_t seed = 1200;
  const double u = ft::unit_roundoff<E>();
  int ran = 0;
  for (const auto& s : shapes) {
    const std::int64_t B = s[0], T = s[1], C = s[2], NH = s[3];
    const auto nqkv = static_cast<std::size_t>(B * T * 3 * C),
               nout = static_cast<std::size_t>(B * T * C),
               nrow = static_cast<std::size_t>(B * NH * T);
    const auto qkv = ft::random_typed<E>(nqkv, ++seed, -1.5f, 1.5f);
    const auto dy = ft::random_typed<E>(nout, ++seed);
    std::vector<E> out(nout), dqkv(nqkv);
    std::vector<float> lse(nrow), delta(nrow);
    fw::host::flash_attention_forward(host, out.data(), lse.data(), qkv.data(), B, T, C, NH);
    fw::host::flash_attention_backward(host, dqkv.data(), delta.data(), dy.data(), qkv.data(),
                                       out.data(), lse.data(), B, T, C, NH);
    auto d_qkv = upload(dev, acct, qkv), d_dy = upload(dev, acct, dy);
    auto d_out = upload(dev, acct, std::vector<E>(nout)), d_dqkv = upload(dev, acct, dqkv);
    auto d_lse = upload(dev, acct, std::vector<float>(nrow));
    const std::string what = "B=" + std::to_string(B) + " T=" + std::to_string(T) +
                             " C=" + std::to_string(C) + " NH=" + std::to_string(NH) + " " +
                             ft::type_name<E>();
    ASSERT_TRUE(fw::cuda::cudnn_attention_supports<E>(dev, B, T, C, NH, d_qkv.data(), d_out.data()))
        << "cuDNN declined " << what;
    ++ran;
    fw::cuda::cudnn_attention_forward(dev, d_out.data(), d_lse.data(), d_qkv.data(), B, T, C, NH);
    const auto got_out = download(dev, d_out);
    const auto got_lse = download(dev, d_lse);
    ft::expect_close(ft::to_double(got_out), ft::to_double(out), 4 * u, 2 * u + 1e-5,
                     "cuDNN out " + what);
    ft::expect_close(ft::to_double(got_lse), ft::to_double(lse), 1e-3, 1e-4, "cuDNN lse " + what);
    fw::cuda::cudnn_attention_backward(dev, d_dqkv.data(), d_dy.data(), d_qkv.data(), d_out.data(),
                                       d_lse.data(), B, T, C, NH);
    const auto got_dqkv = download(dev, d_dqkv);
    const double g_scale = std::max(1.0, ft::max_abs(ft::to_double(dqkv)));
    ft::expect_close(ft::to_double(got_dqkv), ft::to_double(dqkv), 8 * u * g_scale, 2 * u + 1e-5,
                     "cuDNN dqkv " + what);

    // the layers' entry points with the flag: the same graph, the same bits
    dev.set_cudnn_attention(true);
    auto e_out = upload(dev, acct, std::vector<E>(nout)), e_dqkv = upload(dev, acct, dqkv);
    auto e_lse = upload(dev, acct, std::vector<float>(nrow));
    auto e_delta = upload(dev, acct, std::vector<float>(nrow));
    fw::cuda::flash_attention_forward(dev, e_out.data(), e_lse.data(), d_qkv.data(), B, T, C, NH);
    fw::cuda::flash_attention_backward(dev, e_dqkv.data(), e_delta.data(), d_dy.data(),
                                       d_qkv.data(), e_out.data(), e_lse.data(), B, T, C, NH);
    dev.set_cudnn_attention(false);
    EXPECT_EQ(ft::to_double(download(dev, e_out)), ft::to_double(got_out)) << what;
    EXPECT_EQ(ft::to_double(download(dev, e_dqkv)), ft::to_double(got_dqkv)) << what;
  }
  EXPECT_EQ(ran, 4);
}

// What cuDNN does not take is declined before any graph runs, so the layers fall back: fp32,
// a head size that is not a multiple of 8, a pointer off a 16-byte boundary.
TEST(CudnnAttention, DeclinesWhatItDoesNotRun) {
  if (fw::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  fw::MemoryAccountant acct;
  fw::Context<fw::Cuda> dev(acct, 0);
  fw::Tensor<fw::bf16, fw::Cuda> buf({4096}, fw::MemTag::workspace, acct);
  EXPECT_FALSE(fw::cuda::cudnn_attention_supports<float>(dev, 1, 8, 64, 1));
  EXPECT_FALSE(fw::cuda::cudnn_attention_supports<fw::bf16>(dev, 1, 8, 36, 3));  // head size 12
  EXPECT_FALSE(fw::cuda::cudnn_attention_supports<fw::bf16>(dev, 1, 8, 64, 1, buf.data() + 1));
  EXPECT_TRUE(fw::cuda::cudnn_attention_supports<fw::bf16>(dev, 1, 8, 64, 1, buf.data()));
}
