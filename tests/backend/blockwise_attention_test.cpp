// The blockwise attention's algorithm (backend/blockwise_attention.hpp — what the attention
// layers run on a GPU) in its host form (backend/host/blockwise_attention.hpp), against the host
// flash twin, which flash_attention_test.cpp pins to the double-precision definition. The same
// shapes, plans and tolerances as the CUDA test (CudaKernels.FlashAttentionMatchesItsHostTwin),
// so on the host CI proves the block loop, the GEMMs' shapes and strides, the plan and the
// tolerance the 16-bit roundings of P and dS need; a GPU adds cuBLAS's order and the kernels.
#include "fourway/backend/host/blockwise_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fourway/backend/host/flash_attention.hpp"
#include "kernel_test_util.hpp"

namespace fw = fourway;
namespace ft = fourway_test;

namespace {

// (B, T, C, NH): one token; partial blocks; a head size of 1; several sequences; a head size of
// 128; T = 300 (two default blocks of 256)
constexpr std::int64_t shapes[][4] = {{1, 1, 4, 1},    {2, 7, 12, 3},   {1, 65, 3, 3},
                                      {3, 100, 64, 2}, {1, 70, 256, 2}, {2, 300, 48, 3}};

struct Plan {
  const char* name;
  std::int64_t chunk;
  bool one_sequence;  // a budget of one sequence's block: groups of one sequence
};
constexpr Plan plans[] = {{"default", fw::attention_query_chunk, false},
                          {"16-row blocks", 16, false},
                          {"one sequence per group", 16, true}};

std::int64_t budget_of(const Plan& p, std::int64_t T, std::int64_t NH) {
  return p.one_sequence ? NH * T * std::min<std::int64_t>(p.chunk, T) : fw::attention_score_budget;
}

template <class E>
double tol_rel() {
  return 2 * ft::unit_roundoff<E>() + 1e-5;
}

std::size_t workspace_peak(const fw::MemoryAccountant& acct) {
  return acct.snapshot().peak[static_cast<std::size_t>(fw::MemTag::workspace)];
}
std::size_t workspace_now(const fw::MemoryAccountant& acct) {
  return acct.snapshot().current[static_cast<std::size_t>(fw::MemTag::workspace)];
}

}  // namespace

template <class T>
class HostBlockwiseAttention : public ::testing::Test {};
using Dtypes = ::testing::Types<float, fw::bf16, fw::fp16>;
TYPED_TEST_SUITE(HostBlockwiseAttention, Dtypes);

// Against the flash twin, which keeps P and dS in fp32: the blockwise form rounds them to a
// 16-bit E before their products, each product term moving by at most u relative,
// independently: an output by ~u · 0.6 · sqrt(Σ P²) · |v| ≤ 0.5 u, a gradient by ~u at these
// inputs — bounded by 4u and 8u (scaled); fp32 rounds nothing (summation order and exp only).
TYPED_TEST(HostBlockwiseAttention, MatchesTheFlashTwinUnderEveryPlan) {
  using E = TypeParam;
  const bool fp32 = std::is_same_v<E, float>;
  const double u = ft::unit_roundoff<E>();
  std::uint32_t seed = 900;
  for (const Plan& plan : plans) {
    for (const auto& [B, T, C, NH] : shapes) {
      const std::string tag = std::string(plan.name) + " " +
                              ::testing::PrintToString(std::vector<std::int64_t>{B, T, C, NH});
      const std::int64_t budget = budget_of(plan, T, NH);
      const auto nqkv = static_cast<std::size_t>(B * T * 3 * C),
                 nout = static_cast<std::size_t>(B * T * C),
                 nrow = static_cast<std::size_t>(B * NH * T);
      const auto qkv = ft::random_typed<E>(nqkv, ++seed, -1.5f, 1.5f);
      const auto dy = ft::random_typed<E>(nout, ++seed);
      fw::MemoryAccountant acct;
      fw::Context<fw::Host> ctx(acct);
      std::vector<E> out(nout), dqkv(nqkv);
      std::vector<float> lse(nrow), delta(nrow);
      fw::host::flash_attention_forward(ctx, out.data(), lse.data(), qkv.data(), B, T, C, NH);
      fw::host::flash_attention_backward(ctx, dqkv.data(), delta.data(), dy.data(), qkv.data(),
                                         out.data(), lse.data(), B, T, C, NH);

      std::vector<E> bout(nout), bdqkv(nqkv);
      std::vector<float> blse(nrow), bdelta(nrow);
      fw::host::blockwise_attention_forward(ctx, bout.data(), blse.data(), qkv.data(), B, T, C, NH,
                                            plan.chunk, budget);
      ft::expect_close(ft::to_double(bout), ft::to_double(out), fp32 ? 1e-5 : 4 * u, tol_rel<E>(),
                       "out " + tag);
      ft::expect_close(ft::to_double(blse), ft::to_double(lse), 1e-5, 1e-6, "lse " + tag);
      // the backward reads its own out and lse, as a training step does
      fw::host::blockwise_attention_backward(ctx, bdqkv.data(), bdelta.data(), dy.data(),
                                             qkv.data(), bout.data(), blse.data(), B, T, C, NH,
                                             plan.chunk, budget);
      const double g_scale = std::max(1.0, ft::max_abs(ft::to_double(dqkv)));
      ft::expect_close(ft::to_double(bdqkv), ft::to_double(dqkv), (fp32 ? 2e-5 : 8 * u) * g_scale,
                       tol_rel<E>(), "dqkv " + tag);
      EXPECT_EQ(workspace_now(acct), 0u) << tag;  // every transient buffer given back
    }
  }
}

