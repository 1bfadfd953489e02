//! Ring attention's algorithm, written once for every backend: the host form
//! (`parallel/cp/ring_attention.hpp`, what CI tests against the unsplit attention) and the CUDA
//! form (`parallel/cp/ring_attention.cuh`) run this code with their own kernels, as the blockwise
//! attention does (backend/blockwise_attention.hpp).
//!
//! Layout: q, k, v and dO are copied head-major, (NH, T/c, hs) per sequence, in fp32, so one
//! strided-batched GEMM reaches every (sequence, head) of a group; the key/value block that
//! travels is head-major too, (2, B, NH, T/c, hs) of E — the same B · T/c · 2C elements the
//! token-major block held — and its gradients (2, B, NH, T/c, hs) fp32. Rows of the statistics are
//! (sequence, head, local row), the layout of lse (B, NH, T/c).
//!
//!   forward, step s (the block of rank j = r − s):  S = Q K_jᵀ/√hs, masked by position; online
//!       softmax merge of S into each row's running max m, sum ℓ and accumulator (acc ·= corr,
//!       acc += P V_j); after the last step out = acc/ℓ and lse = m + log ℓ.
//!   backward, step s:  P = exp(S − L) masked, dV_j += Pᵀ dO, dP = dO V_jᵀ,
//!       dS = P ∘ (dP − D), dK_j += dSᵀ Q/√hs, dQ += dS K_j/√hs (D = rowsum(dO ∘ O)).
//!
//! Each step's pass is posted before its compute and waited for after it (RingProgram, the
//! exchange of parallel/cp/ring_schedule.hpp); on a GPU the communicator runs on the compute's
//! stream, so the order holds there as well.
//!
//! A backend supplies, as static members of a policy `K`:
//!   using Backend;
//!   scratch(ctx, n)                          fp32 scratch of n elements for the call (`.data()`)
//!   gemm_strided_batched(ctx, …)             fp32 operands, the backend's GEMM
//!   permute_heads(ctx, dst, src, nb, T, parts, C, hs, to_heads) (backend/blockwise_attention.hpp)
//!   convert(ctx, dst, src, n)                dst[i] = src[i] in dst's type
//!   fill(ctx, float* p, n, value)
//!   row_delta(ctx, delta, dout, out, B, T, C, NH)
//!   merge(ctx, s, m, l, corr, rows, T, queries, keys)
//!       row = j · T + i (i the local query row): keys at positions after the query's masked;
//!       s becomes the block's exp(S − m_new) (zero where masked), corr the factor the row's
//!       accumulator takes (1 where the block shows the row nothing), ℓ = ℓ · corr + Σ, m = m_new
//!   scale_rows(ctx, acc, corr, rows, hs)     acc[row, :] *= corr[row]
//!   finish(ctx, acc, lse, m, l, rows, hs)    acc[row, :] /= ℓ, lse = m + log ℓ
//!   probabilities(ctx, s, lse, rows, T, queries, keys)   s = exp(s − L), zero where masked
//!   score_grads(ctx, p, dp, delta, rows, T)  dp = p ∘ (dp − D[row])
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "fourway/backend/blockwise_plan.hpp"
#include "fourway/backend/gemm_types.hpp"
#include "fourway/backend/host/attention.hpp"
#include "fourway/comm/communicator.hpp"
#include "fourway/comm/group.hpp"
#include "fourway/core/dtype.hpp"
#include "fourway/core/error.hpp"
#include "fourway/core/tensor.hpp"
#include "fourway/parallel/cp/balanced_split.hpp"
#include "fourway/parallel/cp/ring_schedule.hpp"
#include "fourway/schedule/exchange.hpp"

