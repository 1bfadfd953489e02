//! Context parallelism's attention: causal self-attention over sequences split across the `c`
//! ranks of a context-parallel group, each rank holding T/c tokens of every sequence, computed by
//! passing key/value blocks around a ring (Liu, Zaharia, Abbeel 2023, "Ring Attention with
//! Blockwise Transformers"; Megatron-Core's context parallelism). Every other layer of a block is
//! local to its tokens. The split is `BalancedSplit` (parallel/cp/balanced_split.hpp); the
//! algorithm is written once (parallel/cp/ring_algorithm.hpp) and this is its host form, with the
//! host kernels below; the CUDA form is parallel/cp/ring_attention.cuh.
//!
//! Forward, on every rank, c steps: the rank's queries against the key/value block it holds
//! (its own at step 0, rank r − s's at step s), keys after a query's position masked, merged
//! into the running max m, sum ℓ and output accumulator of each query row exactly as the flash
//! kernels merge key tiles (online softmax, host/flash_attention.hpp). Every rank passes the
//! block it holds to rank r + 1 and takes rank r − 1's, one send and one recv in one group
//! (comm/group.hpp; every peer, tag and size from the exchange of parallel/cp/ring_schedule.hpp,
//! verified for the whole group first), posted *before* the step's compute and waited for after it:
//! the block travels while the rank computes with it (both only read it; the next one lands in a
//! second buffer), so the ring's traffic hides behind attention as the planner assumes. The output
//! is acc/ℓ; the log-sum-exp L = m + log ℓ is kept, O(T/c) per head, as the flash kernels keep it.
//!
//! Backward, c steps again with the global L: for the block of rank j held at step s,
//! P = exp(S − L) (masked), dV_j += Pᵀ dO, dP = dO V_jᵀ, dS = P ∘ (dP − D) with D = rowsum(dO ∘ O),
//! dQ += scale·dS K_j, dK_j += scale·dSᵀ Q. The block is passed on while the step computes
//! (as forward); its dK_j and dV_j (fp32), which the step adds to, follow once it is done, so
//! they travel with it; after the c-th step one more pass brings each rank its own block's
//! gradients. A group of one rank is the flash attention without a message.
//!
//! Layout as the attention layers': `qkv (B, T/c, 3C)` (q, k, v side by side, head h owning
//! columns [h·hs, (h+1)·hs) of each third), `out (B, T/c, C)`, `lse (B, NH, T/c)` fp32; the rows
//! are the rank's local rows in the split's order. Scale 1/√hs.
//!
//! Precision: q, k, v and dO are read into fp32; scores, probabilities, statistics and every
//! accumulator are fp32, and the key/value gradients travel in fp32; `out` and `dqkv` are
//! rounded to E once. Messages are Tensors of the rank's accountant (MemTag::comm_buffers): the
//! block in flight, B · T/c · 2C of E (head-major), and backward its gradients, as many fp32 — so
//! the strict world accepts them as it accepts device buffers. On the host the fp32 copies, the
//! statistics and the scores of a group of sequences are scratch vectors outside the accountant,
//! as the flash kernels' tiles are; the CUDA form takes them as workspace.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fourway/backend/host/backend.hpp"
#include "fourway/backend/host/blockwise_attention.hpp"
#include "fourway/backend/host/math.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/parallel/cp/balanced_split.hpp"
#include "fourway/parallel/cp/ring_algorithm.hpp"

namespace fourway::cp {

namespace detail {

/// The host kernels of the ring (parallel/cp/ring_algorithm.hpp): the blockwise attention's
/// permutes, GEMM and row delta, and the ring's row passes, fp32, one row at a time.
struct HostRingKernels : host::detail::HostBlockKernels {
  struct Scratch {
    std::vector<float> v;
    float* data() { return v.data(); }
  };
  static Scratch scratch(const Context<Host>& /*ctx*/, std::int64_t n) {
    return Scratch{std::vector<float>(static_cast<std::size_t>(n))};
  }
  template <class To, class From>
  static void convert(const Context<Host>& /*ctx*/, To* dst, const From* src, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i)
      dst[i] = fourway::convert<To>(fourway::convert<float>(src[i]));
  }
  static void fill(const Context<Host>& /*ctx*/, float* p, std::int64_t n, float value) {
    std::fill(p, p + n, value);
  }
  static void merge(const Context<Host>& /*ctx*/, float* s, float* m, float* l, float* corr,
                    std::int64_t rows, std::int64_t T, const BalancedSplit& queries,
                    const BalancedSplit& keys) {
    constexpr float none = -std::numeric_limits<float>::infinity();
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t at = queries.position(row % T);
      float* sr = s + row * T;
      float mx = m[row];
      for (std::int64_t j = 0; j < T; ++j)
        if (keys.position(j) <= at) mx = std::max(mx, sr[j]);
      if (mx == none) {  // nothing visible in this block
        std::fill(sr, sr + T, 0.0f);
        corr[row] = 1.0f;
        continue;
      }
      const float c = m[row] == none ? 0.0f : host::detail::exp_poly(m[row] - mx);
      float sum = 0.0f;
      for (std::int64_t j = 0; j < T; ++j) {
        sr[j] = keys.position(j) <= at ? host::detail::exp_poly(sr[j] - mx) : 0.0f;
        sum += sr[j];
      }
      l[row] = l[row] * c + sum;
      m[row] = mx;
      corr[row] = c;
    }
  }
  static void scale_rows(const Context<Host>& /*ctx*/, float* acc, const float* corr,
                         std::int64_t rows, std::int64_t hs) {
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t d = 0; d < hs; ++d) acc[row * hs + d] *= corr[row];
  }
  static void finish(const Context<Host>& /*ctx*/, float* acc, float* lse, const float* m,
                     const float* l, std::int64_t rows, std::int64_t hs) {
    for (std::int64_t row = 0; row < rows; ++row) {
      const float inv = 1.0f / l[row];
      for (std::int64_t d = 0; d < hs; ++d) acc[row * hs + d] *= inv;
      lse[row] = m[row] + std::log(l[row]);
    }
  }
  static void probabilities(const Context<Host>& /*ctx*/, float* s, const float* lse,
                            std::int64_t rows, std::int64_t T, const BalancedSplit& queries,
                            const BalancedSplit& keys) {
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t at = queries.position(row % T);
      float* sr = s + row * T;
      for (std::int64_t j = 0; j < T; ++j)
        sr[j] = keys.position(j) <= at ? host::detail::exp_poly(sr[j] - lse[row]) : 0.0f;
    }
  }
  static void score_grads(const Context<Host>& /*ctx*/, const float* p, float* dp,
                          const float* delta, std::int64_t rows, std::int64_t T) {
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t j = 0; j < T; ++j)
        dp[row * T + j] = p[row * T + j] * (dp[row * T + j] - delta[row]);
  }
};

}  // namespace detail

/// The host's kernels for `ring_attention_forward` / `ring_attention_backward`
/// (parallel/cp/ring_algorithm.hpp) on a `Context<Host>`.
template <>
struct ring::Kernels<Host> : detail::HostRingKernels {};

}  // namespace fourway::cp
