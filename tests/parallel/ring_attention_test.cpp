// Context parallelism's ring attention (parallel/cp/ring_attention.hpp) against the unsplit
// attention: the host flash kernels on the whole sequence (themselves tested against the
// attention's definition in double, tests/backend/flash_attention_test.cpp). Each rank of a
// LocalWorld held to NCCL's contract (the strict world) takes its balanced rows of the same
// sequences; its output, log-sum-exp and gradients must be the whole attention's at those rows.
#include "fourway/parallel/cp/ring_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "fourway/comm/launch.hpp"
#include "fourway/comm/local_world.hpp"
#include "ring_reference.hpp"

namespace fw = fourway;
namespace cp = fourway::cp;

// Every position of the sequence belongs to exactly one rank, rank r holds chunks r and
// 2c − 1 − r, and the causal mask leaves every rank the same work: T/c · (T + 1)/2 pairs.
TEST(RingAttention, BalancedSplitCoversTheSequenceAndBalancesTheWork) {
  for (int c : {1, 2, 3, 4, 8}) {
    const std::int64_t T = 2 * c * 5;
    std::vector<int> owner(static_cast<std::size_t>(T), -1);
    for (int r = 0; r < c; ++r) {
      const cp::BalancedSplit s = cp::balanced_split(T, c, r);
      ASSERT_EQ(s.local(), T / c);
      for (std::int64_t i = 0; i < s.local(); ++i) {
        const std::int64_t pos = s.position(i);
        EXPECT_EQ(owner[static_cast<std::size_t>(pos)], -1) << "position " << pos << " twice";
        owner[static_cast<std::size_t>(pos)] = r;
        const std::int64_t chunk = pos / s.chunk();
        EXPECT_TRUE(chunk == r || chunk == 2 * c - 1 - r) << c << " " << r << " " << pos;
      }
      EXPECT_EQ(s.visible_pairs(), T / c * (T + 1) / 2) << c << " " << r;
    }
    for (int o : owner) EXPECT_GE(o, 0);
  }
  try {
    (void)cp::balanced_split(10, 3, 0);
    ADD_FAILURE() << "a sequence of 10 tokens split 6 ways";
  } catch (const fw::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("a sequence of 10 tokens does not divide by 6"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)cp::balanced_split(12, 3, 3), fw::ConfigError);
}

namespace {

struct RunShape {
  std::int64_t B, T, C, NH;
};

/// The ring on `c` strict LocalWorld ranks against the flash kernels on the whole sequences:
/// every rank's rows of out, lse and dqkv within `tol` (relative to the largest value of each).
template <class E>
void expect_ring_is_the_unsplit_attention(int c, RunShape sh, double tol) {
  const auto [B, T, C, NH] = sh;
  const std::string tag = "c=" + std::to_string(c) + " B=" + std::to_string(B) +
                          " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                          " NH=" + std::to_string(NH);
  const ring_reference::Unsplit<E> whole(B, T, C, NH, static_cast<std::uint32_t>(c));
  // the ring: each rank's result put back at its positions
  std::vector<E> ring_out(whole.out.size()), ring_dqkv(whole.dqkv.size());
  std::vector<float> ring_lse(whole.lse.size());
  std::mutex mu;
  fw::CommOptions strict;
  strict.strict = true;  // held to NCCL's contract (docs/comm.md, "The strict world")
  strict.deadline = std::chrono::seconds(60);
  fw::launch<fw::LocalWorld>(
      c,
      [&](fw::World<fw::LocalWorld>& w) {
        const cp::BalancedSplit s = cp::balanced_split(T, c, w.rank());
        const std::int64_t L = s.local();
        fw::Tensor<E, fw::Host> x(fw::Shape{B, L, 3 * C}, fw::MemTag::activations,
                                  w.ctx().memory());
        fw::Tensor<E, fw::Host> dy(fw::Shape{B, L, C}, fw::MemTag::activations, w.ctx().memory());
        cp::take_local_rows(x.data(), whole.qkv.data(), B, 3 * C, s);
        cp::take_local_rows(dy.data(), whole.dout.data(), B, C, s);
        std::vector<E> o(static_cast<std::size_t>(B * L * C)),
            dx(static_cast<std::size_t>(x.numel()));
        std::vector<float> l(static_cast<std::size_t>(B * NH * L));
        cp::ring_attention_forward(w.ctx(), w.comm(), s, o.data(), l.data(), x.data(), B, C, NH);
        cp::ring_attention_backward(w.ctx(), w.comm(), s, dx.data(), dy.data(), x.data(), o.data(),
                                    l.data(), B, C, NH);
        std::lock_guard lock(mu);
        cp::put_local_rows(ring_out.data(), o.data(), B, C, s);
        cp::put_local_rows(ring_dqkv.data(), dx.data(), B, 3 * C, s);
        for (std::int64_t b = 0; b < B; ++b) {
          for (std::int64_t h = 0; h < NH; ++h) {
            for (std::int64_t i = 0; i < L; ++i) {
              ring_lse[static_cast<std::size_t>((b * NH + h) * T + s.position(i))] =
                  l[static_cast<std::size_t>((b * NH + h) * L + i)];
            }
          }
        }
      },
      strict);
  auto expect_close = [&](const auto& got, const auto& want, const char* what) {
    const auto [worst, scale] = ring_reference::worst_and_scale(got, want);
    EXPECT_LE(worst, tol * std::max(scale, 1.0))
        << what << " " << tag << ": largest difference " << worst << " of a scale " << scale;
  };
  expect_close(ring_out, whole.out, "out");
  expect_close(ring_lse, whole.lse, "lse");
  expect_close(ring_dqkv, whole.dqkv, "dqkv");
}

}  // namespace

// fp32: the same fp32 arithmetic in another order (the ring merges key blocks by rank, the flash
// kernel by 64-key tiles), so ~1e-6 of the scale. One rank is the flash attention; odd head
// counts, a head size of 1 and sequences of a single token per chunk are included.
TEST(RingAttention, ForwardAndBackwardAreTheUnsplitAttention) {
  for (int c : {1, 2, 3, 4}) {
    expect_ring_is_the_unsplit_attention<float>(c, {2, 8 * c, 16, 4}, 2e-6);
    expect_ring_is_the_unsplit_attention<float>(c, {1, 2 * c, 3, 3}, 2e-6);
  }
  expect_ring_is_the_unsplit_attention<float>(2, {1, 96, 32, 2}, 2e-6);
}

// bf16: inputs and outputs in bf16, the work in fp32 on both sides; the outputs may round to
// neighbouring bf16 values: one unit in the last place of the scale (2^-8 relative).
TEST(RingAttention, Bf16AgreesToOneRounding) {
  expect_ring_is_the_unsplit_attention<fw::bf16>(2, {2, 16, 16, 2}, 1.0 / 256);
  expect_ring_is_the_unsplit_attention<fw::bf16>(4, {1, 32, 16, 4}, 1.0 / 256);
}