namespace fourway::cp {

namespace detail {

/// A pass around the ring in flight: a send on its way to rank r + 1, rank r − 1's block
/// arriving, posted as one group on the ring's communicator; `wait()` completes both. Neither
/// buffer may be written (nor the recv's read) until then, so a rank computes on the block it
/// sends while it travels.
struct RingPass {
  Work out;
  Work in;
  void wait() {
    in.wait();
    out.wait();
  }
};

/// This rank's row of the ring's exchange (parallel/cp/ring_schedule.hpp), verified for the whole
/// group before the first message and read in order: every pass takes its peers, tag and size
/// from it, every compute step is where the program puts it.
///
/// Attention runs the ring in every layer of every micro-batch with the same few shapes, so a
/// program is verified once per (ranks, rank, direction, sizes) on a thread (each LocalWorld rank
/// is one) and its row kept; later calls read the kept row.
class RingProgram {
 public:
  RingProgram(int ranks, int rank, RingDirection dir, std::int64_t block, std::int64_t gradient)
      : row_(&verified_row({ranks, rank, dir, block, gradient})) {}

  /// Posts the program's next group, a send of `send` and a recv into `recv` of `n` elements.
  template <class T, communicator Comm>
  RingPass post(Comm& comm, const T* send, T* recv, std::int64_t n) {
    const schedule::Transfer out = next();
    const schedule::Transfer in = next();
    follows(out.move == schedule::Move::send && in.move == schedule::Move::recv &&
                out.elements == n && in.elements == n,
            "a pass of ", n, " elements");
    group_start(comm);
    Work o = comm.send_async(send, n, out.peer, out.tag);
    Work i = comm.recv_async(recv, n, in.peer, in.tag);
    group_end(comm);
    return RingPass{std::move(o), std::move(i)};
  }
  /// The program's compute `step` comes next.
  void compute(int step) { follows(next() == schedule::compute_step(step), "compute ", step); }
  /// Every entry ran.
  void finish() const { follows(at_ == row_->size(), "the end of the program"); }

 private:
  schedule::Transfer next() {
    follows(at_ < row_->size(), "an entry past the end of the program");
    return (*row_)[at_++];
  }
  template <class... Args>
  void follows(bool ok, const Args&... what) const {
    check<Error>(ok, "fourway: ring attention ran ", what...,
                 " where its verified exchange has entry ", at_, " of ", row_->size(),
                 " (an internal error: the ring and parallel/cp/ring_schedule.hpp disagree)");
  }

  struct Key {
    int ranks, rank;
    RingDirection dir;
    std::int64_t block, gradient;
    bool operator==(const Key&) const = default;
  };
  struct Verified {
    Key key;
    std::vector<schedule::Transfer> row;
  };
  /// The row of `k`'s program, verified on this thread's first call with `k`.
  static const std::vector<schedule::Transfer>& verified_row(const Key& k) {
    // a handful (one per shape and direction); a deque keeps earlier rows where they are
    thread_local std::deque<Verified> kept;
    for (const Verified& v : kept)
      if (v.key == k) return v.row;
    schedule::Exchange x = ring_exchange(k.ranks, k.dir, k.block, k.gradient);
    schedule::verify(x, schedule::Blocking::rendezvous);
    kept.push_back({k, std::move(x.moves[static_cast<std::size_t>(k.rank)])});
    return kept.back().row;
  }

  const std::vector<schedule::Transfer>* row_;
  std::size_t at_ = 0;
};

/// One call's sizes: T/c rows, the head size, and sequences per group so that a group's fp32
/// scores (sequences · NH · (T/c)²) stay within `attention_score_budget`.
struct RingSizes {
  std::int64_t T, hs, n, head, btc, group;
  float scale;
  int ranks;