// The transient workspace is what the header's comment says, at its largest moment: forward the
// head-major q|k|v and output, the fp32 scores of one block and, in 16 bits, P; backward the
// head-major q|k|v and dO, the fp32 gradient, the scores and dP and, in 16 bits, P and dS.
TYPED_TEST(HostBlockwiseAttention, WorkspaceIsTheDocumentedSum) {
  using E = TypeParam;
  const std::int64_t B = 3, T = 100, C = 64, NH = 2, chunk = 16;
  const std::int64_t budget = NH * T * chunk * 2;  // two sequences of 16-row blocks a group
  const fw::BlockwisePlan plan = fw::blockwise_plan(B, T, NH, chunk, budget);
  ASSERT_EQ(plan.sequences, 2);
  ASSERT_EQ(plan.rows, 16);
  const std::size_t e = sizeof(E), f = sizeof(float);
  const auto group = static_cast<std::size_t>(plan.sequences * T * C);
  const auto scores = static_cast<std::size_t>(plan.scores(T, NH));
  const std::size_t rounded = std::is_same_v<E, float> ? 0 : 1;
  const auto qkv = ft::random_typed<E>(static_cast<std::size_t>(B * T * 3 * C), 3, -1.5f, 1.5f);
  const auto dy = ft::random_typed<E>(static_cast<std::size_t>(B * T * C), 4);
  std::vector<E> out(dy.size()), dqkv(qkv.size());
  std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), delta(lse.size());
  {
    fw::MemoryAccountant acct;
    fw::Context<fw::Host> ctx(acct);
    fw::host::blockwise_attention_forward(ctx, out.data(), lse.data(), qkv.data(), B, T, C, NH,
                                          chunk, budget);
    EXPECT_EQ(workspace_peak(acct), 4 * group * e + scores * f + rounded * scores * e);
  }
  {
    fw::MemoryAccountant acct;
    fw::Context<fw::Host> ctx(acct);
    fw::host::blockwise_attention_backward(ctx, dqkv.data(), delta.data(), dy.data(), qkv.data(),
                                           out.data(), lse.data(), B, T, C, NH, chunk, budget);
    EXPECT_EQ(workspace_peak(acct),
              4 * group * e + 3 * group * f + 2 * scores * f + rounded * 2 * scores * e);
  }
}

// Every sum has one order: the same inputs give the same bits.
TEST(HostBlockwiseAttention, SameResultRunAfterRun) {
  const std::int64_t B = 2, T = 70, C = 24, NH = 3;
  const auto qkv = ft::random_typed<fw::bf16>(static_cast<std::size_t>(B * T * 3 * C), 8);
  const auto dy = ft::random_typed<fw::bf16>(static_cast<std::size_t>(B * T * C), 9);
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  auto run = [&] {
    std::vector<fw::bf16> out(dy.size()), dqkv(qkv.size());
    std::vector<float> lse(static_cast<std::size_t>(B * NH * T)), delta(lse.size());
    fw::host::blockwise_attention_forward(ctx, out.data(), lse.data(), qkv.data(), B, T, C, NH, 16);
    fw::host::blockwise_attention_backward(ctx, dqkv.data(), delta.data(), dy.data(), qkv.data(),
                                           out.data(), lse.data(), B, T, C, NH, 16);
    std::vector<double> all = ft::to_double(out);
    for (double v : ft::to_double(dqkv)) all.push_back(v);
    return all;
  };
  const auto a = run();
  const auto b = run();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

// Bad shapes are typed errors naming the numbers.
TEST(HostBlockwiseAttention, RefusesHeadsThatDoNotDivideTheWidth) {
  fw::MemoryAccountant acct;
  fw::Context<fw::Host> ctx(acct);
  std::vector<float> qkv(3 * 10), out(10), lse(3);
  EXPECT_THROW(
      fw::host::blockwise_attention_forward(ctx, out.data(), lse.data(), qkv.data(), 1, 1, 10, 3),
      fw::ShapeError);
}
