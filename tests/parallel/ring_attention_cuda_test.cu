// Ring attention on CUDA (parallel/cp/ring_attention.cuh) against the unsplit attention: the host
// flash kernels on the whole sequence, as tests/parallel/ring_attention_test.cpp holds the host
// ring to it. c = 1, 2, 4 ranks of a LocalWorld sharing one GPU (one stream each, every
// communicator on its rank's stream); fp32 and bf16. Skips without a GPU; scripts/device-check.sh
// runs it on a GPU (whose train-cuda-vs-host step also trains cp meshes against the host).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "fourway/backend/cuda/backend.cuh"
#include "fourway/comm/launch.hpp"
#include "fourway/comm/local_world.hpp"
#include "fourway/parallel/cp/ring_attention.cuh"
#include "fourway/parallel/cp/ring_attention.hpp"
#include "ring_reference.hpp"

namespace fw = fourway;
namespace cp = fourway::cp;
using fw::Cuda;

namespace {

/// The worst difference over the largest value of `want` (at least 1).
template <class A, class B>
double relative_error(const A& got, const B& want) {
  const auto [worst, scale] = ring_reference::worst_and_scale(got, want);
  return worst / std::max(scale, 1.0);
}

template <class E>
void expect_device_ring_is_the_unsplit_attention(int c, double tol) {
  if (fw::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr std::int64_t B = 2, T = 32, C = 24, NH = 3;
  const ring_reference::Unsplit<E> whole(B, T, C, NH, static_cast<std::uint32_t>(c));
  std::vector<E> ring_out(whole.out.size()), ring_dqkv(whole.dqkv.size());
  std::vector<float> ring_lse(whole.lse.size());
  std::mutex mu;
  fw::launch<fw::LocalWorld>(c, [&](fw::World<fw::LocalWorld>& w) {
    fw::Context<Cuda> ctx(w.memory(), 0);
    fw::LocalComm group = w.comm().split(0, w.rank(), "cp");
    group.set_stream(ctx.stream());
    const cp::BalancedSplit s = cp::balanced_split(T, c, w.rank());
    const std::int64_t L = s.local();
    std::vector<E> x(static_cast<std::size_t>(B * L * 3 * C)),
        dy(static_cast<std::size_t>(B * L * C));
    cp::take_local_rows(x.data(), whole.qkv.data(), B, 3 * C, s);
    cp::take_local_rows(dy.data(), whole.dout.data(), B, C, s);
    fw::Tensor<E, Cuda> dx_in(fw::Shape{B, L, 3 * C}, fw::MemTag::activations, ctx.memory());
    fw::Tensor<E, Cuda> ddy(fw::Shape{B, L, C}, fw::MemTag::activations, ctx.memory());
    fw::Tensor<E, Cuda> dout_d(fw::Shape{B, L, C}, fw::MemTag::activations, ctx.memory());
    fw::Tensor<E, Cuda> dgrad(fw::Shape{B, L, 3 * C}, fw::MemTag::activations, ctx.memory());
    fw::Tensor<float, Cuda> dl(fw::Shape{B, NH, L}, fw::MemTag::activations, ctx.memory());
    fw::cuda::from_host(ctx, dx_in.data(), x.data(), dx_in.numel());
    fw::cuda::from_host(ctx, ddy.data(), dy.data(), ddy.numel());
    cp::ring_attention_forward(ctx, group, s, dout_d.data(), dl.data(), dx_in.data(), B, C, NH);
    cp::ring_attention_backward(ctx, group, s, dgrad.data(), ddy.data(), dx_in.data(),
                                dout_d.data(), dl.data(), B, C, NH);
    std::vector<E> o(static_cast<std::size_t>(dout_d.numel())), g(x.size());
    std::vector<float> l(static_cast<std::size_t>(dl.numel()));
    fw::cuda::to_host(ctx, o.data(), dout_d.data(), dout_d.numel());
    fw::cuda::to_host(ctx, g.data(), dgrad.data(), dgrad.numel());
    fw::cuda::to_host(ctx, l.data(), dl.data(), dl.numel());
    ctx.synchronize();
    std::lock_guard lock(mu);
    cp::put_local_rows(ring_out.data(), o.data(), B, C, s);
    cp::put_local_rows(ring_dqkv.data(), g.data(), B, 3 * C, s);
    for (std::int64_t j = 0; j < B * NH; ++j)
      for (std::int64_t i = 0; i < L; ++i)
        ring_lse[static_cast<std::size_t>(j * T + s.position(i))] =
            l[static_cast<std::size_t>(j * L + i)];
  });
  EXPECT_LE(relative_error(ring_out, whole.out), tol) << "out, c=" << c;
  EXPECT_LE(relative_error(ring_lse, whole.lse), tol) << "lse, c=" << c;
  EXPECT_LE(relative_error(ring_dqkv, whole.dqkv), tol) << "dqkv, c=" << c;
}

// fp32 inside on both; cuBLAS sums in another order than the host GEMM and expf is not the host's
// polynomial: 1e-4 of the scale
TEST(RingAttentionCuda, Fp32MatchesTheUnsplitAttention) {
  for (int c : {1, 2, 4}) expect_device_ring_is_the_unsplit_attention<float>(c, 1e-4);
}

// bf16 in and out, fp32 inside: within a few roundings of bf16 (2^-8 each)
TEST(RingAttentionCuda, Bf16MatchesTheUnsplitAttention) {
  for (int c : {1, 2, 4}) expect_device_ring_is_the_unsplit_attention<fw::bf16>(c, 2e-2);
}

}  // namespace