  template <communicator Comm>
  RingSizes(const Comm& comm, const BalancedSplit& split, std::int64_t B, std::int64_t C,
            std::int64_t NH)
      : T(split.local()),
        hs(host::detail::head_size(C, NH)),
        n(B * NH),
        head(T * hs),
        btc(B * T * C),
        group(
            std::clamp<std::int64_t>(attention_score_budget / std::max<std::int64_t>(1, NH * T * T),
                                     1, std::max<std::int64_t>(B, 1))),
        scale(1.0f / std::sqrt(static_cast<float>(hs))),
        ranks(comm.size()) {
    check<ConfigError>(split.ranks == comm.size() && split.rank == comm.rank(),
                       "fourway: ring attention's split is rank ", split.rank, " of ", split.ranks,
                       " but the context-parallel group's is rank ", comm.rank(), " of ",
                       comm.size());
  }
  /// The key/value block rank `split.rank` holds at `step`: rank r − step's.
  [[nodiscard]] static BalancedSplit keys_at(const BalancedSplit& split, int step) {
    return split.of((split.rank - step + split.ranks) % split.ranks);
  }
};

/// The blocks a call moves: this step's key/value block (`held`, E, head-major) and the buffer the
/// next one lands in (both comm_buffers), beside the rank's own q | k | v head-major in fp32
/// (`q`, and `kv`: the block of the current step in fp32).
template <class K, class E>
struct RingBlocks {
  using Bk = typename K::Backend;
  Tensor<E, Bk> held;
  Tensor<E, Bk> next;
  decltype(K::scratch(std::declval<const Context<Bk>&>(), 0)) x;
  const float* q;
  float* kv;
  std::int64_t elements;  // of a block: 2 · B · T/c · C

  RingBlocks(const Context<Bk>& ctx, const RingSizes& z, const E* qkv, std::int64_t B,
             std::int64_t C)
      : held(Shape{2 * z.btc}, MemTag::comm_buffers, ctx.memory()),
        next(Shape{2 * z.btc}, MemTag::comm_buffers, ctx.memory()),
        x(K::scratch(ctx, 3 * z.btc)),
        q(x.data()),
        kv(x.data() + z.btc),
        elements(2 * z.btc) {
    K::permute_heads(ctx, x.data(), qkv, B, z.T, 3, C, z.hs, true);
    K::convert(ctx, held.data(), static_cast<const float*>(kv), elements);
  }
  /// Step `step`: posts the pass of the held block (all but the last step), then makes it this
  /// step's fp32 block (step 0's is the rank's own, already there).
  template <communicator Comm>
  std::optional<RingPass> begin(const Context<Bk>& ctx, RingProgram& program, Comm& comm, int step,
                                int ranks) {
    std::optional<RingPass> pass;
    if (step + 1 < ranks) pass = program.post(comm, held.data(), next.data(), elements);
    program.compute(step);
    if (step > 0) K::convert(ctx, kv, static_cast<const E*>(held.data()), elements);
    return pass;
  }
  /// The next block has arrived: it is the held one now.
  void end(std::optional<RingPass>& pass) {
    if (!pass) return;
    pass->wait();
    std::swap(held, next);
  }
};

/// Calls f(ng, off, row0) for each group of sequences: ng (sequence, head) pairs, the group's
/// offset in the head-major layouts and its first statistics row.
template <class F>
void for_each_group(const RingSizes& z, std::int64_t B, std::int64_t NH, F&& f) {
  for (std::int64_t b0 = 0; b0 < B; b0 += z.group)
    f(std::min(z.group, B - b0) * NH, b0 * NH * z.head, b0 * NH * z.T);
}

}  // namespace detail

namespace ring {

/// out (B, T/c, C) and lse (B, NH, T/c) of this rank's queries against every key of the
/// sequence, causal, from qkv (B, T/c, 3C) of the rank's rows; `comm` is the context-parallel
/// group (split.ranks == comm.size(), split.rank == comm.rank()).
template <class K, floating_dtype E, communicator Comm>
void forward(const Context<typename K::Backend>& ctx, Comm& comm, const BalancedSplit& split,
             E* out, float* lse, const E* qkv, std::int64_t B, std::int64_t C, std::int64_t NH) {
  const detail::RingSizes z(comm, split, B, C, NH);
  const std::int64_t T = z.T, hs = z.hs, head = z.head;
  if (B * T == 0) return;
  detail::RingBlocks<K, E> blocks(ctx, z, qkv, B, C);
  detail::RingProgram program(z.ranks, split.rank, RingDirection::forward, blocks.elements, 0);
  auto stats = K::scratch(ctx, 3 * z.n * T);
  float* m = stats.data();
  float* l = m + z.n * T;
  float* corr = l + z.n * T;
  K::fill(ctx, m, z.n * T, -std::numeric_limits<float>::infinity());
  K::fill(ctx, l, z.n * T, 0.0f);
  auto acc = K::scratch(ctx, z.n * head);
  K::fill(ctx, acc.data(), z.n * head, 0.0f);
  auto s = K::scratch(ctx, z.group * NH * T * T);
  const Trans N = Trans::none, Tr = Trans::transpose;
  for (int step = 0; step < z.ranks; ++step) {
    const BalancedSplit keys = detail::RingSizes::keys_at(split, step);
    // the block travels on to rank r + 1 while this rank scores its queries against it
    auto pass = blocks.begin(ctx, program, comm, step, z.ranks);
    detail::for_each_group(z, B, NH, [&](std::int64_t ng, std::int64_t off, std::int64_t row0) {
      K::gemm_strided_batched(ctx, N, Tr, T, T, hs, z.scale, blocks.q + off, hs, head,
                              blocks.kv + off, hs, head, 0.0f, s.data(), T, T * T,
                              ng);  // S = scale · Q Kᵀ
      K::merge(ctx, s.data(), m + row0, l + row0, corr + row0, ng * T, T, split, keys);
      K::scale_rows(ctx, acc.data() + off, corr + row0, ng * T, hs);
      K::gemm_strided_batched(ctx, N, N, T, hs, T, 1.0f, static_cast<const float*>(s.data()), T,
                              T * T, blocks.kv + z.btc + off, hs, head, 1.0f, acc.data() + off, hs,
                              head, ng);  // acc += P V
    });
    blocks.end(pass);
  }
  program.finish();
  K::finish(ctx, acc.data(), lse, m, l, z.n * T, hs);
  K::permute_heads(ctx, out, static_cast<const float*>(acc.data()), B, T, 1, C, hs, false);
}

/// dqkv (B, T/c, 3C) (`=`) of this rank's rows from dout, qkv, out and lse of `forward` on the
/// same group and split.
template <class K, floating_dtype E, communicator Comm>
void backward(const Context<typename K::Backend>& ctx, Comm& comm, const BalancedSplit& split,
              E* dqkv, const E* dout, const E* qkv, const E* out, const float* lse, std::int64_t B,
              std::int64_t C, std::int64_t NH) {
  using Bk = typename K::Backend;
  const detail::RingSizes z(comm, split, B, C, NH);
  const std::int64_t T = z.T, hs = z.hs, head = z.head, btc = z.btc;
  if (B * T == 0) return;
  detail::RingBlocks<K, E> blocks(ctx, z, qkv, B, C);
  // the key/value gradients of the held block travel with it, in fp32
  Tensor<float, Bk> grad(Shape{2 * btc}, MemTag::comm_buffers, ctx.memory());
  Tensor<float, Bk> grad_next(Shape{2 * btc}, MemTag::comm_buffers, ctx.memory());
  detail::RingProgram program(z.ranks, split.rank, RingDirection::backward, blocks.elements,
                              2 * btc);
  auto delta = K::scratch(ctx, z.n * T);
  K::row_delta(ctx, delta.data(), dout, out, B, T, C, NH);
  auto dy = K::scratch(ctx, btc);
  K::permute_heads(ctx, dy.data(), dout, B, T, 1, C, hs, true);
  auto g = K::scratch(ctx, 3 * btc);  // dq | dk | dv head-major fp32, dk | dv at the end
  float* dq = g.data();
  K::fill(ctx, dq, btc, 0.0f);
  K::fill(ctx, grad.data(), 2 * btc, 0.0f);
  auto s = K::scratch(ctx, z.group * NH * T * T);
  auto dp = K::scratch(ctx, z.group * NH * T * T);
  const Trans N = Trans::none, Tr = Trans::transpose;
  for (int step = 0; step < z.ranks; ++step) {
    const BalancedSplit keys = detail::RingSizes::keys_at(split, step);
    // the block travels on while this rank computes with it; its gradients, which this step
    // adds to, follow after
    auto pass = blocks.begin(ctx, program, comm, step, z.ranks);
    detail::for_each_group(z, B, NH, [&](std::int64_t ng, std::int64_t off, std::int64_t row0) {
      const float* qg = blocks.q + off;
      const float* kg = blocks.kv + off;
      const float* vg = blocks.kv + btc + off;
      const float* dyg = dy.data() + off;
      float* gk = grad.data() + off;
      float* gv = grad.data() + btc + off;
      K::gemm_strided_batched(ctx, N, Tr, T, T, hs, z.scale, qg, hs, head, kg, hs, head, 0.0f,
                              s.data(), T, T * T, ng);  // S
      K::probabilities(ctx, s.data(), lse + row0, ng * T, T, split, keys);
      K::gemm_strided_batched(ctx, N, Tr, T, T, hs, 1.0f, dyg, hs, head, vg, hs, head, 0.0f,
                              dp.data(), T, T * T, ng);  // dP = dO Vᵀ
      const float* p = s.data();
      K::gemm_strided_batched(ctx, Tr, N, T, hs, T, 1.0f, p, T, T * T, dyg, hs, head, 1.0f, gv, hs,
                              head, ng);  // dV += Pᵀ dO
      K::score_grads(ctx, s.data(), dp.data(), delta.data() + row0, ng * T, T);
      const float* ds = dp.data();
      K::gemm_strided_batched(ctx, Tr, N, T, hs, T, z.scale, ds, T, T * T, qg, hs, head, 1.0f, gk,
                              hs, head, ng);  // dK += scale · dSᵀ Q
      K::gemm_strided_batched(ctx, N, N, T, hs, T, z.scale, ds, T, T * T, kg, hs, head, 1.0f,
                              dq + off, hs, head, ng);  // dQ += scale · dS K
    });
    blocks.end(pass);   // the block and its gradients move on together
    if (z.ranks > 1) {  // after the last step, this pass brings each rank its own block's gradients
      program.post(comm, grad.data(), grad_next.data(), 2 * btc).wait();
      std::swap(grad, grad_next);
    }
  }
  program.finish();
  K::convert(ctx, g.data() + btc, static_cast<const float*>(grad.data()), 2 * btc);
  K::permute_heads(ctx, dqkv, static_cast<const float*>(g.data()), B, T, 3, C, hs, false);
}

/// The kernels of backend `Bk` (specialized by parallel/cp/ring_attention.hpp for the host and
/// parallel/cp/ring_attention.cuh for CUDA).
template <class Bk>
struct Kernels;

}  // namespace ring

/// out (B, T/c, C) and lse (B, NH, T/c) of this rank's queries against every key of the
/// sequence (`ring::forward` with the backend's kernels).
template <class Bk, floating_dtype E, communicator Comm>
void ring_attention_forward(const Context<Bk>& ctx, Comm& comm, const BalancedSplit& split, E* out,
                            float* lse, const E* qkv, std::int64_t B, std::int64_t C,
                            std::int64_t NH) {
  ring::forward<ring::Kernels<Bk>>(ctx, comm, split, out, lse, qkv, B, C, NH);
}

/// dqkv (B, T/c, 3C) (`=`) of this rank's rows (`ring::backward` with the backend's kernels).
template <class Bk, floating_dtype E, communicator Comm>
void ring_attention_backward(const Context<Bk>& ctx, Comm& comm, const BalancedSplit& split,
                             E* dqkv, const E* dout, const E* qkv, const E* out, const float* lse,
                             std::int64_t B, std::int64_t C, std::int64_t NH) {
  ring::backward<ring::Kernels<Bk>>(ctx, comm, split, dqkv, dout, qkv, out, lse, B, C, NH);
}

}  // namespace fourway::cp
